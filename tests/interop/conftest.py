"""Fixtures for interop tests: real outside peers (here, Pipecat) around an in-process gateway.

Pipecat lives in its own virtualenv, ``.venv-pipecat``, installed by
deploy/install-test-peers.sh (``make install-test``), so that its many pins never touch the
gateway's environment. The Pipecat app (tests/interop/pipecat_app.py) runs as a subprocess of
that interpreter and reports what it did as JSON lines on stdout.

Under ``CI=true`` a missing or broken ``.venv-pipecat`` fails the test (docs/interop.md: a
missing peer must fail the run); elsewhere it is skipped, with the command that installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Env, gateway_env

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPECAT_PYTHON = REPO_ROOT / ".venv-pipecat" / "bin" / "python"
PIPECAT_APP = Path(__file__).resolve().parent / "pipecat_app.py"
#: The [http] credentials the gateway's Twilio-compatible REST endpoint checks, and the app's
#: workspace_ref: Pipecat's serializer uses the same pair as AccountSid and Basic auth.
HTTP_SID = "AC" + "7" * 32
HTTP_TOKEN = "pipecat-interop-token"
#: Enough for the import of pipecat (about 1 s here) on a loaded CI machine.
START_TIMEOUT_S = 20.0
_STDERR_TAIL_LINES = 60


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def pipecat_python() -> Path:
    """The Pipecat interpreter, checked once per session: missing fails under CI, else skips."""
    problem: str | None = None
    if not PIPECAT_PYTHON.exists():
        problem = f"{PIPECAT_PYTHON} does not exist"
    else:
        probe = subprocess.run(
            [
                str(PIPECAT_PYTHON),
                "-c",
                "import fastapi, uvicorn, pipecat.serializers.twilio, "
                "pipecat.transports.websocket.fastapi",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if probe.returncode != 0:
            problem = f"Pipecat does not import there: {probe.stderr.strip()[-500:]}"
    if problem is not None:
        message = (
            f"Pipecat interop peer missing ({problem}); run `bash deploy/install-test-peers.sh`"
        )
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return PIPECAT_PYTHON


class PipecatProcess:
    """The Pipecat app subprocess and the JSON events it printed, in order."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("{"):
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass
            self._changed.set()
        self._changed.set()

    def find(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    async def wait_for(self, event: str, timeout: float = 10.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The first ``event`` line; fails with Pipecat's log tail on timeout or exit."""
        deadline = time.monotonic() + timeout
        while not (found := self.find(event)):
            if self._reader.done():
                raise AssertionError(
                    f"Pipecat exited ({self.proc.returncode}) before {event!r}\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {event!r} from Pipecat in {timeout} s\n{self.log_tail()}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return found[0]

    def log_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text("utf-8", "replace").splitlines()
        except OSError:
            lines = []
        events = "\n".join(json.dumps(e) for e in self.events)
        tail = "\n".join(lines[-_STDERR_TAIL_LINES:])
        return f"--- Pipecat events ---\n{events}\n--- Pipecat log (tail) ---\n{tail}"

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._reader


@contextlib.asynccontextmanager
async def pipecat_env(
    python: Path, workdir: Path, *app_args: str
) -> AsyncIterator[tuple[Env, PipecatProcess]]:
    """A gateway whose only app is the Pipecat app (``protocol = "twilio"``), both running.

    The app's listening socket is bound here and handed to the subprocess, so the gateway's
    configuration can name the app's URL and the app can be given the gateway's base URL.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]

    def apps(_: Any) -> list[dict[str, Any]]:
        url = f"ws://127.0.0.1:{port}/ws"
        return [{"ref": "pc", "url": url, "protocol": "twilio", "workspace_ref": HTTP_SID}]

    try:
        async with gateway_env(
            apps, http={"account_sid": HTTP_SID, "auth_token": HTTP_TOKEN}
        ) as env:
            stderr_path = workdir / "pipecat.log"
            with stderr_path.open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    str(python),
                    str(PIPECAT_APP),
                    "--fd",
                    str(sock.fileno()),
                    "--base-url",
                    env.base_url,
                    "--account-sid",
                    HTTP_SID,
                    "--auth-token",
                    HTTP_TOKEN,
                    *app_args,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                    pass_fds=(sock.fileno(),),
                    cwd=str(REPO_ROOT),
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            sock.close()  # the child holds its own copy
            pipecat = PipecatProcess(proc, stderr_path)
            try:
                await pipecat.wait_for("listening", START_TIMEOUT_S)
                yield env, pipecat
            except BaseException:
                print(pipecat.log_tail())  # shown with the failure report
                raise
            finally:
                await pipecat.stop()
    finally:
        sock.close()
