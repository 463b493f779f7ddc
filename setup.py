"""Builds the C extensions; everything else is in pyproject.toml.

* ``appbridge/media/_ratecv.c``: sample-rate conversion (optional: without it the media path
  falls back to audioop.ratecv, same output, slower; appbridge/media/resample.py).
* The per-frame modules listed in ``appbridge/compiled.py``, compiled by mypyc (issue 7). Set
  ``APPBRIDGE_COMPILE=0`` to install them as plain Python; without a C compiler they are left
  interpreted too, with a warning.
"""

import os
import runpy
import shutil
import sys
import sysconfig

from setuptools import Extension, setup

extensions = [
    Extension(
        "appbridge.media._ratecv",
        ["appbridge/media/_ratecv.c"],
        extra_compile_args=["-O2"],
        optional=True,
    )
]


def _have_c_compiler() -> bool:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


if os.environ.get("APPBRIDGE_COMPILE", "1") == "0":
    print("appbridge: APPBRIDGE_COMPILE=0, the media path stays interpreted", file=sys.stderr)
elif not _have_c_compiler():
    print("appbridge: no C compiler found, the media path stays interpreted", file=sys.stderr)
else:
    from mypyc.build import mypycify

    listed = runpy.run_path("appbridge/compiled.py")
    extensions += mypycify(
        [m.replace(".", "/") + ".py" for m in listed["COMPILED_MODULES"]],
        group_name=listed["GROUP_NAME"],
    )

setup(ext_modules=extensions)
