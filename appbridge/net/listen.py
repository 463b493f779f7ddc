"""Opening the gateway's listeners, with one clear line when that fails (docs/operations.md,
"Starting").

A port already in use, an address not on this host, a port below 1024 without the right:
``appbridge serve`` then exits 1 with one line naming the configuration key and the address,
never a traceback (and never uvicorn's own exit code).
"""

from __future__ import annotations

import os
import socket


class ListenError(Exception):
    """A listener could not be opened; the message names the key and the address."""

    def __init__(self, key: str, address: str, exc: OSError) -> None:
        cause = exc.__cause__  # uvloop wraps the system's error in one of its own
        errno = exc.errno or (cause.errno if isinstance(cause, OSError) else None)
        reason = os.strerror(errno) if errno else str(exc)
        super().__init__(f"{key}: cannot listen on {address}: {reason.lower()}")


def tcp_socket(host: str, port: int, *, key: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (any address family the host resolves to),
    for a server that takes its sockets ready-made; raises :class:`ListenError`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family = infos[0][0]
        sock = socket.create_server(infos[0][4][:2], family=family, backlog=2048)
    except OSError as exc:
        raise ListenError(key, f"{host}:{port}", exc) from None
    sock.setblocking(False)
    return sock
