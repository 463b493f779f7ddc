"""``make run`` on a tree whose compiled build is not current: serve now, compile meanwhile.

mypyc takes one to two minutes on two cores to compile the media path (appbridge/compiled.py),
and a newcomer's first ``make run`` should answer ``/healthz`` well before that
(docs/operations.md, "Running the gateway"). So, when the Makefile finds the compiled build out
of date, it runs this script, which:

1. adopts a finished background build made from exactly these sources (their SHA-256 names its
   folder, ``build/staged/<digest>``): copies its extensions into the tree, checks them with
   ``python -m appbridge.compiled`` and marks the install current;
2. otherwise installs the package interpreted (``APPBRIDGE_COMPILE=0``, a few seconds), starts
   the compiled build in the background on a copy of the sources, at low priority, unless one
   for these sources is already running, and says so in one line;
3. then serves, with ``appbridge serve`` and the arguments it was given.

The next ``make run`` after the background build finished starts compiled. ``make install``,
``make test`` and ``make bench`` always build compiled in place, as before; a staged build never
replaces a newer one.

Usage (from the Makefile): ``.venv/bin/python deploy/first-run.py STAMP [serve arguments]``.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGED = ROOT / "build" / "staged"
TOP_FILES = ("pyproject.toml", "setup.py", "README.md")
BIN = Path(sys.executable).parent


def build_inputs() -> list[Path]:
    """What the compiled build depends on: the Makefile's BUILD_INPUTS."""
    listed = runpy.run_path(str(ROOT / "appbridge" / "compiled.py"))
    sources = [listed["source_path"](m, ROOT) for m in listed["COMPILED_MODULES"]]
    fixed = [
        "pyproject.toml",
        "setup.py",
        "appbridge/media/_ratecv.c",
        "appbridge/media/_lowpass.c",
        "appbridge/compiled.py",
    ]
    return [ROOT / name for name in fixed] + sources


def digest(paths: list[Path]) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def adopt(folder: Path, stamp: Path) -> bool:
    """Copies a finished staged build's extensions into the tree; False if it did not check."""
    built = sorted((folder / "src" / "appbridge").rglob("*.so"))
    if not built:
        return False
    for path in built:
        target = ROOT / path.relative_to(folder / "src")
        shutil.copy(path, target)  # not copy2: the copy must be newer than its source
    check = subprocess.run([str(BIN / "python"), "-m", "appbridge.compiled"], cwd=ROOT)
    if check.returncode != 0:
        return False
    stamp.touch()
    print("appbridge: the media path is compiled now (adopted the background build)")
    return True


def running(folder: Path) -> bool:
    pid_file = folder / "pid"
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def start_background_build(folder: Path) -> None:
    """Compiles a copy of the sources into ``folder/src`` at low priority, one job at a time,
    leaving the other core to the gateway; ``folder/done`` marks success."""
    if folder.exists() and running(folder):
        return
    shutil.rmtree(folder, ignore_errors=True)
    source = folder / "src"
    ignore = shutil.ignore_patterns("*.so", "__pycache__")
    shutil.copytree(ROOT / "appbridge", source / "appbridge", ignore=ignore)
    for name in TOP_FILES:
        shutil.copy(ROOT / name, source / name)
    log = open(folder / "build.log", "wb")  # noqa: SIM115 - the child keeps it
    script = f"nice -n 10 '{BIN / 'python'}' setup.py build_ext --inplace && touch ../done"
    child = subprocess.Popen(
        ["sh", "-c", script],
        cwd=source,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "APPBRIDGE_BUILD_JOBS": "1"},
        start_new_session=True,
    )
    (folder / "pid").write_text(str(child.pid))
    print(
        "appbridge: serving with the media path interpreted for now; compiling it in the "
        f"background ({folder.relative_to(ROOT)}/build.log, a few minutes); the next "
        "`make run` after that starts compiled"
    )


def install_interpreted() -> None:
    """The package without mypyc: a few seconds, and the same behaviour, at more CPU per call."""
    env = {**os.environ, "APPBRIDGE_COMPILE": "0"}
    command = [str(BIN / "pip"), "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."]
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def main(argv: list[str]) -> int:
    stamp, serve_args = Path(argv[0]), argv[1:]
    folder = STAGED / digest(build_inputs())
    if not ((folder / "done").exists() and adopt(folder, stamp)):
        install_interpreted()
        start_background_build(folder)
    appbridge = str(BIN / "appbridge")
    os.execv(appbridge, [appbridge, "serve", *serve_args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
