"""The package's import layers (docs/ARCHITECTURE.md, "Layers"), read from the source.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: a module may
import only from its own layer or the layers below it, so no import circle can form between
layers. The sans-I/O cores import nothing that does I/O or reads a clock.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "appbridge"

#: Bottom first. A layer may hold several packages that use each other.
LAYERS: list[set[str]] = [
    {"__init__", "clock", "env_knobs", "weakable", "compiled", "counters", "protocol", "net"},
    {"config", "media", "logs"},
    {"speech", "turn"},
    {"apps"},
    {"calls", "console"},
    {"carriers", "cluster"},
    {"admission", "gateway"},
    {"http", "demo", "server", "cli", "__main__", "caller", "sdk", "testing"},
]

#: Modules that decide without I/O: no event loop, sockets, threads or clock.
CORES = [
    "calls/core.py",
    "calls/state.py",
    "calls/effects.py",
    "calls/control.py",
    "calls/transfer_core.py",
    "calls/output_events.py",
    "speech/pauses.py",
    "media/output_queue.py",
    "media/pacing.py",
    "apps/timers.py",
    "protocol/session_v1.py",
    "protocol/session_v1_terms.py",
    "protocol/json_bounds.py",
    "protocol/twilio_streams.py",
    "protocol/signing.py",
    "config/model.py",
    *(
        f"carriers/sip/{name}.py"
        for name in (
            "message",
            "headers",
            "framing",
            "header_values",
            "extensions",
            "transaction",
            "dialog",
            "digest",
            "auth_header",
            "sdp",
            "offer_answer",
            "rtp",
            "jitter",
            "dtmf4733",
        )
    ),
]
IO_MODULES = {"asyncio", "socket", "selectors", "threading", "time", "uvloop", "appbridge.clock"}


def _layer_of(unit: str) -> int:
    for n, layer in enumerate(LAYERS):
        if unit in layer:
            return n
    raise AssertionError(f"appbridge/{unit} is in no layer of this test: add it to LAYERS")


def _unit(module: str) -> str:
    """The top-level part of ``appbridge.x.y``: ``x`` (``__init__`` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "appbridge":  # a submodule, or __version__ of the package itself
                for alias in node.names:
                    sub = ROOT / alias.name
                    is_module = sub.is_dir() or sub.with_suffix(".py").exists()
                    yield f"appbridge.{alias.name}" if is_module else "appbridge"
            else:
                yield node.module


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_every_package_has_a_layer() -> None:
    for path in _modules():
        _layer_of(path.relative_to(ROOT).parts[0].removesuffix(".py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_from_its_layer_or_below(path: Path) -> None:
    unit = path.relative_to(ROOT).parts[0].removesuffix(".py")
    own = _layer_of(unit)
    upward = [
        name
        for name in _imports(path)
        if name.startswith("appbridge.") and _layer_of(_unit(name)) > own
    ]
    assert upward == [], f"{path.relative_to(ROOT)} imports from a higher layer"


@pytest.mark.parametrize("core", CORES)
def test_the_cores_do_no_io_and_read_no_clock(core: str) -> None:
    found = [name for name in _imports(ROOT / core) if name in IO_MODULES]
    assert found == [], f"{core} imports {found}"


def test_the_engine_knows_neither_the_gateway_nor_a_carrier() -> None:
    for path in (ROOT / "calls").glob("*.py"):
        for name in _imports(path):
            assert not name.startswith(("appbridge.gateway", "appbridge.carriers")), (path, name)
