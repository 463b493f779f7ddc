"""The benchmark's lean Twilio callers: the caller's leg of docs/protocol-twilio.md, lean.

They are the load generator's Twilio callers (bench/README.md, "Lean peers") and put the
traffic of :class:`appbridge.testing.fake_twilio.FakeTwilioCall` with ``continuous_media=True``
on the wire:

* the voice webhook: a form POST to ``/twilio/voice`` with Twilio's fields, signed with
  ``X-Twilio-Signature`` (:func:`appbridge.testing.fake_twilio.twilio_signature`); the TwiML
  answer is parsed for ``<Connect><Stream url>`` and its ``<Parameter>``s;
* the Media Stream: a WebSocket upgrade signed over the TwiML's stream URL (empty params),
  then ``connected``, ``start`` (sequenceNumber "1"), one ``media`` message of 160 µ-law bytes
  every 20 ms (``sequenceNumber``, ``chunk`` and ``timestamp`` as strings; silence when the
  caller is not talking), ``mark`` echoes once the audio queued before a mark has played, every
  pending mark at once on ``clear``, and ``stop`` then a close at hang-up.

The saving (about half of the project's test peers' CPU per call): one :class:`TwilioTicker` for
every caller of a worker instead of two tasks per call, spread over ``slots`` phases of the
20 ms period so the gateway still sees the callers' frames spread in time; each media message is
one f-string around a base64 payload encoded once per distinct frame (the caller's audio is
periodic); frames are written straight to the transport (:mod:`bench.ws_lean`); what the gateway
sends is parsed with msgspec into a typed struct and only arrival times and byte counts are
recorded, in flat arrays. Playout is simulated at 8000 samples/s, one 20 ms frame per tick, as
the fake does.

Receive stamps (bench/README.md, "Receive stamps"): the stream runs on a
:mod:`bench.stamped` transport, so a ``media``, ``mark`` or ``clear`` arrives at the instant
the kernel queued it on our socket (the gateway's write), not when this busy loop read it:
caller jitter, clear-to-silence and the frames' arrivals measure the gateway, not the
generator. The loop's instant of each ``media`` is kept too (``recv_loop_times``), for the
step's loop-stamped jitter.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
import xml.etree.ElementTree as ET
from array import array
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httpx
import msgspec

from appbridge.testing.fake_twilio import (
    FakeTwilioCall,
    FakeTwilioRest,
    new_sid,
    twilio_signature,
    voice_webhook_form,
)
from bench.lean_peer import LeanPeer
from bench.stamped import open_connection, read_times
from bench.ticker import PhasedTicker
from bench.ws_lean import (
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameParser,
    HandshakeError,
    MaskPool,
    WsProtocolError,
    check_response,
    client_request,
    close_payload,
    encode_frame,
    parse_close,
    split_head,
)

__all__ = ["LeanTwilio", "LeanTwilioCall", "MediaPayloads", "TwilioTicker", "parse_twiml"]

FRAME_S = 0.020
FRAME_BYTES = 160
ULAW_RATE_HZ = 8000
ULAW_SILENCE = b"\xff" * FRAME_BYTES


class _Media(msgspec.Struct):
    payload: str | None = None


class _Mark(msgspec.Struct):
    name: str | None = None


class _Inbound(msgspec.Struct):
    """A message from the gateway (docs/protocol-twilio.md, "The messages"); unknown fields
    ignored."""

    event: str | None = None
    streamSid: str | None = None
    media: _Media | None = None
    mark: _Mark | None = None


_decode = msgspec.json.Decoder(_Inbound).decode


def parse_twiml(body: bytes) -> tuple[list[str], str | None, dict[str, str], str | None]:
    """(verbs, stream URL, stream parameters, error) of a TwiML answer."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        return [], None, {}, f"unparseable TwiML: {exc}"
    error = None if root.tag == "Response" else f"root element is <{root.tag}>"
    verbs = [child.tag for child in root]
    stream = root.find("Connect/Stream")
    if stream is None:
        return verbs, None, {}, error
    params = {p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter")}
    return verbs, stream.get("url"), params, error


class MediaPayloads:
    """base64 of each distinct 160-byte frame, encoded once (the caller's voice repeats)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, str] = {}
        self.silence = self.of(ULAW_SILENCE)

    def of(self, frame: bytes) -> str:
        text = self._cache.get(frame)
        if text is None:
            text = base64.b64encode(frame).decode("ascii")
            self._cache[frame] = text
        return text

    def frames(self, ulaw: bytes) -> list[str]:
        """The base64 payload of each 20 ms frame of ``ulaw``, the last padded with silence."""
        out = []
        for at in range(0, len(ulaw), FRAME_BYTES):
            frame = ulaw[at : at + FRAME_BYTES]
            out.append(self.of(frame + ULAW_SILENCE[len(frame) :]))
        return out


class LeanTwilioCall(LeanPeer):
    """One caller's Media Stream (module doc); duck-types the views :mod:`bench.analysis` reads."""

    def __init__(self, twilio: LeanTwilio, call_sid: str, from_: str, to: str) -> None:
        self.twilio = twilio
        self.call_sid = call_sid
        self.from_ = from_
        self.to = to
        # The Call resource's fields, for the fake REST API (FakeTwilioRest.resource).
        self.direction = "inbound"
        self.status = "in-progress"
        self.started_wall = time.time()
        self.ended_wall: float | None = None
        self.updates: list[dict[str, str]] = []
        self.ended_by: str | None = None
        self.webhook_status = 0
        self.twiml_verbs: list[str] = []
        self.stream_url: str | None = None
        self.params: dict[str, str] = {}
        self.stream_sid = new_sid("MZ")
        self.stream_error: str | None = None
        self.has_stream = False
        self.closed = False
        self.closed_by_gateway = False
        self.close_code: int | None = None
        self.protocol_errors: list[str] = []
        # Recordings (monotonic seconds), flat.
        self.sent_times = array("d")
        self.recv_times = array("d")  # each media message from the gateway (kernel stamp)
        self.recv_loop_times = array("d")  # the same, when the loop read it
        self.recv_bytes = array("H")  # its decoded payload length
        self.heard_times = array("d")  # each playout tick
        self.heard_bytes = array("H")  # bytes of gateway audio in it
        self.clear_times: list[float] = []
        self.marks_echoed: list[str] = []
        # Media out.
        self._seq = 0
        self._chunk = 0
        self._t_start = 0.0
        self._last_ts_ms = 0
        self._talk: list[str] = []
        self._talk_at = 0
        self._suffix = ""  # the end of every media message: '"},"streamSid":"MZ…"}'
        # Playout.
        self._playout_bytes = 0
        self._pending_marks: list[list[object]] = []  # [name, bytes still ahead of it]
        # Socket.
        self._transport = None
        self._stamps = None
        self._loop_now = 0.0  # the current read's loop-time stamp
        self._head = bytearray()
        self._key = ""
        self._parser = FrameParser(expect_masked=False)
        self._opened: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._masks = twilio.masks

    @property
    def account_sid(self) -> str:
        return self.twilio.account_sid

    async def _end_stream(self, by: str) -> None:
        """Twilio ends the stream after a REST update (the gateway's hang-up): ``stop``, then
        the close, as :class:`~appbridge.testing.FakeTwilioCall` does."""
        self.ended_by = by
        await self.hangup()

    # -- what bench.analysis reads (the SipCaller views) ------------------------------------
    def media_arrivals(self) -> list[tuple[float, int]]:
        """(arrival, decoded payload bytes) of each ``media`` message from the gateway."""
        return list(zip(self.recv_times, self.recv_bytes, strict=True))

    def sent_media_times(self) -> list[float]:
        return list(self.sent_times)

    def heard_frames(self) -> list[tuple[float, bytes, int]]:
        """(tick start, -, gateway audio bytes) per playout tick."""
        return [(t, b"", n) for t, n in zip(self.heard_times, self.heard_bytes, strict=True)]

    def silence_after(self, t: float) -> float | None:
        """The first moment ≥ ``t`` at which playout was silent (as the fake's)."""
        for start, n in zip(self.heard_times, self.heard_bytes, strict=True):
            if start + FRAME_S <= t:
                continue
            if n < FRAME_BYTES:
                return max(start + n / ULAW_RATE_HZ, t)
        return None

    # -- opening ----------------------------------------------------------------------------
    async def open_stream(self, host: str, port: int, target: str, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        assert self.stream_url is not None
        headers = {"x-twilio-signature": twilio_signature(self.twilio.auth_token, self.stream_url)}
        request, self._key = client_request(host, port, target, headers)
        self._opened = loop.create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await open_connection(lambda: self, host, port)  # kernel-stamped reads
                assert self._transport is not None
                self._transport.write(request)
                await self._opened
        except (OSError, HandshakeError, TimeoutError) as exc:
            self.stream_error = f"{type(exc).__name__}: {exc}"
            self._abort()
            return
        self.has_stream = True
        self._t_start = time.monotonic()
        self._suffix = '"},"streamSid":"' + self.stream_sid + '"}'
        self._send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        start = {
            "accountSid": self.twilio.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": dict(self.params),
        }
        self._send_sequenced("start", start)
        self.twilio.ticker.add(self)

    # -- asyncio.Protocol (connection_made, connection_lost: bench/lean_peer.py) -------------
    def data_received(self, data: bytes) -> None:
        if not self.has_stream and self._opened is not None and not self._opened.done():
            self._head += data
            try:
                split = split_head(self._head)
                if split is None:
                    return
                head, data = split
                check_response(head, self._key)
            except HandshakeError as exc:
                self._opened.set_exception(exc)
                return
            self._opened.set_result(None)
            if not data:
                return
        now, self._loop_now = read_times(self._stamps)  # every message of this read gets them
        try:
            frames = self._parser.feed(data)
        except WsProtocolError as exc:
            self.protocol_errors.append(str(exc))
            self._abort()
            return
        for opcode, payload in frames:
            if opcode == OP_TEXT:
                self._on_message(payload, now)
            elif opcode == OP_PING:
                self._write(encode_frame(OP_PONG, payload, self._masks.next()))
            elif opcode == OP_CLOSE:
                self.close_code = parse_close(payload)[0]
                if not self._ending:
                    self.closed_by_gateway = True
                    code = 1000 if self.close_code == 1005 else self.close_code
                    self._write(encode_frame(OP_CLOSE, close_payload(code), self._masks.next()))
                self._ending = True
            elif opcode != OP_PONG:
                self.protocol_errors.append(f"binary frame of {len(payload)} bytes")

    _ending = False

    # -- the gateway's messages -------------------------------------------------------------
    def _on_message(self, raw: bytes, now: float) -> None:
        try:
            msg = _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.protocol_errors.append(f"not a Twilio message: {raw[:80]!r}")
            return
        event = msg.event
        if event not in ("media", "mark", "clear"):
            self.protocol_errors.append(f"unsupported event {event!r} (Twilio error 31924)")
            return
        if msg.streamSid != self.stream_sid:
            self.protocol_errors.append(f"{event}: streamSid {msg.streamSid!r} is not ours")
            return
        if event == "media":
            payload = msg.media.payload if msg.media is not None else None
            try:
                n = len(binascii.a2b_base64(payload, strict_mode=True)) if payload else -1
            except binascii.Error:
                n = -1
            if n < 0:
                self.protocol_errors.append("media: payload is not base64")
                return
            self.recv_times.append(now)
            self.recv_loop_times.append(self._loop_now)
            self.recv_bytes.append(n)
            self._playout_bytes += n
        elif event == "mark":
            name = msg.mark.name if msg.mark is not None else None
            if name is None:
                self.protocol_errors.append("mark: missing name")
            else:
                self._pending_marks.append([name, self._playout_bytes])
        else:
            self._on_clear(now)

    def _on_clear(self, now: float) -> None:
        self._playout_bytes = 0
        pending = [str(m[0]) for m in self._pending_marks]
        self._pending_marks.clear()
        times, sizes = self.heard_times, self.heard_bytes
        # ``now`` is the kernel's arrival: playout ticks that ran after it, before the loop read
        # the clear, would have been silent had it been read at once.
        at = len(times) - 1
        while at >= 0 and times[at] > now:
            sizes[at] = 0
            at -= 1
        if at >= 0 and sizes[at]:
            # Cut the frame playing at this instant: Twilio stops output at once.
            # (the epsilon: a difference of two monotonic stamps is not exact, 0.005 s can come
            # out as 39.9999 samples)
            played = max(0, int((now - times[at]) * ULAW_RATE_HZ + 1e-6))
            if played < sizes[at]:
                sizes[at] = played
        self.clear_times.append(now)
        for name in pending:
            self._echo_mark(name)

    def _echo_mark(self, name: str) -> None:
        self.marks_echoed.append(name)
        self._send_sequenced("mark", {"name": name})

    # -- the ticker's work ------------------------------------------------------------------
    def talk(self, ulaw: bytes) -> None:
        """Speak ``ulaw`` from the next tick on (after what is still being said); then silence."""
        self._talk = self._talk[self._talk_at :] + self.twilio.payloads.frames(ulaw)
        self._talk_at = 0

    def tick(self, slot_s: float) -> None:
        """This 20 ms slot: one ``media`` message out, then one frame of playout."""
        if self.closed or self._ending or self._transport is None:
            return
        talk = self._talk
        if self._talk_at < len(talk):
            payload = talk[self._talk_at]
            self._talk_at += 1
            if self._talk_at >= len(talk):
                self._talk, self._talk_at = [], 0
        else:
            payload = self.twilio.payloads.silence
        ts_ms = max(round((slot_s - self._t_start) * 1000), self._last_ts_ms)
        self._last_ts_ms = ts_ms
        self._seq += 1
        self._chunk += 1
        # Twilio's own field order (docs/protocol-twilio.md): event, sequenceNumber, media,
        # streamSid.
        text = (
            f'{{"event":"media","sequenceNumber":"{self._seq}","media":{{"track":"inbound",'
            f'"chunk":"{self._chunk}","timestamp":"{ts_ms}","payload":"{payload}{self._suffix}'
        )
        frame = encode_frame(OP_TEXT, text.encode(), self._masks.next())
        self.sent_times.append(time.monotonic())
        self._transport.write(frame)
        self._play(time.monotonic())

    def _play(self, now: float) -> None:
        marks = self._pending_marks
        while marks and int(marks[0][1]) <= 0:  # type: ignore[call-overload]
            self._echo_mark(str(marks.pop(0)[0]))
        n = min(FRAME_BYTES, self._playout_bytes)
        self._playout_bytes -= n
        for mark in marks:
            mark[1] = int(mark[1]) - n  # type: ignore[call-overload]
        self.heard_times.append(now)
        self.heard_bytes.append(n)

    # -- sending ----------------------------------------------------------------------------
    def _send_json(self, msg: dict[str, object]) -> None:
        text = json.dumps(msg, separators=(",", ":"))
        self._write(encode_frame(OP_TEXT, text.encode(), self._masks.next()))

    def _send_sequenced(self, event: str, body: object) -> None:
        self._seq += 1
        seq = str(self._seq)
        self._send_json(
            {"event": event, "sequenceNumber": seq, event: body, "streamSid": self.stream_sid}
        )

    # -- ending -----------------------------------------------------------------------------
    async def hangup(self, timeout_s: float = 5.0) -> None:
        """The caller hangs up: ``stop``, a close (1000), and wait for the gateway's close."""
        if self.closed:
            return
        self.twilio.ticker.discard(self)
        if not self._ending:
            self._ending = True
            stop = {"accountSid": self.twilio.account_sid, "callSid": self.call_sid}
            self._send_sequenced("stop", stop)
            self._write(encode_frame(OP_CLOSE, close_payload(1000), self._masks.next()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), timeout_s)
        self._abort()

    def _set_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.status = "completed"
        if self.ended_wall is None:
            self.ended_wall = time.time()
        self.twilio.ticker.discard(self)
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(ConnectionError("closed during the handshake"))
        if not self._done.done():
            self._done.set_result(None)


class TwilioTicker(PhasedTicker["LeanTwilioCall"]):
    """Every lean caller's 20 ms tick from one task, in ``slots`` phases (bench/ticker.py)."""

    def __init__(self, *, slots: int = 4, autostart: bool = True) -> None:
        super().__init__(lambda call: call.call_sid, slots=slots, autostart=autostart)


class LeanTwilio:
    """Twilio placing inbound calls on the gateway (the lean :class:`FakeTwilio`)."""

    def __init__(
        self,
        gateway_base_url: str,
        *,
        account_sid: str,
        auth_token: str,
        client: httpx.AsyncClient,
        slots: int = 4,
        rest: FakeTwilioRest | None = None,
    ) -> None:
        """``rest``: the fake REST API the gateway's hang-ups reach, when it runs in this
        process: each call is known to it, as Twilio knows its calls, finished ones included
        (without it the gateway's hang-up is answered 404 and the gateway closes the stream)."""
        self.rest = rest
        self.gateway_base_url = gateway_base_url.rstrip("/")
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.client = client
        self.ticker = TwilioTicker(slots=slots)
        self.payloads = MediaPayloads()
        self.masks = MaskPool()
        self.calls: list[LeanTwilioCall] = []

    async def place_call(
        self, from_: str, to: str, extra_params: Mapping[str, str] | None = None
    ) -> LeanTwilioCall:
        """POST the signed voice webhook and open the stream its TwiML names."""
        call = LeanTwilioCall(self, new_sid("CA"), from_, to)
        self.calls.append(call)
        if self.rest is not None:
            self.rest.register(cast(FakeTwilioCall, call))  # duck-typed: the fields it reads
        form = voice_webhook_form(call.call_sid, self.account_sid, from_, to, extra_params)
        url = self.gateway_base_url + "/twilio/voice"
        headers = {
            "User-Agent": "TwilioProxy/1.1",
            "X-Twilio-Signature": twilio_signature(self.auth_token, url, form),
        }
        response = await self.client.post(url, data=form, headers=headers)
        call.webhook_status = response.status_code
        call.twiml_verbs, call.stream_url, call.params, error = parse_twiml(response.content)
        if error is not None:
            call.stream_error = error
        if response.status_code != 200 or not call.stream_url:
            call.closed = True
            return call
        gateway = urlsplit(self.gateway_base_url)
        stream = urlsplit(call.stream_url)
        target = stream.path + (f"?{stream.query}" if stream.query else "")
        await call.open_stream(gateway.hostname or "127.0.0.1", gateway.port or 80, target, 10.0)
        return call

    async def aclose(self) -> None:
        await self.ticker.stop()
        await asyncio.gather(*(c.hangup() for c in self.calls), return_exceptions=True)
