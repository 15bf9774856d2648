"""Build stoker's one optional C extension; everything else is in pyproject.toml.

``stoker.vision._native`` decodes only a rectangle of a JPEG through libjpeg-turbo, resamples
as Pillow does and normalises (see its source). It is built where a C compiler is, and
skipped where none is (``optional=True``): stoker then decodes with simplejpeg or Pillow and
resamples with torch or Pillow, slower but with the same results (torch's resample: within
1/255). Its decode needs libjpeg-turbo, found one of three ways:

- ``STOKER_LIBJPEG_TURBO=PREFIX``: a position-independent static ``PREFIX/lib/libjpeg.a``
  with its headers in ``PREFIX/include`` is linked into the extension, which then needs no
  libjpeg where it is installed (``tools/build_wheel.sh`` builds one and sets this); the
  build fails rather than skip the extension;
- else the system's shared libjpeg where its headers are (Debian: libjpeg-dev);
- else (or with ``STOKER_NO_JPEG=1``) the extension is built without decode
  (``STOKER_NO_JPEG`` in the C source): resample and normalise run in C, decoding does not.
"""

import os
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildNative(build_ext):
    """build_ext that links libjpeg-turbo statically, from the system, or not at all."""

    def build_extension(self, ext: Extension) -> None:
        prefix = os.environ.get("STOKER_LIBJPEG_TURBO")
        if prefix:
            static = Path(prefix, "lib", "libjpeg.a")
            if not static.is_file():
                sys.exit(f"STOKER_LIBJPEG_TURBO={prefix}: no {static}; run tools/build_wheel.sh")
            ext.optional = False  # asked for the fast path: fail loudly, never skip it
            ext.include_dirs.append(str(Path(prefix, "include")))
            ext.extra_objects.append(str(static))
            ext.define_macros.append(("STOKER_JPEG_STATIC", "1"))
            # libjpeg's symbols stay inside the extension: another copy loaded into the
            # process (Pillow's, torchvision's) neither replaces nor is replaced by them.
            ext.extra_link_args.append("-Wl,--exclude-libs,ALL")
            # A wheel runs elsewhere: no run path into the building Python's folder (pyenv's
            # LDSHARED adds one).
            linker = self.compiler.linker_so
            self.compiler.linker_so = [a for a in linker if not a.startswith("-Wl,-rpath")]
        elif os.environ.get("STOKER_NO_JPEG") != "1" and self._has_jpeglib():
            ext.libraries.append("jpeg")
        else:
            print("stoker: building _native without libjpeg (no decode kernel)", file=sys.stderr)
            ext.define_macros.append(("STOKER_NO_JPEG", "1"))
        super().build_extension(ext)

    def _has_jpeglib(self) -> bool:
        """Whether this compiler finds jpeglib.h (libjpeg-turbo's headers)."""
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp, "probe.c")
            probe.write_text("#include <stdio.h>\n#include <jpeglib.h>\n")
            try:
                self.compiler.compile([str(probe)], output_dir=tmp)
            except Exception:  # CompileError, or no working compiler at all
                return False
        return True


setup(
    ext_modules=[
        Extension(
            "stoker.vision._native",
            ["src/stoker/vision/_native.c"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
