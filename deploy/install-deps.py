"""Installs what building AppBridge needs before it is built: the build requirements and the
runtime dependencies of pyproject.toml, plus the extras named on the command line.

mypyc type-checks the compiled modules against the dependencies installed in the environment
(setup.py), so they have to be there before the one build. pip's own order builds the project
first and installs its dependencies after, which in a fresh environment would leave the media
path interpreted. ``make install`` runs this script, then
``pip install --no-deps --no-build-isolation -e .``.

Usage: ``.venv/bin/python deploy/install-deps.py [EXTRA ...]`` (the environment's own Python;
tomllib needs 3.11).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def requirements(pyproject: dict[str, Any], extras: list[str]) -> list[str]:
    """The build requirements, then the runtime dependencies, then each extra's."""
    project = pyproject["project"]
    found = [*pyproject["build-system"]["requires"], *project.get("dependencies", [])]
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"install-deps: pyproject.toml has no extra {extra!r}")
        found += optional[extra]
    return found


def main(extras: list[str]) -> int:
    with open(ROOT / "pyproject.toml", "rb") as f:
        pyproject = tomllib.load(f)
    command = [sys.executable, "-m", "pip", "install", "-q", *requirements(pyproject, extras)]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
