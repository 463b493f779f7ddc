"""Builds the C extensions; everything else is in pyproject.toml.

* ``appbridge/media/_ratecv.c``: sample-rate conversion (optional: without it the media path
  falls back to audioop.ratecv, same output, slower; appbridge/media/resample.py).
* The per-frame modules listed in ``appbridge/compiled.py``, compiled by mypyc (issue 7). Set
  ``APPBRIDGE_COMPILE=0`` to install them as plain Python; without a C compiler, or before the
  runtime dependencies are installed, they are left interpreted too, with a message.
"""

import os
import runpy
import shutil
import sys
import sysconfig

from setuptools import Extension, setup

# The list of compiled modules and its path helpers, read without importing the package.
listed = runpy.run_path("appbridge/compiled.py")

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


def _remove_earlier_builds(modules: list[str]) -> None:
    """An interpreted install must not leave an earlier compiled build in the tree (an editable
    install builds in place): Python would import it instead of the source."""
    for module in modules:
        built = listed["extension_path"](module)
        if built is not None:
            os.remove(built)


# Packages whose types the compiled modules are checked against (their classes are subclassed
# or their keywords used at class level): without them mypyc's type check fails.
TYPED_AGAINST = ("msgspec", "websockets", "uvicorn", "starlette")


def _dependencies_installed() -> bool:
    """mypyc type-checks against the packages of the environment being installed into (its
    site-packages, whatever pip's isolated build sees), and pip builds a project before it
    installs its dependencies into a fresh environment: then the first build cannot compile,
    and a second one (``make install`` runs it) can."""
    from mypy.modulefinder import get_search_dirs

    sys_path, site_packages = get_search_dirs(sys.executable)
    dirs = [*sys_path, *site_packages]
    return all(any(os.path.isdir(os.path.join(d, name)) for d in dirs) for name in TYPED_AGAINST)


def _interpreted_because() -> str | None:
    if os.environ.get("APPBRIDGE_COMPILE", "1") == "0":
        return "APPBRIDGE_COMPILE=0"
    if not _have_c_compiler():
        return "no C compiler found"
    if not _dependencies_installed():
        return "the dependencies are not installed yet (install once more to compile)"
    return None


why = _interpreted_because()
if why is not None:
    print(f"appbridge: {why}; the media path stays interpreted", file=sys.stderr)
    _remove_earlier_builds([*listed["COMPILED_MODULES"], listed["GROUP_NAME"] + "__mypyc"])
else:
    from mypyc.build import mypycify

    # mypyc type-checks before compiling: on its own settings, not pyproject's [tool.mypy]
    # (`make lint` holds the code to those), and without a cache, so that a build depends only
    # on the source and the installed dependencies, never on an earlier run.
    extensions += mypycify(
        [
            "--config-file=",
            "--python-version=3.11",
            "--ignore-missing-imports",
            "--no-incremental",
            *(m.replace(".", "/") + ".py" for m in listed["COMPILED_MODULES"]),
        ],
        group_name=listed["GROUP_NAME"],
    )

setup(ext_modules=extensions)
