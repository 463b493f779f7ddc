"""Twilio's side of one call's bidirectional Media Stream, played from outside the gateway.

When the voice webhook answers ``<Connect><Stream>``, Twilio opens a WebSocket to the gateway,
sends ``connected`` and ``start``, then 20 ms of caller µ-law per ``media`` message, and plays
back what the gateway sends, echoing each ``mark`` once the audio before it has played
(docs/protocol-twilio.md, "The messages"). :class:`TwilioStreamCall` does exactly that for
``appbridge call`` and, through :mod:`appbridge.testing.fake_twilio`, for the tests.

It speaks the wire format with json, base64 and hmac only, never through the gateway's own codecs
(``appbridge.protocol``/``appbridge.media``), so that a bug in those cannot be mirrored here and
pass unnoticed. Timing is real (this is the network's other end): media is paced on absolute
20 ms deadlines and playout runs at 8000 samples/s, like Twilio's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

__all__ = [
    "FRAME_BYTES",
    "FRAME_S",
    "ULAW_RATE_HZ",
    "Matcher",
    "TwilioStreamCall",
    "new_sid",
    "twilio_signature",
]

FRAME_BYTES = 160
FRAME_S = 0.020
ULAW_RATE_HZ = 8000
_SILENCE_FRAME = b"\xff" * FRAME_BYTES
#: Ticks later than this are not caught up on; the schedule restarts from now.
_RESYNC_LATE_S = 0.1
_DTMF_DIGITS = frozenset("0123456789*#ABCD")

Matcher = str | Callable[[dict[str, Any]], bool]


def twilio_signature(
    auth_token: str, url: str, params: Mapping[str, str | Iterable[str]] | None = None
) -> str:
    """X-Twilio-Signature: base64 HMAC-SHA1 over the URL then each name+value, names sorted and
    each name's values sorted, as Twilio signs its webhooks and the Media Stream upgrade."""
    parts = [url]
    for name in sorted(params or {}):
        value = (params or {})[name]
        values = [value] if isinstance(value, str) else list(value)
        parts.extend(name + v for v in sorted(values))
    digest = hmac.new(auth_token.encode(), "".join(parts).encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def new_sid(prefix: str) -> str:
    """A Twilio-style id: two-letter prefix plus 32 lowercase hex digits (``CA…``, ``MZ…``)."""
    return prefix + secrets.token_hex(16)


def _match(match: Matcher, key: str) -> Callable[[dict[str, Any]], bool]:
    if isinstance(match, str):
        return lambda msg: msg.get(key) == match
    return match


class TwilioStreamCall:
    """One call as Twilio sees it: the webhook's outcome and, when TwiML asked, the Media Stream.

    Caller audio is queued by :meth:`send_audio_ulaw` and sent by a sender task; gateway audio is
    buffered and played by a playout task that records :attr:`heard`. Marks are echoed when the
    audio before them has played and ``clear`` echoes all pending marks at once
    (docs/protocol-twilio.md, "The messages").
    """

    def __init__(
        self,
        *,
        call_sid: str,
        account_sid: str,
        from_: str,
        to: str,
        pace: bool = True,
        continuous_media: bool = False,
    ) -> None:
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.from_ = from_
        self.to = to
        self.direction = "inbound"
        self.pace = pace
        self.continuous_media = continuous_media
        # Webhook and TwiML.
        self.webhook_status = 0
        self.webhook_content_type = ""
        self.twiml = ""
        self.twiml_verbs: list[str] = []
        self.twiml_error: str | None = None
        self.stream_url: str | None = None
        self.params: dict[str, str] = {}
        # Stream.
        self.stream_sid: str | None = None
        self.stream_status: int | None = None
        self.stream_error: str | None = None
        self.status = "ringing"
        self.started_wall = time.time()
        self.ended_wall: float | None = None
        self.ended_by: str | None = None
        self.closed_by_gateway = False
        self.close_code: int | None = None
        self.updates: list[dict[str, str]] = []
        # Timelines (monotonic seconds).
        self.heard: list[tuple[float, bytes]] = []
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.sent: list[tuple[float, dict[str, Any]]] = []
        self.marks_echoed: list[str] = []
        self.marks_echoed_at: list[tuple[float, str]] = []
        self.clears_received = 0
        self.clear_times: list[float] = []
        self.protocol_errors: list[str] = []
        self._heard_audio_bytes: list[int] = []
        self._ws: ClientConnection | None = None
        self._seq = 0
        self._chunk = 0
        self._media_ms = 0
        self._last_ts_ms = 0
        self._t_start = 0.0
        self._send_lock = asyncio.Lock()
        self._audio_out = bytearray()
        self._audio_enqueued = 0
        self._audio_sent = 0
        self._events_out: deque[tuple[int, str, dict[str, Any]]] = deque()
        self._wake = asyncio.Event()
        self._playout = bytearray()
        self._pending_marks: list[list[Any]] = []
        self._changed = asyncio.Event()
        self._closed = asyncio.Event()
        self._claimed: set[int] = set()
        self._ending = False
        self._reader: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ state
    @property
    def has_stream(self) -> bool:
        """Whether the Media Stream was opened (TwiML held a Stream and the upgrade succeeded)."""
        return self._ws is not None

    @property
    def closed(self) -> bool:
        return self._ws is None or self._closed.is_set()

    def heard_ulaw(self) -> bytes:
        """Every byte of gateway audio that was played, in order, without the silent padding."""
        return b"".join(
            f[:n] for (_, f), n in zip(self.heard, self._heard_audio_bytes, strict=True)
        )

    def heard_frames(self) -> list[tuple[float, bytes, int]]:
        """(start time, 20 ms frame, bytes of it that were gateway audio) per playout tick."""
        return [(t, f, n) for (t, f), n in zip(self.heard, self._heard_audio_bytes, strict=True)]

    def silence_after(self, t: float) -> float | None:
        """The first moment ≥ ``t`` at which playout was silent (buffer empty), or None yet.

        Used to measure clear-to-silence (docs/protocol-session-v1.md, ``clear``).
        """
        for (start, _), n in zip(self.heard, self._heard_audio_bytes, strict=True):
            if start + FRAME_S <= t:
                continue
            if n < FRAME_BYTES:
                return max(start + n / ULAW_RATE_HZ, t)
        return None

    def first_audio_at(self) -> float | None:
        """When the first gateway audio started to play, or None."""
        for (start, _), n in zip(self.heard, self._heard_audio_bytes, strict=True):
            if n:
                return start
        return None

    async def wait_for(self, match: Matcher, timeout: float = 2.0) -> dict[str, Any]:  # noqa: ASYNC109
        """The first message from the gateway with ``event == match`` (or satisfying a predicate)
        not returned by an earlier call. Raises TimeoutError, or ConnectionError once closed."""
        pred = _match(match, "event")
        cursor = 0
        async with asyncio.timeout(timeout):
            while True:
                while cursor < len(self.received):
                    msg = self.received[cursor][1]
                    if cursor not in self._claimed and pred(msg):
                        self._claimed.add(cursor)
                        return msg
                    cursor += 1
                if self.closed:
                    raise ConnectionError(f"stream closed before a matching message ({match!r})")
                self._changed.clear()
                await self._changed.wait()

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 2.0) -> None:  # noqa: ASYNC109
        """Wait until ``condition()`` holds; re-checked on every message and playout tick."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()

    # ------------------------------------------------------------------ opening
    def _apply_twiml(self, body: bytes) -> None:
        self.twiml = body.decode("utf-8", errors="replace")
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            self.twiml_error = f"unparseable TwiML: {exc}"
            return
        if root.tag != "Response":
            self.twiml_error = f"root element is <{root.tag}>, not <Response>"
        self.twiml_verbs = [child.tag for child in root]
        stream = root.find("Connect/Stream")
        if stream is not None:
            self.stream_url = stream.get("url")
            for param in stream.findall("Parameter"):
                self.params[param.get("name", "")] = param.get("value", "")

    async def _open_stream(self, dial_url: str, auth_token: str | None) -> None:
        assert self.stream_url is not None
        headers: dict[str, str] = {}
        if auth_token is not None:
            # The upgrade is signed over the URL as written in the TwiML, with empty params.
            headers["x-twilio-signature"] = twilio_signature(auth_token, self.stream_url, {})
        try:
            ws = await connect(
                dial_url,
                additional_headers=headers,
                proxy=None,
                compression=None,
                ping_interval=None,
                open_timeout=10,
                max_size=2**22,
            )
        except InvalidStatus as exc:
            self.stream_status = exc.response.status_code
            self.stream_error = str(exc)
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            self.stream_error = f"{type(exc).__name__}: {exc}"
        else:
            self._ws = ws
        if self._ws is None:
            self.status = "completed"
            self.ended_wall = time.time()
            return
        self.stream_sid = new_sid("MZ")
        self.status = "in-progress"
        await self._send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        self._t_start = time.monotonic()
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": dict(self.params),
        }
        await self._send_sequenced("start", start)
        self._reader = asyncio.create_task(
            self._reader_loop(), name=f"twilio-reader-{self.call_sid}"
        )
        self._workers = [
            asyncio.create_task(self._sender_loop(), name=f"twilio-sender-{self.call_sid}"),
            asyncio.create_task(self._playout_loop(), name=f"twilio-playout-{self.call_sid}"),
        ]

    # ------------------------------------------------------------------ sending
    async def _send_json(self, msg: dict[str, Any]) -> None:
        assert self._ws is not None
        self.sent.append((time.monotonic(), msg))
        await self._ws.send(json.dumps(msg, separators=(",", ":")))

    async def _send_sequenced(self, event: str, body: Any) -> None:
        """Send a message with the next sequenceNumber ("1" is ``start``), in order of numbering."""
        async with self._send_lock:
            self._seq += 1
            msg = {"event": event, "sequenceNumber": str(self._seq), event: body}
            msg["streamSid"] = self.stream_sid
            await self._send_json(msg)

    async def send_audio_ulaw(self, data: bytes) -> None:
        """Queue caller audio (µ-law 8 kHz); it leaves as 160-byte ``media`` messages."""
        self._require_stream()
        self._audio_out += data
        self._audio_enqueued += len(data)
        self._wake.set()

    async def send_silence(self, ms: int) -> None:
        await self.send_audio_ulaw(b"\xff" * (8 * ms))

    async def send_dtmf(self, digit: str) -> None:
        """Queue a keypress; it leaves after the audio queued before it."""
        self._require_stream()
        if digit not in _DTMF_DIGITS:
            raise ValueError(f"not a DTMF digit: {digit!r}")
        body = {"track": "inbound_track", "digit": digit}
        self._events_out.append((self._audio_enqueued, "dtmf", body))
        self._wake.set()

    async def send_raw(self, text: str | bytes) -> None:
        """Send a frame as is, now, outside the numbering (for bad-input tests)."""
        self._require_stream()
        assert self._ws is not None
        await self._ws.send(text)

    def _require_stream(self) -> None:
        if self._ws is None:
            raise ConnectionError(f"call {self.call_sid} has no media stream ({self.twiml_verbs})")

    async def drain(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until every queued caller audio byte and event has been sent."""
        await self.wait_until(
            lambda: self.closed or (not self._audio_out and not self._events_out), timeout
        )

    async def _send_due_events(self) -> None:
        while self._events_out and self._events_out[0][0] <= self._audio_sent:
            _, event, body = self._events_out.popleft()
            await self._send_sequenced(event, body)
        if not self._audio_out and not self._events_out:
            self._notify()

    def _take_frame(self) -> bytes:
        limit = FRAME_BYTES
        if self._events_out:
            limit = max(1, min(limit, self._events_out[0][0] - self._audio_sent))
        chunk = bytes(self._audio_out[:limit])
        del self._audio_out[:limit]
        self._audio_sent += len(chunk)
        return chunk + _SILENCE_FRAME[len(chunk) :]

    async def _send_media(self, frame: bytes, slot_s: float) -> None:
        self._chunk += 1
        if self.pace:
            ts_ms = max(round((slot_s - self._t_start) * 1000), self._last_ts_ms)
        else:
            ts_ms = self._media_ms
            self._media_ms += 20
        self._last_ts_ms = ts_ms
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str(ts_ms),
            "payload": base64.b64encode(frame).decode("ascii"),
        }
        await self._send_sequenced("media", media)

    async def _sender_loop(self) -> None:
        """Caller audio on absolute 20 ms deadlines (``next += 0.020``), or unpaced."""
        next_s = time.monotonic()
        continuous = self.continuous_media and self.pace  # unpaced silence would never end
        try:
            while True:
                await self._send_due_events()
                if not self._audio_out and not self._events_out and not continuous:
                    self._wake.clear()
                    await self._wake.wait()
                    next_s = max(next_s, time.monotonic())
                    continue
                if self.pace:
                    delay_s = next_s - time.monotonic()
                    if delay_s > 0:
                        await asyncio.sleep(delay_s)
                    elif delay_s < -_RESYNC_LATE_S:
                        next_s = time.monotonic()
                    await self._send_due_events()
                if not self._audio_out and not continuous:
                    continue
                await self._send_media(self._take_frame(), next_s)
                next_s += FRAME_S
        except ConnectionClosed:
            return

    # ------------------------------------------------------------------ playout
    async def _playout_loop(self) -> None:
        """Gateway audio played at 8000 samples/s: a 20 ms frame per tick, absolute deadlines."""
        next_s = time.monotonic()
        try:
            while True:
                delay_s = next_s - time.monotonic()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                now = time.monotonic()
                if now - next_s > _RESYNC_LATE_S:
                    next_s = now
                await self._echo_played_marks()
                frame = bytes(self._playout[:FRAME_BYTES])
                del self._playout[:FRAME_BYTES]
                for mark in self._pending_marks:
                    mark[1] -= len(frame)
                if frame:
                    self.heard.append((now, frame + _SILENCE_FRAME[len(frame) :]))
                else:
                    self.heard.append((now, _SILENCE_FRAME))
                self._heard_audio_bytes.append(len(frame))
                self._notify()
                next_s += FRAME_S
        except ConnectionClosed:
            return

    async def _echo_played_marks(self) -> None:
        while self._pending_marks and self._pending_marks[0][1] <= 0:
            name = self._pending_marks.pop(0)[0]
            await self._echo_mark(name)

    async def _echo_mark(self, name: str) -> None:
        self.marks_echoed.append(name)
        self.marks_echoed_at.append((time.monotonic(), name))
        await self._send_sequenced("mark", {"name": name})

    async def _on_clear(self, now: float) -> None:
        self._playout.clear()
        pending = [m[0] for m in self._pending_marks]
        self._pending_marks.clear()
        if self.heard and self._heard_audio_bytes[-1]:
            # Cut the frame that is playing at this instant: Twilio stops output at once.
            start, frame = self.heard[-1]
            played = max(0, int((now - start) * ULAW_RATE_HZ))
            if played < self._heard_audio_bytes[-1]:
                self.heard[-1] = (start, frame[:played] + _SILENCE_FRAME[played:])
                self._heard_audio_bytes[-1] = played
        self.clears_received += 1
        self.clear_times.append(now)
        for name in pending:
            await self._echo_mark(name)

    # ------------------------------------------------------------------ reading
    async def _reader_loop(self) -> None:
        assert self._ws is not None
        try:
            async for raw in self._ws:
                now = time.monotonic()
                if isinstance(raw, bytes):
                    self.protocol_errors.append(f"binary frame of {len(raw)} bytes")
                    continue
                try:
                    msg = json.loads(raw)
                except ValueError:
                    self.protocol_errors.append(f"not JSON: {raw[:80]!r}")
                    continue
                if not isinstance(msg, dict):
                    self.protocol_errors.append(f"not a JSON object: {raw[:80]!r}")
                    continue
                self.received.append((now, msg))
                await self._handle(msg, now)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            await self._on_closed()

    async def _handle(self, msg: dict[str, Any], now: float) -> None:
        event = msg.get("event")
        if event not in ("media", "mark", "clear"):
            self.protocol_errors.append(f"unsupported event {event!r} (Twilio error 31924)")
            return
        if msg.get("streamSid") != self.stream_sid:
            self.protocol_errors.append(f"{event}: streamSid {msg.get('streamSid')!r} is not ours")
            return
        if event == "clear":
            await self._on_clear(now)
            return
        body = msg.get(event)
        if not isinstance(body, dict):
            self.protocol_errors.append(f"{event}: missing {event!r} object")
        elif event == "media":
            payload = body.get("payload")
            try:
                audio = (
                    base64.b64decode(payload, validate=True) if isinstance(payload, str) else None
                )
            except binascii.Error:
                audio = None
            if audio is None:
                self.protocol_errors.append("media: payload is not base64")
            else:
                self._playout += audio
        elif isinstance(body.get("name"), str):
            self._pending_marks.append([body["name"], len(self._playout)])
        else:
            self.protocol_errors.append("mark: missing name")

    async def _on_closed(self) -> None:
        ws = self._ws
        assert ws is not None
        self.close_code = ws.close_code
        if not self._ending:
            self.closed_by_gateway = True
            self.ended_by = "gateway"
        if self.ended_by != "transfer":  # a transferred call lives on in <Dial>
            self.status = "completed"
            self.ended_wall = time.time()
        for task in self._workers:
            task.cancel()
        self._closed.set()
        self._notify()

    # ------------------------------------------------------------------ ending
    async def hangup(self) -> None:
        """The caller hangs up: Twilio sends ``stop`` and closes the stream."""
        await self._end_stream("caller")

    async def _end_stream(self, by: str) -> None:
        if self._ws is None or self._closed.is_set():
            return
        if self._ending:
            await self._closed.wait()
            return
        self._ending = True
        self.ended_by = by
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        try:
            await self._send_sequenced(
                "stop", {"accountSid": self.account_sid, "callSid": self.call_sid}
            )
        except ConnectionClosed:
            pass
        await self._ws.close(1000)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def wait_closed(self, timeout: float = 5.0) -> int | None:  # noqa: ASYNC109
        """Wait until the stream is closed (by either side); returns the close code."""
        if self._ws is None:
            return None
        await asyncio.wait_for(self._closed.wait(), timeout)
        return self.close_code

    async def aclose(self) -> None:
        """Hang up if still live and wait for the tasks, so no task outlives a test."""
        await self._end_stream("caller")
        tasks = [*self._workers, *([self._reader] if self._reader else [])]
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
