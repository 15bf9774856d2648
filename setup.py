"""Build stoker's one optional C extension; everything else is in pyproject.toml.

``stoker.vision._native`` decodes only a rectangle of a JPEG through libjpeg-turbo. It is
built where a C compiler and libjpeg-turbo's headers are present (Debian: libjpeg-dev) and
skipped where they are not (``optional=True``): stoker then decodes with simplejpeg or
Pillow, slower but with the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stoker.vision._native",
            ["src/stoker/vision/_native.c"],
            libraries=["jpeg"],
            optional=True,
        )
    ]
)
