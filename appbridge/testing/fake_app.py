"""A fonoster.session.v1 app, played from the outside: what the gateway dials for each call.

The session protocol: the gateway opens one WebSocket per session to the app's URL and signs
the request with ``X-Fonoster-Timestamp`` and ``X-Fonoster-Signature`` (lowercase hex
HMAC-SHA256 of ``<timestamp>.<url>``); the app rejects a wrong signature or a timestamp more than
300 s off. :class:`FakeApp` verifies that with hmac directly, never with the gateway's signing
code, so a symmetric bug cannot pass. Each accepted connection is a :class:`FakeSession` that
records every frame and lets a test, or a scripted ``handler`` (the benchmark's talking app),
answer.

Failure modes the gateway must survive are switches here: ``refuse`` closes the listening socket
(connections are refused, exercising the 2.5 s retry window) and ``stop_reading`` stops consuming
frames so TCP backs up (a slow app: the gateway never waits on a peer).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

__all__ = [
    "SIGNATURE_MAX_SKEW_S",
    "FakeApp",
    "FakeSession",
    "RejectedHandshake",
    "fonoster_headers",
    "fonoster_signature",
]

#: The session protocol: reject timestamps further than this from our clock.
SIGNATURE_MAX_SKEW_S = 300
#: The track id of the caller's audio in ``session.start`` ``tracks`` (the protocol doc's example).
INBOUND_TRACK_ID = 1

Matcher = str | Callable[[dict[str, Any]], bool]
SessionHandler = Callable[["FakeSession"], Awaitable[None]]


def fonoster_signature(secret: str, timestamp: int | str, url: str) -> str:
    """Lowercase hex HMAC-SHA256 of ``<timestamp>.<url>`` keyed with the signing secret."""
    message = f"{timestamp}.{url}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def fonoster_headers(secret: str, url: str, timestamp: int | None = None) -> dict[str, str]:
    """The two signing headers for ``url``, as the gateway sends them (default time: now)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "X-Fonoster-Timestamp": str(ts),
        "X-Fonoster-Signature": fonoster_signature(secret, ts, url),
    }


@dataclass
class RejectedHandshake:
    """A connection attempt the fake answered with an HTTP error instead of a WebSocket."""

    path: str
    headers: dict[str, str]
    status: int
    reason: str


class FakeSession:
    """One session socket, from the app's side. Frames are recorded as they are read:
    text frames parsed into :attr:`messages`, binary frames as received (track byte included)
    into :attr:`audio`."""

    def __init__(self, ws: ServerConnection, path: str, headers: dict[str, str]) -> None:
        self.ws = ws
        self.path = path
        self.headers = headers
        self.messages: list[dict[str, Any]] = []
        self.message_times: list[float] = []
        self.audio: list[bytes] = []
        self.audio_times: list[float] = []
        self.protocol_errors: list[str] = []
        self.handler_error: BaseException | None = None
        self._reading_allowed = asyncio.Event()
        self._reading_allowed.set()
        self._changed = asyncio.Event()
        self._closed = asyncio.Event()
        self._claimed: set[int] = set()

    # ------------------------------------------------------------------ state
    @property
    def stop_reading(self) -> bool:
        """While True, no frame is read: the socket's buffers fill and TCP pushes back."""
        return not self._reading_allowed.is_set()

    @stop_reading.setter
    def stop_reading(self, value: bool) -> None:
        if value:
            self._reading_allowed.clear()
        else:
            self._reading_allowed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_code(self) -> int | None:
        """The close code the gateway sent (1006 when the connection just dropped)."""
        return self.ws.close_code

    def track_audio(self, track_id: int) -> bytes:
        """Payload bytes of every binary frame of ``track_id``, the id byte stripped."""
        return b"".join(frame[1:] for frame in self.audio if frame and frame[0] == track_id)

    def inbound_audio(self) -> bytes:
        """The caller's audio as received (track id 1)."""
        return self.track_audio(INBOUND_TRACK_ID)

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == msg_type]

    # ------------------------------------------------------------------ waiting
    async def wait_for(self, match: Matcher, timeout: float = 2.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The first message with ``type == match`` (or satisfying a predicate) not returned by
        an earlier call. Raises TimeoutError, or ConnectionError once the socket is closed."""
        pred = (lambda m: m.get("type") == match) if isinstance(match, str) else match
        cursor = 0
        async with asyncio.timeout(timeout):
            while True:
                while cursor < len(self.messages):
                    if cursor not in self._claimed and pred(self.messages[cursor]):
                        self._claimed.add(cursor)
                        return self.messages[cursor]
                    cursor += 1
                if self.closed:
                    raise ConnectionError(f"session closed before a matching message ({match!r})")
                self._changed.clear()
                await self._changed.wait()

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 2.0) -> None:  # noqa: ASYNC109
        """Wait until ``condition()`` holds; re-checked on every frame received and on close."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, timeout: float = 2.0) -> int | None:  # noqa: ASYNC109
        """Wait for the connection to end; returns the close code the gateway sent."""
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return self.ws.close_code

    # ------------------------------------------------------------------ sending
    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(msg, separators=(",", ":")))

    async def send_text(self, raw: str) -> None:
        await self.ws.send(raw)

    async def send_binary(self, data: bytes) -> None:
        await self.ws.send(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket; an app closing its socket hangs up the call (unless it asked to
        reconnect)."""
        await self.ws.close(code, reason)

    async def set_reconnect(self, on: bool = True) -> None:
        """``session.update``: ask the gateway to keep the call when this link is lost; on a
        redialled link (``session.start`` with ``reconnect``) it also takes the session back
        (docs/protocol-session-v1.md, "Reconnecting")."""
        await self.send({"type": "session.update", "reconnect": on})

    @property
    def reconnect(self) -> dict[str, Any] | None:
        """The ``reconnect`` field of this link's ``session.start``: None on a first link."""
        starts = self.of_type("session.start")
        return starts[0].get("reconnect") if starts else None

    # ------------------------------------------------------------------ reading
    async def _read_loop(self) -> None:
        try:
            while True:
                await self._reading_allowed.wait()
                frame = await self.ws.recv()
                # A recv already pending when stop_reading was set holds its frame unrecorded.
                await self._reading_allowed.wait()
                now = time.monotonic()
                if isinstance(frame, bytes):
                    self.audio.append(frame)
                    self.audio_times.append(now)
                else:
                    self._on_text(frame, now)
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            self._closed.set()
            self._changed.set()

    def _on_text(self, frame: str, now: float) -> None:
        try:
            msg = json.loads(frame)
        except ValueError:
            self.protocol_errors.append(f"not JSON: {frame[:80]!r}")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            self.protocol_errors.append(f"not a message with a type: {frame[:80]!r}")
            return
        self.messages.append(msg)
        self.message_times.append(now)


class FakeApp:
    """A session-protocol app server on 127.0.0.1 (a free port unless ``port`` is given).

    ``secret`` None (or ``verify`` False) accepts unsigned connections. ``expected_url`` is the
    URL the gateway was configured with, over which it signs; by default
    ``ws://127.0.0.1:PORT`` plus the requested path and query.
    """

    def __init__(
        self,
        *,
        secret: str | None,
        path: str = "/session",
        verify: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        expected_url: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.secret = secret
        self.path = path
        self.verify = verify
        self.host = host
        self.port = port
        self.expected_url = expected_url
        self.wall_clock = wall_clock
        self.handler: SessionHandler | None = None
        self.sessions: list[FakeSession] = []
        self.rejected_handshakes: list[RejectedHandshake] = []
        self.handler_errors: list[BaseException] = []
        self._stop_reading = False
        self._queue: asyncio.Queue[FakeSession] = asyncio.Queue()
        self._listening: Server | None = None
        self._retired: list[Server] = []
        self._relisten: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}{self.path}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self._listen()

    async def _listen(self) -> None:
        self._listening = await serve(
            self._on_connection,
            self.host,
            self.port,
            process_request=self._check_request,
            compression=None,
            ping_interval=None,
            max_size=2**22,
        )
        self.port = self._listening.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every connection (1001) and the listening socket; wait for the handlers."""
        if self._relisten is not None:
            await asyncio.gather(self._relisten, return_exceptions=True)
        # A session told to stop reading would never see the close: let every one read again.
        self.stop_reading = False
        for session in self.sessions:
            session.stop_reading = False
        servers = [*self._retired, *([self._listening] if self._listening else [])]
        self._retired = []
        self._listening = None
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()

    @property
    def refuse(self) -> bool:
        """True while nothing listens on the port, so connections are refused (ECONNREFUSED)."""
        return self._listening is None

    @refuse.setter
    def refuse(self, value: bool) -> None:
        if value and self._listening is not None:
            # Close only the listening socket; sessions already open carry on.
            self._listening.server.close()
            self._retired.append(self._listening)
            self._listening = None
        elif not value and self._listening is None and self._relisten is None:
            self._relisten = asyncio.get_running_loop().create_task(self.listen_again())

    async def listen_again(self) -> None:
        """Listen on the same port again after ``refuse``."""
        try:
            if self._listening is None:
                await self._listen()
        finally:
            self._relisten = None

    @property
    def stop_reading(self) -> bool:
        return self._stop_reading

    @stop_reading.setter
    def stop_reading(self, value: bool) -> None:
        """Applies to every open session and to the sessions accepted from now on."""
        self._stop_reading = value
        for session in self.sessions:
            session.stop_reading = value

    async def next_session(self, timeout: float = 5.0) -> FakeSession:  # noqa: ASYNC109
        """The next accepted session, in order of arrival."""
        return await asyncio.wait_for(self._queue.get(), timeout)

    # ------------------------------------------------------------------ handshake
    def _reject(
        self, connection: ServerConnection, request: Request, status: int, reason: str
    ) -> Response:
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        self.rejected_handshakes.append(RejectedHandshake(request.path, headers, status, reason))
        return connection.respond(status, reason + "\n")

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != self.path:
            return self._reject(connection, request, 404, "no such path")
        if self.secret is None or not self.verify:
            return None
        timestamp = request.headers.get("X-Fonoster-Timestamp")
        signature = request.headers.get("X-Fonoster-Signature")
        if timestamp is None or signature is None:
            return self._reject(connection, request, 401, "missing signing headers")
        if not timestamp.isdigit():
            return self._reject(connection, request, 401, "timestamp is not Unix seconds")
        if abs(self.wall_clock() - int(timestamp)) > SIGNATURE_MAX_SKEW_S:
            return self._reject(connection, request, 401, "timestamp outside ±300 s")
        url = self.expected_url or f"ws://{self.host}:{self.port}{request.path}"
        expected = fonoster_signature(self.secret, timestamp, url)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            return self._reject(connection, request, 401, "signature mismatch")
        return None

    async def _on_connection(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        headers = {k.lower(): v for k, v in ws.request.headers.raw_items()}
        session = FakeSession(ws, ws.request.path, headers)
        session.stop_reading = self._stop_reading
        self.sessions.append(session)
        self._queue.put_nowait(session)
        handler_task = None
        if self.handler is not None:
            handler_task = asyncio.create_task(self._run_handler(self.handler, session))
        await session._read_loop()
        if handler_task is not None:
            # Give a scripted app a moment to notice the close, then stop it.
            await asyncio.wait({handler_task}, timeout=0.5)
            handler_task.cancel()
            await asyncio.gather(handler_task, return_exceptions=True)

    async def _run_handler(self, handler: SessionHandler, session: FakeSession) -> None:
        try:
            await handler(session)
        except (ConnectionClosed, ConnectionError):
            pass
        except Exception as exc:  # a scripted app's bug is reported, not raised into websockets
            session.handler_error = exc
            self.handler_errors.append(exc)
