"""The benchmark's Twilio-dialect app: a Pipecat-style Media Streams app at low cost.

The Twilio dialect is measured alone, against Pipecat-style apps sending at 2x real time. With
``--dialect twilio`` the gateway's apps are ``protocol = "twilio"`` apps
(docs/protocol-twilio.md) and this module plays them (bench/README.md, "The Twilio dialect"):

* **The wire** (docs/protocol-twilio.md). The gateway plays Twilio:
  ``connected``, then ``start`` (``streamSid`` = sessionRef, ``callSid`` = callRef,
  ``accountSid`` = the app's ``workspace_ref``, µ-law 8 kHz, track inbound), then ``media``
  (base64 µ-law of the caller, ``track`` inbound), ``dtmf``, ``mark`` echoes and ``stop``, all
  JSON text frames with string counters. :class:`TwilioAppSession` checks each one
  (:meth:`TwilioAppSession.check_message`: order, ``sequenceNumber`` and ``chunk`` counting up
  by one, our ``streamSid``, the start's fields, base64 payloads) and records problems in
  ``protocol_errors``. The app sends what Pipecat's ``TwilioFrameSerializer`` sends:
  ``{"event":"media","streamSid":…,"media":{"payload":…}}`` and ``clear``, plus a ``mark``
  after each burst (Pipecat sends none; the benchmark needs one to check the echoes).
* **The upgrade** is signed as for a fonoster app: ``appbridge/apps/link.py`` ``dial`` adds
  ``X-Fonoster-Timestamp`` and ``X-Fonoster-Signature`` whenever the app has a
  ``signing_secret``, whatever its protocol, and the session refuses a bad one (401) exactly as
  :class:`bench.lean_app.LeanSession` does.
* **The script** (:class:`BurstPacer`): every 5 s per call from a random phase, a burst of 2 s
  of a 600 Hz tone as 100 ``media`` messages of 20 ms sent one every 10 ms (2x real time, as
  Pipecat paces its output with a sleep per chunk: the burst is sent in 1 s), then a ``mark``.
  Every other burst is interrupted 300 ms in: the app sends a ``mark`` (after the 30 chunks it
  sent) and then ``clear``, and sends no more of that burst, as Pipecat does on an
  interruption; the gateway must echo that mark on the clear.
* **The cost**: one :class:`AppTicker` task per worker paces every session (10 ms period, a
  heap of the sessions waiting for their next burst, a list of those bursting), never a task
  per burst or per session; base64 of the tone's 100 chunks is computed once per worker; the
  caller's media messages are recorded as arrival instants in the flat arrays
  :mod:`bench.analysis` reads for fonoster sessions (``audio_times``/``audio_tracks``, track 1).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from appbridge.testing import audio as au
from bench.lean_app import LeanApp, LeanSession
from bench.talker import AppScript, Burst
from bench.ticker import DeadlineTask, run_on_deadlines
from bench.ws_lean import OP_TEXT

__all__ = [
    "AppTicker",
    "BurstPacer",
    "PipecatPlan",
    "TwilioAppSession",
    "TwilioDialectApp",
    "tone_payloads",
]

ULAW_RATE_HZ = 8000
CHUNK_MS = 20
CHUNK_BYTES = ULAW_RATE_HZ * CHUNK_MS // 1000
APP_TONE_HZ = 600.0
INBOUND_TRACK_ID = 1  # what bench.analysis reads as the caller's track


@dataclass(frozen=True)
class PipecatPlan:
    """The app's script (bench/README.md): a 2 s burst every 5 s, a clear 300 ms into every
    other."""

    period_s: float = 5.0
    burst_chunks: int = 100  # 2 s of 20 ms chunks
    chunk_interval_s: float = 0.010  # 2x real time
    clear_after_s: float = 0.3

    @property
    def burst_ms(self) -> int:
        return self.burst_chunks * CHUNK_MS


def burst_is_cleared(index: int) -> bool:
    """Every other burst is interrupted (the fonoster mix's rule, bench/talker.py)."""
    return index % 2 == 1


class BurstPacer:
    """One session's schedule, pure: :meth:`step` is called once per ticker tick.

    It returns what the app sends at ``now``, in order: ``("burst", i)`` when burst ``i``
    begins, ``("media", k)`` for chunk ``k`` (one per tick: a late tick delays the rest, as a
    sleep per chunk does), ``("mark", i)`` after the last chunk, or ``("mark", i)`` then
    ``("clear", i)`` once ``clear_after_s`` has passed in a cleared burst (its remaining chunks
    are dropped). The next burst is due ``period_s`` after this one's start; one that fell
    further behind than a period starts a period from now instead of piling up.
    """

    def __init__(self, plan: PipecatPlan, first_at: float) -> None:
        self.plan = plan
        self.next_at = first_at
        self.index = -1
        self.bursting = False
        self.burst_at = 0.0
        self.sent = 0

    def step(self, now: float) -> list[tuple[str, int]]:
        plan = self.plan
        out: list[tuple[str, int]] = []
        if not self.bursting:
            if now < self.next_at:
                return out
            self.index += 1
            self.bursting = True
            self.burst_at = now
            self.sent = 0
            out.append(("burst", self.index))
        # (1 µs of slack: ticks at k * 10 ms must not miss 300 ms to a rounding error.)
        if burst_is_cleared(self.index) and now >= self.burst_at + plan.clear_after_s - 1e-6:
            out += [("mark", self.index), ("clear", self.index)]
            self._end_burst(now)
            return out
        out.append(("media", self.sent))
        self.sent += 1
        if self.sent >= plan.burst_chunks:
            out.append(("mark", self.index))
            self._end_burst(now)
        return out

    def _end_burst(self, now: float) -> None:
        self.bursting = False
        self.next_at = self.burst_at + self.plan.period_s
        if now > self.next_at:
            self.next_at = now + self.plan.period_s


def tone_payloads(plan: PipecatPlan) -> list[str]:
    """base64 of each 20 ms chunk of the app's tone (µ-law 8 kHz), computed once."""
    ulaw = au.ulaw_encode(au.tone_pcm16(APP_TONE_HZ, plan.burst_ms, ULAW_RATE_HZ, amplitude=6000))
    return [
        base64.b64encode(ulaw[at : at + CHUNK_BYTES]).decode("ascii")
        for at in range(0, len(ulaw), CHUNK_BYTES)
    ]


class _MediaBody(msgspec.Struct):
    track: str | None = None
    chunk: str | None = None
    timestamp: str | None = None
    payload: str | None = None


class _Message(msgspec.Struct):
    """A frame from the gateway, decoded in one pass; unknown fields ignored."""

    event: str | None = None
    sequenceNumber: str | None = None
    streamSid: str | None = None
    media: _MediaBody | None = None


_decode = msgspec.json.Decoder(_Message).decode
_MEDIA_FORMAT = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


class TwilioAppSession(LeanSession):
    """One Twilio-dialect session from the app's side (module doc).

    ``messages`` keeps every non-media message as decoded (``connected``, ``start``, ``mark``,
    ``dtmf``, ``stop``), with its arrival in ``message_times``; caller media only leaves its
    arrival in ``audio_times`` (track 1). ``marks_sent``/``marks_echoed`` are names in order.
    """

    app: TwilioDialectApp

    def __init__(self, app: TwilioDialectApp) -> None:
        super().__init__(app)
        self.stream_sid: str | None = None
        self.call_sid: str | None = None
        self.start_msg: dict[str, Any] | None = None
        self.seen_connected = False
        self.stopped = False
        self.last_seq = 0
        self.last_chunk = 0
        self.marks_sent: list[str] = []
        self.marks_echoed: list[str] = []
        self.pacer: BurstPacer | None = None
        self.script: AppScript | None = None
        self._media_prefix = ""

    # -- the gateway's messages -------------------------------------------------------------
    def _on_binary(self, payload: bytes, now: float) -> None:
        self.protocol_errors.append(f"binary frame of {len(payload)} bytes (Twilio sends text)")

    def _on_text(self, payload: bytes, now: float) -> None:
        event = self.check_message(payload)
        if event == "media":
            self.audio_times.append(now)  # the kernel's stamp (bench/lean_app.py)
            self.audio_loop_times.append(self._loop_now)
            self.audio_tracks.append(INBOUND_TRACK_ID)
            self.audio_loud.append(0)
        elif event is not None:
            msg = json.loads(payload)
            self.messages.append(msg)
            self.message_times.append(now)
            if event == "start":
                self.start_msg = msg
                self.app.on_start(self, msg, now)
            elif event == "mark":
                self.marks_echoed.append(str(msg["mark"]["name"]))

    def check_message(self, raw: bytes) -> str | None:
        """The event of a well-formed gateway message in its place, else None (the problem
        goes to ``protocol_errors``). docs/protocol-twilio.md, "The messages"."""
        errors = self.protocol_errors
        try:
            msg = _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            errors.append(f"not a Twilio message ({exc}): {raw[:80]!r}")
            return None
        event = msg.event
        if event == "connected":
            if self.seen_connected or self.stream_sid is not None:
                errors.append("connected: not the first message")
                return None
            self.seen_connected = True
            return event
        if event not in ("start", "media", "dtmf", "mark", "stop"):
            errors.append(f"unknown event {event!r}")
            return None
        if self.stopped:
            errors.append(f"{event} after stop")
            return None
        if not self.seen_connected or (event == "start") != (self.stream_sid is None):
            errors.append(f"{event} out of order (connected, start, then the stream)")
            return None
        seq = msg.sequenceNumber
        if seq is None or not seq.isdigit() or int(seq) != self.last_seq + 1:
            errors.append(f"{event}: sequenceNumber {seq!r} after {self.last_seq}")
            return None
        self.last_seq = int(seq)
        if event == "start":
            return self._check_start(raw, msg.streamSid)
        if msg.streamSid != self.stream_sid:
            errors.append(f"{event}: streamSid {msg.streamSid!r} is not {self.stream_sid!r}")
            return None
        if event == "media":
            return self._check_media(msg.media)
        if event == "stop":
            self.stopped = True
        elif event == "mark" and not isinstance(json.loads(raw).get("mark", {}).get("name"), str):
            errors.append("mark: no name")
            return None
        return event

    def _check_start(self, raw: bytes, stream_sid: str | None) -> str | None:
        start = json.loads(raw).get("start")
        problems = []
        if not isinstance(start, dict):
            problems.append("no start body")
            start = {}
        if stream_sid is None or start.get("streamSid") != stream_sid:
            problems.append(f"streamSid {stream_sid!r} vs {start.get('streamSid')!r}")
        if not isinstance(start.get("callSid"), str):
            problems.append("no callSid")
        if self.app.account_sid is not None and start.get("accountSid") != self.app.account_sid:
            problems.append(f"accountSid {start.get('accountSid')!r} is not the workspace_ref")
        if start.get("mediaFormat") != _MEDIA_FORMAT:
            problems.append(f"mediaFormat {start.get('mediaFormat')!r}")
        if start.get("tracks") != ["inbound"]:
            problems.append(f"tracks {start.get('tracks')!r}")
        if not isinstance(start.get("customParameters"), dict):
            problems.append("no customParameters")
        if problems:
            self.protocol_errors.append("start: " + "; ".join(problems))
            return None
        self.stream_sid = stream_sid
        self.call_sid = str(start["callSid"])
        return "start"

    def _check_media(self, media: _MediaBody | None) -> str | None:
        errors = self.protocol_errors
        if media is None or media.payload is None:
            errors.append("media: no payload")
            return None
        if media.track != "inbound":
            errors.append(f"media: track {media.track!r}")
            return None
        chunk = media.chunk
        if chunk is None or not chunk.isdigit() or int(chunk) != self.last_chunk + 1:
            errors.append(f"media: chunk {chunk!r} after {self.last_chunk}")
            return None
        self.last_chunk = int(chunk)
        if media.timestamp is None or not media.timestamp.isdigit():
            errors.append(f"media: timestamp {media.timestamp!r}")
            return None
        try:
            size = len(binascii.a2b_base64(media.payload, strict_mode=True))
        except binascii.Error:
            size = 0
        if size == 0:
            errors.append("media: payload is not base64 µ-law")
            return None
        return "media"

    # -- what the app sends -----------------------------------------------------------------
    def send_media(self, payload_b64: str) -> None:
        if not self._media_prefix:
            self._media_prefix = f'{{"event":"media","streamSid":"{self.stream_sid}","media":'
        text = f'{self._media_prefix}{{"payload":"{payload_b64}"}}}}'
        self._send_frame(OP_TEXT, text.encode())

    def send_mark(self, name: str) -> None:
        self.marks_sent.append(name)
        msg = {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}
        self._send_frame(OP_TEXT, json.dumps(msg, separators=(",", ":")).encode())

    def send_clear(self) -> None:
        msg = {"event": "clear", "streamSid": self.stream_sid}
        self._send_frame(OP_TEXT, json.dumps(msg, separators=(",", ":")).encode())

    def pace(self, now: float) -> bool:
        """One tick of the script: send what the pacer says; whether a burst is under way."""
        pacer, script = self.pacer, self.script
        if pacer is None or script is None or self.closed:
            return False
        try:
            for action, n in pacer.step(now):
                if action == "media":
                    self.send_media(self.app.payloads[n])
                elif action == "burst":
                    burst = Burst(n, "audio", now, f"b{n}", None, pacer.plan.burst_ms)
                    script.bursts.append(burst)
                elif action == "mark":
                    self.send_mark(f"b{n}")
                else:
                    # The instant it is really sent (the tick's ``now`` is its deadline).
                    script.bursts[-1].clear_at = self.app.clock()
                    self.send_clear()
        except ConnectionError:
            return False
        return pacer.bursting


class AppTicker(DeadlineTask):
    """Every Twilio-dialect session's pacing from one task (module doc), 10 ms period.

    Sessions waiting for their next burst sit in a heap by due time; only the bursting ones
    are visited each tick. Deadlines are absolute; a tick over 100 ms late restarts from now.
    ``autostart`` False leaves the ticking to a test (:meth:`tick`).
    """

    def __init__(self, period_s: float, *, autostart: bool = True) -> None:
        super().__init__(autostart=autostart)
        self.period_s = period_s
        self.waiting: list[tuple[float, int, TwilioAppSession]] = []
        self.active: list[TwilioAppSession] = []
        self._serial = 0

    def add(self, session: TwilioAppSession, due_at: float) -> None:
        self._serial += 1
        heapq.heappush(self.waiting, (due_at, self._serial, session))
        self.ensure_started()

    def tick(self, now: float) -> None:
        waiting = self.waiting
        while waiting and waiting[0][0] <= now:
            self.active.append(heapq.heappop(waiting)[2])
        still = []
        for session in self.active:
            if session.closed or session.app.stopping:
                continue
            if session.pace(now):
                still.append(session)
            elif session.pacer is not None:
                self._serial += 1
                heapq.heappush(waiting, (session.pacer.next_at, self._serial, session))
        self.active = still

    async def _run(self) -> None:
        await run_on_deadlines(self.period_s, self.tick, self._late)


class TwilioDialectApp(LeanApp):
    """The app server for ``protocol = "twilio"`` apps; also the worker's talker (``scripts``
    by callSid, ``stopping``), as :class:`bench.talker.TalkingApp` is for fonoster."""

    def __init__(
        self,
        *,
        secret: str | None,
        account_sid: str | None,
        plan: PipecatPlan | None = None,
        seed: int = 7,
        autostart: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(secret=secret)
        self.account_sid = account_sid
        self.plan = plan or PipecatPlan()
        self.rng = random.Random(seed)
        self.payloads = tone_payloads(self.plan)
        self.ticker = AppTicker(self.plan.chunk_interval_s, autostart=autostart)
        self.scripts: dict[str, AppScript] = {}
        self.stopping = False
        self.clock = clock

    def new_session(self) -> LeanSession:
        return TwilioAppSession(self)

    def on_start(self, session: TwilioAppSession, start: dict[str, Any], now: float) -> None:
        """``start`` arrived: the session's script begins at a random phase of the period."""
        call_sid = str(start["start"]["callSid"])
        script = AppScript(call_sid, session, now)
        self.scripts[call_sid] = script
        session.script = script
        first_at = now + self.rng.uniform(0.0, self.plan.period_s)
        session.pacer = BurstPacer(self.plan, first_at)
        self.ticker.add(session, first_at)

    async def stop(self) -> None:
        self.stopping = True
        await self.ticker.stop()
        await super().stop()
