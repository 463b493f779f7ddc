"""Running real sipp (Debian ``sip-tester``) next to an in-process gateway.

One place for what every sipp test does: fill a scenario's ``@KEY@`` placeholders, start sipp on
loopback for one call with bounded timeouts and an error file, wait until a UAS has bound its
port, and collect the exit code with the end of its log.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

SIPP = shutil.which("sipp")
SCENARIOS = Path(__file__).parent / "sipp"
SIPP_TIMEOUT_S = 20


def sipp_required() -> pytest.MarkDecorator:
    """The mark of tests that need sipp: skipped where it is missing, but under CI=true a missing
    peer fails the run at collection (it never skips silently)."""
    if SIPP is None and os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail("CI=true and sipp is missing: run deploy/install-test-peers.sh", pytrace=False)
    return pytest.mark.skipif(SIPP is None, reason="sipp missing: run deploy/install-test-peers.sh")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(port: int, kind: int = socket.SOCK_DGRAM) -> bool:
    """Whether something (sipp) has bound 127.0.0.1:``port``: our own bind then fails."""
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def scenario_file(tmp: Path, text: str, name: str, **fill: str) -> Path:
    """``text`` with every ``@KEY@`` filled from ``fill``, written to ``tmp / name``."""
    for key, value in fill.items():
        text = text.replace(f"@{key.upper()}@", value)
    assert re.search(r"@[A-Z_]+@", text) is None, "unfilled placeholder"
    path = tmp / name
    path.write_text(text)
    return path


def bundled_scenario(tmp: Path, scenario: str | None, **fill: str) -> list[str]:
    """sipp's options for a scenario of tests/integration/sipp/ (None: the built-in UAS)."""
    if scenario is None:
        return ["-sn", "uas"]
    return ["-sf", str(scenario_file(tmp, (SCENARIOS / scenario).read_text(), scenario, **fill))]


async def spawn_sipp(
    tmp: Path,
    *args: str,
    local_port: int,
    timeout_s: float = SIPP_TIMEOUT_S,
    error_file: str = "sipp_errors.log",
) -> asyncio.subprocess.Process:
    """sipp on 127.0.0.1:``local_port`` for one call; ``args`` name the scenario (and any
    remote address or extra options)."""
    assert SIPP is not None
    return await asyncio.create_subprocess_exec(
        SIPP,
        *args,
        "-i",
        "127.0.0.1",
        "-p",
        str(local_port),
        "-mi",
        "127.0.0.1",
        "-mp",
        str(free_port() & ~1),
        "-m",
        "1",
        "-timeout",
        f"{timeout_s:g}s",
        "-timeout_error",
        "-nostdin",
        "-trace_err",
        "-error_file",
        str(tmp / error_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(tmp),
    )


async def until_bound(
    proc: asyncio.subprocess.Process, port: int, kind: int = socket.SOCK_DGRAM
) -> asyncio.subprocess.Process:
    """Returns ``proc`` once it has bound ``port`` (a UAS ready for the gateway's INVITE)."""
    for _ in range(300):
        if port_taken(port, kind):
            return proc
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.01)
    out = await proc.stdout.read() if proc.stdout is not None else b""
    raise AssertionError("sipp did not start: " + out.decode(errors="replace")[-2000:])


async def finish_sipp(
    proc: asyncio.subprocess.Process,
    tmp: Path,
    *,
    timeout_s: float = SIPP_TIMEOUT_S,
    error_file: str = "sipp_errors.log",
) -> tuple[int, str]:
    """sipp's exit code and the end of its output and error file; killed if abandoned."""
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s + 10)
    except (asyncio.CancelledError, TimeoutError):
        proc.kill()
        await proc.wait()
        raise
    log = out.decode(errors="replace")[-3000:]
    errors = tmp / error_file
    if errors.exists():
        log += "\n" + errors.read_text()[-3000:]
    assert proc.returncode is not None
    return proc.returncode, log
