"""The app server: where the gateway dials in, one WebSocket per call (docs/protocol-session-v1.md,
"Connection and frames").

:class:`AppServer` checks the signing headers of each connection request (401 otherwise, and the
handler is never called), waits for ``session.start`` (always the first message), and calls the
developer's handler with one :class:`~appbridge.sdk.Session` per call. It runs

- **on its own**: ``await server.serve(host, port)`` listens with the ``websockets`` library;
- **inside an ASGI app**: the server is itself an ASGI WebSocket endpoint, so Starlette takes
  ``WebSocketRoute("/session", server)`` and FastAPI takes
  ``await server.handle_websocket(websocket)`` inside an ``@app.websocket`` route.

When the handler returns, or raises, the call is hung up if it is still live (closing the socket
from the app's side hangs the call up; docs/protocol-session-v1.md, ``session.end``), so a handler
is the call's whole life. One handler failing is logged and ends only its own call.

With ``reconnect=True`` a session survives a lost socket for the gateway's redial
(``sdk/resume.py``; docs/sdk.md, "Reconnecting").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Final

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.session_v1_ext import reconnect_of
from appbridge.protocol.signing import FONOSTER_TOLERANCE_S
from appbridge.sdk.errors import SessionClosed
from appbridge.sdk.inbound import decode_frame
from appbridge.sdk.resume import RESUME_WINDOW_S, ResumeHook, Resumer
from appbridge.sdk.session import Session
from appbridge.sdk.verification import Verifier, request_url
from appbridge.sdk.wire import AsgiWire, WebsocketsWire, Wire

__all__ = ["AppServer", "Handler", "ResumeHook"]

log = logging.getLogger("appbridge.sdk")

Handler = Callable[[Session], Awaitable[None]]

START_TIMEOUT_S: Final = 10.0
"""How long a new connection may take to send ``session.start`` before it is closed."""

HANGUP_WAIT_S: Final = 5.0
"""How long to wait for ``session.end`` after hanging up a call whose handler returned."""

MAX_FRAME_BYTES: Final = 1 << 20
"""Largest frame accepted from the gateway (its frames are small: JSON events, 20 ms audio)."""

CLOSE_POLICY: Final = 1008


class AppServer:
    """Serves ``fonoster.session.v1`` to ``handler``, one :class:`Session` per call.

    ``secrets``: the app's signing secret, or a list of them while rotating; ``None`` turns
    verification off (only for an app the gateway dials on loopback without a secret).
    ``public_url``: the app's URL exactly as configured at the gateway, which the signature
    covers; by default it is rebuilt from the request (see :mod:`appbridge.sdk.verification`).
    ``path``: standalone mode answers 404 elsewhere (``None``: any path).
    ``reconnect``: keep each session across a lost socket while the gateway redials
    (docs/sdk.md, "Reconnecting"); ``on_resume``: asked whether a redialled session this process
    does not know (it restarted) can be restored from the app's own store.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        secrets: str | Sequence[str] | None,
        public_url: str | None = None,
        path: str | None = "/session",
        auto_barge_in: bool = True,
        start_timeout_s: float = START_TIMEOUT_S,
        tolerance_s: int = FONOSTER_TOLERANCE_S,
        wall_clock: Callable[[], float] = time.time,
        reconnect: bool = False,
        on_resume: ResumeHook | None = None,
        resume_window_s: float = RESUME_WINDOW_S,
    ) -> None:
        self.handler = handler
        self.verifier = Verifier(
            secrets, public_url=public_url, tolerance_s=tolerance_s, wall_clock=wall_clock
        )
        self.path = path
        self.auto_barge_in = auto_barge_in
        self.start_timeout_s = start_timeout_s
        self.reconnect = reconnect
        self.resumer = Resumer(on_resume, resume_window_s)
        self.sessions: set[Session] = set()
        """The sessions whose handler is running."""
        self.refused = 0
        """Connection requests answered 401 (bad or stale signature)."""
        self._server: Server | None = None
        self._tls = False
        self._host = "127.0.0.1"

    # ------------------------------------------------------------------ standalone
    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl: ssl_module.SSLContext | None = None
    ) -> AppServer:
        """Starts listening (port 0 picks a free one; see :attr:`port`). Returns ``self``."""
        if self._server is not None:
            raise RuntimeError("already serving")
        self._tls = ssl is not None
        self._server = await serve(
            self._on_connection,
            host,
            port,
            ssl=ssl,
            process_request=self._check_request,
            compression=None,
            max_size=MAX_FRAME_BYTES,
        )
        self._host = host
        log.info("serving fonoster.session.v1 on %s", self.url)
        return self

    async def serve_forever(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Listens until cancelled (Ctrl-C under ``asyncio.run``)."""
        await self.serve(host, port)
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.close()

    @property
    def port(self) -> int:
        """The port the standalone server listens on."""
        if self._server is None:
            raise RuntimeError("not serving")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """``ws://HOST:PORT/PATH``: what to configure as the app's URL at the gateway (a
        wildcard host shows as 127.0.0.1)."""
        scheme = "wss" if self._tls else "ws"
        host = "127.0.0.1" if self._host in ("", "0.0.0.0", "::") else self._host
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}{self.path or '/'}"

    async def close(self) -> None:
        """Stops listening and closes every session (their pending awaits raise)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def __aenter__(self) -> AppServer:
        if self._server is None:
            await self.serve()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.path is not None and request.path.split("?", 1)[0] != self.path:
            return connection.respond(404, "no such path\n")
        url = request_url("wss" if self._tls else "ws", request.headers.get("Host"), request.path)
        reason = self.verifier.check(url, request.headers)
        if reason is not None:
            self.refused += 1
            log.warning("refused a connection: %s", reason)
            return connection.respond(401, reason + "\n")
        return None

    async def _on_connection(self, ws: ServerConnection) -> None:
        await self.run_session(WebsocketsWire(ws))

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The ASGI WebSocket endpoint (mount it with Starlette's ``WebSocketRoute``)."""
        if scope["type"] != "websocket":
            response = PlainTextResponse("a WebSocket endpoint\n", status_code=426)
            await response(scope, receive, send)
            return
        await self.handle_websocket(WebSocket(scope, receive, send))

    async def handle_websocket(self, websocket: WebSocket) -> None:
        """Serves one not-yet-accepted Starlette/FastAPI WebSocket: verify, accept, run."""
        scope = websocket.scope
        raw_path = scope.get("raw_path") or scope["path"].encode()
        target = raw_path.decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        url = request_url(scope.get("scheme", "ws"), websocket.headers.get("host"), target)
        reason = self.verifier.check(url, websocket.headers)
        if reason is not None:
            self.refused += 1
            log.warning("refused a connection: %s", reason)
            await _deny(websocket, reason)
            return
        await websocket.accept()
        await self.run_session(AsgiWire(websocket))

    # ------------------------------------------------------------------ one call
    async def run_session(self, wire: Wire) -> None:
        """Runs one accepted connection: ``session.start``, the handler, then the hang-up."""
        try:
            async with asyncio.timeout(self.start_timeout_s):
                first = await wire.recv()
        except TimeoutError:
            log.warning("no session.start within %.0f s; closing", self.start_timeout_s)
            await wire.close(CLOSE_POLICY, "expected session.start")
            return
        if first is None:
            return
        start = decode_frame(first)
        if not isinstance(start, sv1.SessionStart):
            log.warning("the first message was not a valid session.start; closing")
            await wire.close(CLOSE_POLICY, "expected session.start")
            return
        info = reconnect_of(first)
        if info is not None:
            await self._take_back(start, info, wire)
            return
        session = Session(start, wire, auto_barge_in=self.auto_barge_in, reconnect=self.reconnect)
        if self.reconnect:
            self.resumer.track(session)
        session._run_io()
        await self._run_handler(session, start, wire)

    async def _take_back(self, start: sv1.SessionStart, info: sv1.Reconnect, wire: Wire) -> None:
        """A ``session.start`` with ``reconnect``: resume the parked session it names, or one
        the resume hook restores; else refuse it by closing, so the gateway falls back."""
        session = self.resumer.take(start.session_ref) if self.reconnect else None
        if session is not None:
            session._resume(wire, info)
            await session.wire_done.wait()  # the handler runs on in its first connection
            return
        if self.reconnect and await self.resumer.restores(start):
            session = Session(start, wire, auto_barge_in=self.auto_barge_in, reconnect=True)
            self.resumer.track(session)
            session._resume(wire, info, restored=True)
            await self._run_handler(session, start, wire)
            return
        log.info("session %s: not known here; refusing to take it back", start.session_ref)
        await wire.close(CLOSE_POLICY, "unknown session")

    async def _run_handler(self, session: Session, start: sv1.SessionStart, wire: Wire) -> None:
        self.sessions.add(session)
        try:
            await self.handler(session)
        except SessionClosed:
            log.debug("session %s: the call ended under the handler", start.session_ref)
        except Exception:  # the one boundary per call: a handler bug ends only its own call
            log.exception("session %s: the handler failed; hanging up", start.session_ref)
        finally:
            self.sessions.discard(session)
            await self._finish(session, wire)

    async def _finish(self, session: Session, wire: Wire) -> None:
        if not session.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HANGUP_WAIT_S):
                    await session.hangup()
        self.resumer.forget(session)
        await session._shutdown()
        if session._wire is not wire:
            await session._wire.close()  # the socket it was resumed on
        await wire.close()


async def _deny(websocket: WebSocket, reason: str) -> None:
    """401 through the WebSocket Denial Response extension, else a close before accept (403)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(PlainTextResponse(reason + "\n", status_code=401))
    else:
        await websocket.close(CLOSE_POLICY, reason)
