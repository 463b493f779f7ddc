"""Run a real gateway in-process on a loopback port, for tests and the benchmark.

The listening socket is bound first (port 0), so the configuration can name the real port (the
TwiML stream URL and Twilio signatures are built from it) without a race for a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator

from appbridge.config import Config
from appbridge.gateway import Gateway
from appbridge.http.uvicorn_server import gateway_server


def bind_loopback() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def with_port(config: Config, port: int) -> Config:
    server = dataclasses.replace(config.server, host="127.0.0.1", port=port)
    return dataclasses.replace(config, server=server)


@contextlib.asynccontextmanager
async def running_gateway(
    config: Config, sock: socket.socket | None = None, *, fastpath: bool | None = None
) -> AsyncIterator[Gateway]:
    """Serve ``config`` on ``sock`` (or a fresh loopback socket); the port is patched in.
    ``fastpath`` as in :func:`~appbridge.http.uvicorn_server.gateway_server`."""
    sock = sock or bind_loopback()
    port = sock.getsockname()[1]
    if config.server.port != port:
        config = with_port(config, port)
    gw = Gateway(config)
    server = gateway_server(gw, fastpath=fastpath, timeout_graceful_shutdown=1)
    await gw.start()
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise RuntimeError("gateway did not start")
        await asyncio.sleep(0.005)
    try:
        yield gw
    finally:
        await gw.stop()
        server.should_exit = True
        await task
        sock.close()


def base_url(gw: Gateway) -> str:
    return gw.config.server.base_url()
