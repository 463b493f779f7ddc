"""A real ``redis-server`` for the cluster tests (docs/scaling.md), one per test module.

:func:`redis_server` starts ``redis-server --port <free> --save "" --appendonly no`` in its own
temporary directory on loopback and yields a :class:`RedisProcess`, whose :meth:`restart` stops
it and starts an empty one on the same port (the directory must heal). Where redis-server is
missing the tests are skipped, naming deploy/install-test-peers.sh; under ``CI=true`` they fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
)
START_TIMEOUT_S = 10.0


def redis_required() -> None:
    """Skip (or, under CI=true, fail) when redis-server is not installed."""
    if REDIS_SERVER is not None:
        return
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail("CI=true and redis-server is missing: run deploy/install-test-peers.sh")
    pytest.skip("redis-server missing: run deploy/install-test-peers.sh")


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """One redis-server on 127.0.0.1, started and killed by the test."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _pings(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill it and start an empty one on the same port: everything it held is gone."""
        self.stop()
        self.start()

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)


def _redis_server() -> Iterator[RedisProcess]:
    redis_required()
    with tempfile.TemporaryDirectory(prefix="appbridge-redis-") as workdir:
        server = RedisProcess(free_tcp_port(), Path(workdir))
        server.start()
        try:
            yield server
        finally:
            server.stop()


#: The module-level fixture: ``from tests.cluster_support import redis_server`` in a test module.
redis_server = pytest.fixture(scope="module")(_redis_server)
