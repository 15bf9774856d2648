"""Build stoker's one optional C extension; everything else is in pyproject.toml.

``stoker.vision._native`` decodes only a rectangle of a JPEG through libjpeg-turbo, resamples
as Pillow does and normalises (see its source). It is built where a C compiler and
libjpeg-turbo's headers are present (Debian: libjpeg-dev) and skipped where they are not
(``optional=True``): stoker then decodes with simplejpeg or Pillow and resamples with torch
or Pillow, slower but with the same results (torch's resample: within 1/255).
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
