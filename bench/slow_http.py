"""Slow HTTP clients for ``make bench BENCH_ARGS="--slow-http N"`` (bench/README.md).

Each client opens a connection to the gateway's HTTP port and sends a request head one byte a
second, the shape of a slowloris attack. The step's pacing and jitter figures then show whether
idle and slow connections disturb the calls' media (docs/operations.md, "HTTP connections").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

REQUEST_START = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Slow: "


@dataclass
class SlowClients:
    host: str
    port: int
    count: int
    interval_s: float = 1.0
    opened: int = 0
    refused: int = 0
    closed_by_gateway: int = 0
    bytes_sent: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        """Opens every connection at once, as an attacker's burst would."""
        self._tasks = [asyncio.create_task(self._one()) for _ in range(self.count)]

    async def stop(self) -> dict[str, int]:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return {
            "clients": self.count,
            "opened": self.opened,
            "refused": self.refused,
            "closed_by_gateway": self.closed_by_gateway,
            "bytes_sent": self.bytes_sent,
        }

    async def _one(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            self.refused += 1
            return
        self.opened += 1
        closed = asyncio.create_task(reader.read(65536))
        try:
            writer.write(REQUEST_START[:1])
            self.bytes_sent += 1
            for byte in (REQUEST_START[1:] + b"a" * 100_000)[:100_000]:
                done, _ = await asyncio.wait({closed}, timeout=self.interval_s)
                if done:
                    self.closed_by_gateway += 1
                    return
                writer.write(bytes((byte,)))
                self.bytes_sent += 1
        except OSError:
            self.closed_by_gateway += 1
        finally:
            closed.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def slow_clients(base_url: str, count: int, cpus: list[int] | None) -> SlowClients | None:
    """``count`` clients started against the gateway at ``base_url`` (None when 0). The
    orchestrator moves to the load generator's ``cpus`` first, so that opening them costs the
    gateway's core nothing."""
    if count <= 0:
        return None
    if cpus:
        os.sched_setaffinity(0, cpus)
    url = urlsplit(base_url)
    clients = SlowClients(url.hostname or "127.0.0.1", url.port or 80, count)
    clients.start()
    return clients
