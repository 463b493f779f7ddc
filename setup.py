"""Builds the one C extension (appbridge/media/_ratecv.c); everything else is in pyproject.toml.

The extension is optional: without a C compiler the package still installs, and the media path
falls back to audioop.ratecv (same output, slower; appbridge/media/codecs.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "appbridge.media._ratecv",
            ["appbridge/media/_ratecv.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
