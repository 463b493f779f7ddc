"""The per-frame modules run compiled (mypyc, appbridge/compiled.py), and from a current build."""

from __future__ import annotations

import importlib.machinery
import logging
import os
import subprocess
from pathlib import Path

import pytest

from appbridge import compiled

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_module_is_compiled_unless_the_build_said_not_to() -> None:
    interpreted = [m for m in compiled.COMPILED_MODULES if not compiled.is_compiled(m)]
    if os.environ.get("APPBRIDGE_COMPILE", "1") == "0":
        assert interpreted == list(compiled.COMPILED_MODULES)
    else:
        # `make install` builds them (setup.py); interpreted is for machines without a compiler.
        assert interpreted == [], f"not compiled (reinstall with a C compiler): {interpreted}"


def test_the_compiled_build_matches_the_source() -> None:
    assert compiled.stale_modules() == [], "sources changed after the build: make install-test"


def test_the_list_names_real_modules_and_the_makefile_rebuilds_on_each() -> None:
    for module in compiled.COMPILED_MODULES:
        assert compiled.source_path(module).is_file(), module
    out = subprocess.run(
        ["make", "-pn", "-C", str(ROOT)], capture_output=True, text=True, check=False
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BUILD_INPUTS :="))
    for module in compiled.COMPILED_MODULES:
        assert module.replace(".", "/") + ".py" in line.split(), module


def test_a_source_newer_than_its_build_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    for name in ("fresh", "edited", "plain"):
        (package / f"{name}.py").write_text("")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("fresh", "edited"):
        (package / f"{name}{suffix}").write_bytes(b"")
    os.utime(package / f"edited{suffix}", (1_000_000, 1_000_000))  # built before the edit
    modules = ("pkg.fresh", "pkg.edited", "pkg.plain")
    assert compiled.stale_modules(modules, tmp_path) == ["pkg.edited"]
    assert compiled.extension_path("pkg.plain", tmp_path) is None


def test_serve_reports_an_interpreted_or_stale_build(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from appbridge import server

    monkeypatch.setattr(compiled, "is_compiled", lambda module: False)
    monkeypatch.setattr(compiled, "stale_modules", lambda: ["appbridge.media.codecs"])
    with caplog.at_level(logging.INFO, logger="appbridge"):
        server._report_build()
    text = caplog.text
    assert f"{len(compiled.COMPILED_MODULES)} of {len(compiled.COMPILED_MODULES)} modules" in text
    assert "older than their source" in text and "appbridge.media.codecs" in text


def test_the_install_fails_on_a_build_that_left_a_module_interpreted_unasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left = compiled.COMPILED_MODULES[0]
    monkeypatch.setattr(compiled, "is_compiled", lambda module: module != left)
    monkeypatch.setattr(compiled, "stale_modules", list)
    monkeypatch.setattr(compiled, "have_c_compiler", lambda: True)
    monkeypatch.delenv("APPBRIDGE_COMPILE", raising=False)
    problem = compiled.check_build()
    assert problem is not None and left in problem
    monkeypatch.setenv("APPBRIDGE_COMPILE", "0")  # asked for interpreted
    assert compiled.check_build() is None
    monkeypatch.delenv("APPBRIDGE_COMPILE")
    monkeypatch.setattr(compiled, "have_c_compiler", lambda: False)  # nothing to compile with
    assert compiled.check_build() is None
    monkeypatch.setattr(compiled, "have_c_compiler", lambda: True)
    monkeypatch.setattr(compiled, "is_compiled", lambda module: True)
    assert compiled.check_build() is None
    monkeypatch.setattr(compiled, "stale_modules", lambda: [left])
    assert compiled.check_build() == f"built before their source changed: {left}"
