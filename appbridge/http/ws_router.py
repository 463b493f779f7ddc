"""The ``ws`` protocol uvicorn builds for every WebSocket upgrade: it reads the request line and
sends a fast route to :class:`~appbridge.net.ws_fastpath.FastWebSocket`, every other path to
uvicorn's own ``WebSocketsSansIOProtocol`` (so the other WebSocket routes stay ASGI).

Kept apart from ``ws_fastpath.py`` because that module is compiled (``appbridge/compiled.py``) and
this one builds a class per server at run time (:func:`fast_ws_protocol`), which compiled code
does not allow; it runs once per connection, not per frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from appbridge.net.ws_fastpath import DEFAULT_MAX_MESSAGE_BYTES, Acceptor, FastWebSocket


class RoutingWsProtocol(asyncio.Protocol):
    """uvicorn's ``ws`` protocol class: fast routes here, every other path to uvicorn's own.

    Build a concrete class with :func:`fast_ws_protocol`.
    """

    routes: Mapping[str, Acceptor] = {}
    fallback: Callable[..., asyncio.Protocol] = WebSocketsSansIOProtocol

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._config = config
        self._server_state = server_state
        self._app_state = app_state
        self._loop = _loop or asyncio.get_event_loop()
        self._transport: asyncio.BaseTransport | None = None
        self._inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        inner = self._inner
        if inner is None:
            inner = self._inner = self._route(data)
        inner.data_received(data)

    def hand_over(self) -> None:
        """Point the transport at the routed protocol, so that it calls it directly: one Python
        call less on every read of a media stream. Only once the HTTP protocol has
        handed the transport to this router (``http/uvicorn_server.py``): uvicorn calls
        ``transport.set_protocol(router)`` after the request, which would undo an earlier switch.
        The forwarding methods here serve transports that cannot switch."""
        inner = self._inner
        set_protocol = getattr(self._transport, "set_protocol", None)
        if inner is not None and set_protocol is not None:
            set_protocol(inner)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def _route(self, request_head: bytes) -> asyncio.Protocol:
        assert self._transport is not None
        line_end = request_head.find(b"\r\n")
        parts = request_head[: max(line_end, 0)].split(b" ")
        target = parts[1] if len(parts) == 3 else b""
        path = unquote(target.partition(b"?")[0].decode("latin-1"))
        acceptor = self.routes.get(path)
        inner: asyncio.Protocol
        if acceptor is not None:
            inner = FastWebSocket(
                acceptor,
                loop=self._loop,
                max_message_bytes=getattr(self._config, "ws_max_size", DEFAULT_MAX_MESSAGE_BYTES),
                connections=self._server_state.connections,
            )
        else:
            inner = type(self).fallback(
                config=self._config, server_state=self._server_state, app_state=self._app_state
            )
        inner.connection_made(self._transport)
        return inner


def fast_ws_protocol(
    routes: Mapping[str, Acceptor],
    *,
    fallback: Callable[..., asyncio.Protocol] = WebSocketsSansIOProtocol,
) -> type[RoutingWsProtocol]:
    """A ``ws`` class for ``uvicorn.Config`` serving ``routes`` (exact paths) on the fast path."""
    table = dict(routes)

    class Routed(RoutingWsProtocol):
        pass

    Routed.routes = table
    Routed.fallback = fallback
    return Routed
