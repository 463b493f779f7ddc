"""The benchmark's lean fonoster app: the session server of docs/protocol-session-v1.md, lean.

It plays the same part as :class:`appbridge.testing.fake_app.FakeApp` in the load generator
(bench/README.md, "Lean peers") and speaks the same wire: the gateway's WebSocket upgrade is
verified as docs/protocol-session-v1.md, "Connection and frames", says
(``X-Fonoster-Timestamp`` within 300 s, ``X-Fonoster-Signature`` = lowercase hex HMAC-SHA256
of ``<timestamp>.<url>``, compared in constant time; 401 otherwise, 404 for another path),
pings are answered (docs/protocol-session-v1.md), and a close is echoed (RFC 6455 §5.5.1).

What it saves per frame, at 50 caller frames a second per call: no task, future or queue per
frame (one ``data_received`` callback reads every frame in the segment), and the caller's
audio is not kept. Each binary frame records its arrival time, its track id byte and, for the
sessions that ask (SIP calls, whose inbound latency is read from loudness,
:func:`bench.measure.onset_latencies_flags_ms`), whether it is loud, in flat arrays. Text
frames (session.start, output events, marks: a few per second) are parsed and kept as the
fake does. The talking script (:class:`bench.talker.TalkingApp`) drives it through the same
``wait_for`` / ``send`` / ``send_binary`` / ``closed`` surface as a ``FakeSession``.

Receive stamps (bench/README.md, "Receive stamps"): the server is :mod:`bench.stamped`'s, so
each frame's arrival (``audio_times``, ``message_times``) is the instant the kernel queued it
on our socket, i.e. when the gateway wrote it, not when this busy loop read it; the loop's
own instant is kept beside it for caller audio (``audio_loop_times``) so the step can show
what the loop stamps would have said. On a transport without stamps (a test's) both are
``time.monotonic()`` at ``data_received``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import warnings
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from appbridge.testing.fake_app import SIGNATURE_MAX_SKEW_S, fonoster_signature
from bench.lean_peer import LeanPeer
from bench.measure import LOUD_SAMPLE
from bench.stamped import StampedServer, read_times, start_server
from bench.ws_lean import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameParser,
    HandshakeError,
    WsProtocolError,
    check_request,
    close_payload,
    encode_frame,
    http_error_response,
    parse_close,
    server_response,
    split_head,
)

__all__ = ["LeanApp", "LeanSession", "frame_is_loud", "verify_signature"]

SessionHandler = Callable[["LeanSession"], Awaitable[None]]


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:  # C speed (0.3 µs a frame); deprecated, but present on the project's Python 3.11
        import audioop as _audioop
    except ImportError:  # pragma: no cover - Python 3.13 and later
        _audioop = None  # type: ignore[assignment]


def frame_is_loud(frame: bytes) -> bool:
    """Whether a session binary frame (track byte + PCM16 LE) has a sample beyond
    :data:`bench.measure.LOUD_SAMPLE`: the same test as :func:`bench.measure.is_loud`."""
    if len(frame) < 3 or len(frame) % 2 == 0:
        return False
    if _audioop is not None and sys.byteorder == "little":
        return bool(_audioop.max(frame[1:], 2) > LOUD_SAMPLE)
    samples = np.frombuffer(frame, dtype="<i2", offset=1)
    return bool(samples.max() > LOUD_SAMPLE or samples.min() < -LOUD_SAMPLE)


def verify_signature(
    secret: str, url: str, headers: dict[str, str], now_s: float
) -> tuple[int, str] | None:
    """None when the upgrade is signed as docs/protocol-session-v1.md says, else (HTTP status,
    reason).

    ``headers`` have lowercase names; ``now_s`` is wall-clock Unix seconds.
    """
    timestamp = headers.get("x-fonoster-timestamp")
    signature = headers.get("x-fonoster-signature")
    if timestamp is None or signature is None:
        return 401, "missing signing headers"
    if not timestamp.isdigit():
        return 401, "timestamp is not Unix seconds"
    if abs(now_s - int(timestamp)) > SIGNATURE_MAX_SKEW_S:
        return 401, "timestamp outside 300 s"
    expected = fonoster_signature(secret, timestamp, url)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return 401, "signature mismatch"
    return None


class LeanSession(LeanPeer):
    """One session socket from the app's side (module doc); recordings in flat arrays."""

    def __init__(self, app: LeanApp) -> None:
        self.app = app
        self.path = ""
        self.headers: dict[str, str] = {}
        self.messages: list[dict[str, Any]] = []
        self.message_times: list[float] = []
        self.audio_times = array("d")  # the kernel's arrival stamp (module doc)
        self.audio_loop_times = array("d")  # when the loop read it (kept for comparison)
        self.audio_tracks = array("B")
        self.audio_loud = array("B")  # 1 loud; always 0 unless track_loudness
        self.track_loudness = False
        self.protocol_errors: list[str] = []
        self.close_code: int | None = None
        self._transport = None
        self._stamps = None
        self._loop_now = 0.0  # the current read's loop-time stamp
        self._head = bytearray()
        self._parser: FrameParser | None = None
        self._closed = False
        self._close_sent = False
        self._waiters: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []
        self._claimed: set[int] = set()
        self._handler: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    # -- asyncio.Protocol (connection_made, connection_lost: bench/lean_peer.py) -------------
    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            self._handshake(data)
            return
        now, self._loop_now = read_times(self._stamps)  # every frame of this read gets them
        try:
            frames = self._parser.feed(data)
        except WsProtocolError as exc:
            self.protocol_errors.append(str(exc))
            self._send_close(exc.code)
            self._abort()
            return
        for opcode, payload in frames:
            if opcode == OP_BINARY:
                self._on_binary(payload, now)
            elif opcode == OP_TEXT:
                self._on_text(payload, now)
            elif opcode == OP_PING:
                self._write(encode_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                self.close_code = parse_close(payload)[0]
                self._send_close(1000 if self.close_code == 1005 else self.close_code)
                self._abort()  # the server closes TCP first (RFC 6455 §7.1.1)
                return

    def _on_binary(self, payload: bytes, now: float) -> None:
        """A session audio frame (docs/protocol-session-v1.md): arrival, track id byte, loud or
        not."""
        self.audio_times.append(now)
        self.audio_loop_times.append(self._loop_now)
        self.audio_tracks.append(payload[0] if payload else 0)
        self.audio_loud.append(1 if self.track_loudness and frame_is_loud(payload) else 0)

    # -- handshake --------------------------------------------------------------------------
    def _handshake(self, data: bytes) -> None:
        self._head += data
        try:
            split = split_head(self._head)
            if split is None:
                return
            head, rest = split
            target, headers = check_request(head)
        except HandshakeError as exc:
            self._refuse(400, str(exc))
            return
        self.path, self.headers = target, headers
        app = self.app
        if target.split("?", 1)[0] != app.path:
            self._refuse(404, "no such path")
            return
        if app.secret is not None:
            refusal = verify_signature(app.secret, app.url_for(target), headers, time.time())
            if refusal is not None:
                self._refuse(*refusal)
                return
        self._write(server_response(headers["sec-websocket-key"]))
        self._parser = FrameParser(expect_masked=True)
        app.sessions.append(self)
        if app.handler is not None:
            self._handler = asyncio.get_running_loop().create_task(app.run_handler(self))
        if rest:
            self.data_received(rest)

    def _refuse(self, status: int, reason: str) -> None:
        self.app.rejected.append((status, reason))
        self._write(http_error_response(status, reason))
        self._abort()

    # -- messages ---------------------------------------------------------------------------
    def _on_text(self, payload: bytes, now: float) -> None:
        try:
            msg = json.loads(payload)
        except ValueError:
            self.protocol_errors.append(f"not JSON: {payload[:80]!r}")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            self.protocol_errors.append(f"not a message with a type: {payload[:80]!r}")
            return
        index = len(self.messages)
        self.messages.append(msg)
        self.message_times.append(now)
        if msg["type"] == "session.start":
            loud_if = self.app.loudness_if
            self.track_loudness = bool(loud_if is not None and loud_if(msg))
        for waiter in list(self._waiters):
            wanted, future = waiter
            if wanted == msg["type"] and index not in self._claimed and not future.done():
                self._claimed.add(index)
                future.set_result(msg)
                self._waiters.remove(waiter)
                break

    async def wait_for(self, msg_type: str, timeout: float = 2.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The first message of ``msg_type`` not returned before (FakeSession's contract)."""
        for index, msg in enumerate(self.messages):
            if index not in self._claimed and msg.get("type") == msg_type:
                self._claimed.add(index)
                return msg
        if self._closed:
            raise ConnectionError(f"session closed before a {msg_type!r}")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiter = (msg_type, future)
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def send(self, msg: dict[str, Any]) -> None:
        self._send_frame(OP_TEXT, json.dumps(msg, separators=(",", ":")).encode())

    async def send_binary(self, data: bytes) -> None:
        self._send_frame(OP_BINARY, data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket (docs/protocol-session-v1.md: an app closing its socket hangs up the
        call)."""
        self._send_close(code, reason)
        self._abort()

    # -- plumbing ---------------------------------------------------------------------------
    def _send_frame(self, opcode: int, payload: bytes) -> None:
        if self._closed or self._close_sent:
            raise ConnectionError("session closed")
        self._write(encode_frame(opcode, payload))

    def _send_close(self, code: int, reason: str = "") -> None:
        if not self._close_sent:
            self._close_sent = True
            self._write(encode_frame(OP_CLOSE, close_payload(code, reason)))

    def _set_closed(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(ConnectionError("session closed"))
        self._waiters.clear()


class LeanApp:
    """The session server on 127.0.0.1 (a free port), one :class:`LeanSession` per connection.

    ``handler`` runs once per accepted session (the talking script); ``loudness_if`` decides
    from ``session.start`` whether a session records each frame's loudness.
    """

    def __init__(self, *, secret: str | None, path: str = "/session", host: str = "127.0.0.1"):
        self.secret = secret
        self.path = path
        self.host = host
        self.port = 0
        self.handler: SessionHandler | None = None
        self.loudness_if: Callable[[dict[str, Any]], bool] | None = None
        self.sessions: list[LeanSession] = []
        self.rejected: list[tuple[int, str]] = []
        self.handler_errors: list[BaseException] = []
        self._server: StampedServer | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}{self.path}"

    def url_for(self, target: str) -> str:
        """The URL the gateway signed: ours with the request target (query included)."""
        return f"ws://{self.host}:{self.port}{target}"

    async def start(self) -> None:
        # Kernel-stamped sessions (module doc), not the loop's own transports.
        self._server = await start_server(self.new_session, self.host, self.port)
        self.port = self._server.port

    def new_session(self) -> LeanSession:
        """The protocol of one accepted connection (the Twilio-dialect app overrides it)."""
        return LeanSession(self)

    async def run_handler(self, session: LeanSession) -> None:
        assert self.handler is not None
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await self.handler(session)
        except (ConnectionError, TimeoutError, asyncio.CancelledError):
            pass
        except Exception as exc:  # a scripted app's bug is reported, not raised
            self.handler_errors.append(exc)
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def stop(self) -> None:
        """Close every session (1001, going away) and the listening socket."""
        for session in self.sessions:
            if not session.closed:
                await session.close(1001)
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
