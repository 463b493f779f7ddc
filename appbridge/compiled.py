"""The modules compiled to C with mypyc, and a check that the build is current.

These are the modules every audio frame passes through: RTP in and out, the jitter buffer, the
Twilio stream's fast path, the conversions, the VAD and turn detector, the output queue, the
media clock, the clock they read and the app link's writes. They are plain, type-checked
Python; ``setup.py`` hands this list to mypyc, which turns each into an extension module
(``<name>.cpython-*.so``) that Python imports in place of the ``.py`` beside it. The source
stays the truth: without a C compiler, or with ``APPBRIDGE_COMPILE=0`` at install time, the same
modules run interpreted.

A compiled module does not notice its source changing: after editing one of these files, rebuild
(``make install`` / ``make install-test`` do it when a file listed here changes).
:func:`stale_modules` lists the ones whose source is newer than their build; the test suite
fails on any, and ``appbridge serve`` logs a warning. ``python -m appbridge.compiled``
(``make install`` runs it after the build) fails when the build left a listed module
interpreted without a reason to.

Nothing here imports the rest of the package: ``setup.py`` reads this file on its own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

COMPILED_MODULES: tuple[str, ...] = (
    "appbridge.apps.dialects",
    "appbridge.apps.link",
    "appbridge.calls.call",
    "appbridge.calls.listening",
    "appbridge.clock",
    "appbridge.carriers.sip.jitter",
    "appbridge.carriers.sip.leg",
    "appbridge.carriers.sip.rtp",
    "appbridge.carriers.twilio.leg",
    "appbridge.carriers.twilio.stream",
    "appbridge.net.ws_fastpath",
    "appbridge.media.codecs",
    "appbridge.media.media_clock",
    "appbridge.media.output_queue",
    "appbridge.media.pacing",
    "appbridge.media.reframe",
    "appbridge.media.resample",
    "appbridge.net.ws_client",
    "appbridge.net.ws_frames",
    "appbridge.turn.detector",
    "appbridge.turn.vad",
)

GROUP_NAME = "appbridge._native"
"""mypyc's shared library for the group: ``appbridge/_native__mypyc.cpython-*.so``."""

_ROOT = Path(__file__).resolve().parent.parent


def source_path(module: str, root: Path = _ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(module: str, root: Path = _ROOT) -> Path | None:
    """The built extension beside the module's source, if there is one."""
    source = source_path(module, root)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_name(source.stem + suffix)
        if candidate.exists():
            return candidate
    return None


def is_compiled(module: str) -> bool:
    """True when importing ``module`` loads the compiled extension (whether or not it is loaded
    yet)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


def stale_modules(modules: tuple[str, ...] = COMPILED_MODULES, root: Path = _ROOT) -> list[str]:
    """Compiled modules whose source changed after they were built: Python would run the old
    build, not the source."""
    stale = []
    for module in modules:
        ext = extension_path(module, root)
        if ext is not None and source_path(module, root).stat().st_mtime > ext.stat().st_mtime:
            stale.append(module)
    return stale


def have_c_compiler() -> bool:
    """Whether the compiler that builds extensions for this Python (``CC``, else its own) is on
    the PATH: without one, ``setup.py`` installs the listed modules interpreted."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None


def check_build() -> str | None:
    """What is wrong with the installed build, or None. Interpreted modules are right only when
    the install asked for them (``APPBRIDGE_COMPILE=0``) or had no C compiler."""
    if os.environ.get("APPBRIDGE_COMPILE", "1") == "0" or not have_c_compiler():
        return None
    interpreted = [m for m in COMPILED_MODULES if not is_compiled(m)]
    if interpreted:
        which = (
            f"all {len(interpreted)} listed modules"
            if len(interpreted) == len(COMPILED_MODULES)
            else ", ".join(interpreted)
        )
        return (
            f"the build left {which} interpreted; `pip install -v --no-deps "
            "--no-build-isolation -e .` shows setup.py's reason"
        )
    stale = stale_modules()
    if stale:
        return f"built before their source changed: {', '.join(stale)}"
    return None


if __name__ == "__main__":
    problem = check_build()
    if problem is not None:
        print(f"appbridge: {problem}", file=sys.stderr)
        sys.exit(1)
