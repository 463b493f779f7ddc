"""deploy/first-run.py: the staged build is named by exactly the sources it compiles."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_RUN = runpy.run_path(str(ROOT / "deploy" / "first-run.py"))


def test_the_build_inputs_are_the_makefiles() -> None:
    names = {str(p.relative_to(ROOT)) for p in FIRST_RUN["build_inputs"]()}
    make = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "show"],
        input="show:\n\t@echo $(BUILD_INPUTS)\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert names == set(make.stdout.split())


def test_the_digest_follows_every_byte_and_name(tmp_path: Path) -> None:
    digest = FIRST_RUN["digest"]
    inputs = FIRST_RUN["build_inputs"]()
    assert digest(inputs) == digest(list(inputs))
    assert digest(inputs) != digest(inputs[:-1])
    assert len(digest(inputs)) == 16


def test_a_dead_builder_is_not_running(tmp_path: Path) -> None:
    running = FIRST_RUN["running"]
    (tmp_path / "pid").write_text(str(os.getpid()))
    assert running(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    (tmp_path / "pid").write_text(str(child.pid))
    assert not running(tmp_path)
    (tmp_path / "pid").write_text("not a pid")
    assert not running(tmp_path)


def test_an_empty_staged_build_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / "src" / "appbridge").mkdir(parents=True)
    stamp = tmp_path / "stamp"
    assert not FIRST_RUN["adopt"](tmp_path, stamp)
    assert not stamp.exists()


@pytest.mark.parametrize("name", ["pyproject.toml", "setup.py", "README.md"])
def test_the_copied_top_files_exist(name: str) -> None:
    assert name in FIRST_RUN["TOP_FILES"]
    assert (ROOT / name).is_file()
