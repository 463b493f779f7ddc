"""uvicorn, minus its signal handling: the gateway (or a test) owns the process's signals.

The gateway's server serves ``WS /twilio/stream`` on the WebSocket fast path
(``ws_fastpath.py``) and every other route through uvicorn's ASGI layer. Setting
``APPBRIDGE_WS_FASTPATH=off`` in the environment serves the stream through ASGI too (the same
behaviour, at about 20 % more of the gateway's CPU under load): an operator's way out should the
fast path ever misbehave, and the benchmark's A/B switch.

With ``[server] tls`` (docs/configuration.md) the same listener speaks TLS 1.2 or later: every
route, the fast path included, is then served over https and wss.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from appbridge.config.tls import check_key_pair
from appbridge.http.head_deadline import HeadDeadline
from appbridge.http.ws_router import RoutingWsProtocol, fast_ws_protocol
from appbridge.net.ws_fastpath import Acceptor

if TYPE_CHECKING:
    from appbridge.config.model import TlsFiles
    from appbridge.gateway import Gateway

FASTPATH_ENV = "APPBRIDGE_WS_FASTPATH"


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn releases
        return


class UpgradingHttpProtocol(HeadDeadline, HttpToolsProtocol):
    """uvicorn's httptools protocol, which lets go of its parser once it has handed the
    connection to a WebSocket protocol, and lets a routed WebSocket connection be read by the
    routed protocol directly (:meth:`RoutingWsProtocol.hand_over`).

    The parser holds the protocol's callbacks (bound methods) and the protocol holds the parser.
    uvicorn breaks that cycle when a connection is lost, but an upgraded connection is lost by
    the WebSocket protocol instead, so each media stream left the pair for a full collection to
    free (see media/gc_pacer.py). After the upgrade the transport feeds the new protocol
    and this one reads nothing more.

    It also bounds how long a request head may take and how many may be pending
    (``http/head_deadline.py``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._await_head()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        self.parser = None  # type: ignore[assignment]
        router = self.transport.get_protocol()
        if isinstance(router, RoutingWsProtocol):
            router.hand_over()  # the transport reads straight into the routed protocol


def uvicorn_config(app: object, **overrides: object) -> uvicorn.Config:
    """The settings every embedded server of the gateway runs with (uvloop set up by the caller)."""
    settings: dict[str, object] = {
        "loop": "none",
        "ws": "websockets-sansio",
        "http": UpgradingHttpProtocol,
        "lifespan": "off",
        "log_level": "warning",
        "access_log": False,
        "ws_max_size": 1024 * 1024,
        "ws_ping_interval": None,
        "timeout_graceful_shutdown": 2,
    }
    settings.update(overrides)
    return uvicorn.Config(app, **settings)  # type: ignore[arg-type]


def fastpath_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(FASTPATH_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def fast_routes(gw: Gateway) -> dict[str, Acceptor]:
    """The WebSocket routes served without ASGI, on the same port as the ASGI routes."""
    from appbridge.carriers.twilio.stream import accept_twilio_stream

    return {"/twilio/stream": accept_twilio_stream(gw)}


def tls_problem(tls: TlsFiles) -> str | None:
    """Why ``[server] tls`` cannot be served, in one line naming its key; None when it can."""
    for key, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as exc:
            return f"server.tls.{key}: cannot read {path}: {exc.strerror or exc}"
    message = check_key_pair(tls.cert_file, tls.key_file)
    return None if message is None else f"server.tls: {message}"


def server_ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    """The listener's TLS context: TLS 1.2 at least (RFC 8996 retires 1.0 and 1.1), HTTP/1.1
    offered by ALPN (RFC 7301). Raises ``ssl.SSLError`` or ``OSError`` for an unusable pair."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def gateway_server(
    gw: Gateway, *, fastpath: bool | None = None, **overrides: object
) -> EmbeddedServer:
    """The gateway's HTTP server: its Starlette app, plus the fast WebSocket routes unless
    ``fastpath`` is False (default: :func:`fastpath_enabled`); over TLS with ``[server] tls``."""
    from appbridge.http.app import build_app

    if fastpath is None:
        fastpath = fastpath_enabled()
    if fastpath:
        overrides.setdefault("ws", fast_ws_protocol(fast_routes(gw)))
    config = uvicorn_config(build_app(gw), **overrides)
    tls = gw.config.server.tls
    if tls is not None:
        config.load()  # uvicorn loads once; the context set here is the one it serves with
        config.ssl = server_ssl_context(tls)
    return EmbeddedServer(config)
