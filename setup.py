"""Builds the C extensions; everything else is in pyproject.toml.

* ``appbridge/media/_ratecv.c``: sample-rate conversion (optional: without it the media path
  falls back to audioop.ratecv, same output, slower; appbridge/media/resample.py).
* ``appbridge/media/_lowpass.c``: the anti-aliasing filter before downsampling (optional too:
  the fallback is numpy, same output, slower; appbridge/media/antialias.py).
* The per-frame modules listed in ``appbridge/compiled.py``, compiled by mypyc. Set
  ``APPBRIDGE_COMPILE=0`` to install them as plain Python; without a C compiler, or when the
  runtime dependencies are not installed, they are left interpreted too, with a message.

mypyc type-checks those modules against the dependencies installed in the environment, so
``make install`` installs them first (deploy/install-deps.py) and then builds once, with
``pip install --no-deps --no-build-isolation -e .``. The mypyc step runs when ``build_ext``
does, not for pip's metadata hooks, and writes one C file per module, which ``build_ext``
compiles on every core.

Build settings, read at build time (rebuild after changing one: ``touch setup.py``):
``APPBRIDGE_BUILD_JOBS`` (C compiles at once; default: the number of cores),
``APPBRIDGE_MYPYC_OPT`` (the C optimisation level of the mypyc output, 0-3; default 3) and
``APPBRIDGE_MYPYC_MULTI_FILE=0`` (one C file for the whole group instead of one per module).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The list of compiled modules and its path helpers, read without importing the package.
listed = runpy.run_path("appbridge/compiled.py")

RATECV = Extension(
    "appbridge.media._ratecv",
    ["appbridge/media/_ratecv.c"],
    extra_compile_args=["-O2"],
    optional=True,
)

LOWPASS = Extension(
    "appbridge.media._lowpass",
    ["appbridge/media/_lowpass.c"],
    extra_compile_args=["-O3"],  # the taps' inner loop is vectorised only from -O3
    optional=True,
)

# Packages whose types the compiled modules are checked against (their classes are subclassed
# or their keywords used at class level): without them mypyc's type check fails.
TYPED_AGAINST = ("msgspec", "websockets", "uvicorn", "starlette")

BUILD_DIR = "build"
"""Where mypyc writes its C files (``make clean`` removes it)."""


def _remove_earlier_builds(modules: list[str]) -> None:
    """An interpreted install must not leave an earlier compiled build in the tree (an editable
    install builds in place): Python would import it instead of the source."""
    for module in modules:
        built = listed["extension_path"](module)
        if built is not None:
            os.remove(built)


def _dependencies_installed() -> bool:
    """mypyc type-checks against the packages of the environment being installed into. A plain
    ``pip install`` into a fresh environment builds before it installs the dependencies, so
    that build cannot compile; ``make install`` installs them first."""
    from mypy.modulefinder import get_search_dirs

    sys_path, site_packages = get_search_dirs(sys.executable)
    dirs = [*sys_path, *site_packages]
    return all(any(os.path.isdir(os.path.join(d, name)) for d in dirs) for name in TYPED_AGAINST)


def _interpreted_because() -> str | None:
    if os.environ.get("APPBRIDGE_COMPILE", "1") == "0":
        return "APPBRIDGE_COMPILE=0"
    if not listed["have_c_compiler"]():
        return "no C compiler found"
    if not _dependencies_installed():
        return "the dependencies are not installed (make install installs them first)"
    return None


def _setting(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, default)
    if value not in allowed:
        raise SystemExit(f"appbridge: {name}={value!r}; expected one of {', '.join(allowed)}")
    return value


def _jobs() -> int:
    value = os.environ.get("APPBRIDGE_BUILD_JOBS") or str(os.cpu_count() or 1)
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"appbridge: APPBRIDGE_BUILD_JOBS={value!r}; expected a positive number")
    return int(value)


@cache
def media_path_extensions() -> list[Extension]:
    """mypyc's extensions for the listed modules, or none (with the reason on stderr)."""
    why = _interpreted_because()
    if why is not None:
        print(f"appbridge: {why}; the media path stays interpreted", file=sys.stderr)
        _remove_earlier_builds([*listed["COMPILED_MODULES"], listed["GROUP_NAME"] + "__mypyc"])
        return []
    from mypyc.build import mypycify

    # mypyc type-checks before compiling: on its own settings, not pyproject's [tool.mypy]
    # (`make lint` holds the code to those), and without a cache, so that a build depends only
    # on the source and the installed dependencies, never on an earlier run.
    extensions: list[Extension] = mypycify(
        [
            "--config-file=",
            "--python-version=3.11",
            "--ignore-missing-imports",
            "--no-incremental",
            *(m.replace(".", "/") + ".py" for m in listed["COMPILED_MODULES"]),
        ],
        group_name=listed["GROUP_NAME"],
        target_dir=BUILD_DIR,
        opt_level=_setting("APPBRIDGE_MYPYC_OPT", "3", ("0", "1", "2", "3")),
        multi_file=_setting("APPBRIDGE_MYPYC_MULTI_FILE", "1", ("0", "1")) == "1",
    )
    # With one C file per module, mypyc writes the modules' files to the top of its output
    # directory but the group's headers, which they include, into the package's directory.
    headers = os.path.join(BUILD_DIR, *listed["GROUP_NAME"].split(".")[:-1])
    for ext in extensions:
        if ext.name == listed["GROUP_NAME"] + "__mypyc":
            ext.include_dirs.append(headers)
    return extensions


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _gated(compile_sources: Callable[..., list[str]], jobs: int) -> Callable[..., list[str]]:
    """The compiler's ``compile``, running each source as its own job, at most ``jobs`` at once
    across every caller: the group's library is one extension of many C files, which
    ``build_ext``'s own parallel mode (one extension per job) would compile one by one."""
    gate = threading.BoundedSemaphore(jobs)

    def compile_each(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
        def one(source: str) -> list[str]:
            with gate:
                return compile_sources([source], *args, **kwargs)

        if len(sources) < 2:
            return one(sources[0]) if sources else []
        with ThreadPoolExecutor(max_workers=min(jobs, len(sources))) as pool:
            # The largest files first, so that the last one to finish is a short one.
            started = {s: pool.submit(one, s) for s in sorted(sources, key=_size, reverse=True)}
            return [obj for source in sources for obj in started[source].result()]

    return compile_each


class BuildExt(build_ext):
    """``build_ext`` that adds the media path's extensions when it runs, and compiles on all
    cores."""

    def finalize_options(self) -> None:
        extensions = list(self.distribution.ext_modules or [])
        extensions += [ext for ext in media_path_extensions() if ext not in extensions]
        self.distribution.ext_modules = extensions
        if self.parallel is None:
            self.parallel = _jobs()
        super().finalize_options()

    def build_extensions(self) -> None:
        jobs = _jobs() if self.parallel is True else int(self.parallel or 1)
        if jobs > 1:
            self.compiler.compile = _gated(self.compiler.compile, jobs)
        super().build_extensions()


setup(ext_modules=[RATECV, LOWPASS], cmdclass={"build_ext": BuildExt})
