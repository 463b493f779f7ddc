"""The benchmark's scripted peers: an app that talks back and callers that talk continuously.

:class:`TalkingApp` is a ``handler`` for the lean app (:class:`bench.lean_app.LeanApp`), and
:func:`drive_caller` hands the caller's voice to a lean Twilio caller
(:class:`bench.lean_twilio.LeanTwilioCall`) or a SIP one (:class:`bench.sip_caller.SipCaller`).

The app's script (bench/README.md, "Traffic per call"): every ``period_s`` (5 s) each session
plays a burst of ``burst_s`` (2 s), alternately a ``speak`` and its own binary audio, and queues
a ``mark`` after it; every other burst is cut by a ``clear`` ``clear_after_s`` (300 ms) after it
was sent. The cycle of four is (speak), (audio + clear), (audio), (speak + clear), so each kind
is cleared half of the time. Sessions start their cycle at a random phase so bursts do not line
up across calls. Each send is recorded with its ``time.monotonic()`` instant for
:mod:`bench.measure`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from appbridge.testing import audio as au
from bench.lean_app import LeanSession
from bench.lean_twilio import LeanTwilioCall
from bench.sip_caller import SIP_CALLER_PREFIX, SipCaller

#: The app side of a session: the lean app's (bench/lean_app.py; the Twilio-dialect app's too).
Session = LeanSession

__all__ = ["AppScript", "Burst", "TalkingApp", "burst_kind", "caller_tone_ulaw", "drive_caller"]

#: About 2.05 s of speech from the offline ``local`` voice at its default 175 wpm.
SPEAK_TEXT = "Thanks, your order shipped today."
#: ``--speak unique``: a new sentence every time (about 2.3 s), so no cache can answer it.
UNIQUE_SPEAK_TEXT = "Thanks, order {n} shipped today."
APP_RATE_HZ = 16000
APP_TONE_HZ = 600.0
#: The app sends its audio in chunks of this length, back to back (apps send ahead of time).
APP_CHUNK_MS = 200
CALLER_TONE_HZ = 440.0


def burst_kind(index: int) -> tuple[str, bool]:
    """(kind, cleared) of burst ``index``: the cycle speak, audio+clear, audio, speak+clear."""
    kind = "speak" if index % 4 in (0, 3) else "audio"
    return kind, index % 2 == 1


@dataclass
class Burst:
    """One burst as the app sent it (monotonic seconds)."""

    index: int
    kind: str
    sent_at: float
    mark_name: str
    item_id: str | None
    audio_ms: int | None  # known for app audio; for speech it is whatever output.done says
    clear_at: float | None = None


@dataclass
class AppScript:
    """The record of one session: what was sent, and the session for what came back."""

    call_ref: str
    session: Session
    started_at: float
    bursts: list[Burst] = field(default_factory=list)

    def events(self, msg_type: str) -> list[tuple[float, dict[str, Any]]]:
        """(arrival time, message) of each message of ``msg_type`` the app received (its
        ``type``, or its ``event`` for a Twilio-dialect session, bench/pipecat_app.py)."""
        session = self.session
        return [
            (t, m)
            for t, m in zip(session.message_times, session.messages, strict=True)
            if m.get("type", m.get("event")) == msg_type
        ]


class TalkingApp:
    """A fonoster app (pcm16 16 kHz) that talks back on a fixed script (module doc)."""

    def __init__(
        self,
        *,
        period_s: float = 5.0,
        burst_s: float = 2.0,
        clear_after_s: float = 0.3,
        speak_text: str = SPEAK_TEXT,
        seed: int = 7,
        unique_speak: bool = False,
    ) -> None:
        self.period_s = period_s
        self.burst_s = burst_s
        self.clear_after_s = clear_after_s
        self.speak_text = speak_text
        self.unique_speak = unique_speak
        self._spoken = seed * 1_000_000  # workers' seeds differ, so their sentences do too
        self.rng = random.Random(seed)
        self.scripts: dict[str, AppScript] = {}
        self.stopping = False
        pcm = au.tone_pcm16(APP_TONE_HZ, burst_s * 1000.0, APP_RATE_HZ, amplitude=6000)
        chunk_bytes = 2 * APP_RATE_HZ * APP_CHUNK_MS // 1000
        self.audio_chunks = [pcm[i : i + chunk_bytes] for i in range(0, len(pcm), chunk_bytes)]
        self.audio_ms = round(1000 * len(pcm) / (2 * APP_RATE_HZ))

    async def handle(self, session: Session) -> None:
        """The app's ``handler``: wait for ``session.start``, then play bursts until closed."""
        start = await session.wait_for("session.start", timeout=30.0)
        now = time.monotonic()
        # A SIP call is found by its unique caller number, a Twilio call by its CallSid
        # (the callRef of session.start), bench/sip_caller.py.
        from_ = str(start.get("from"))
        key = from_ if from_.startswith(SIP_CALLER_PREFIX) else str(start.get("callRef"))
        script = AppScript(key, session, now)
        self.scripts[script.call_ref] = script
        next_at = now + self.rng.uniform(0.0, self.period_s)
        index = 0
        while not session.closed and not self.stopping:
            delay_s = next_at - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if session.closed or self.stopping:
                return
            await self._burst(script, index)
            index += 1
            next_at += self.period_s
            if time.monotonic() > next_at:  # far behind: skip, do not pile bursts up
                next_at = time.monotonic() + self.period_s

    def _next_text(self) -> str:
        if not self.unique_speak:
            return self.speak_text
        self._spoken += 1
        return UNIQUE_SPEAK_TEXT.format(n=self._spoken)

    async def _burst(self, script: AppScript, index: int) -> None:
        session = script.session
        kind, cleared = burst_kind(index)
        mark_name = f"b{index}"
        sent_at = time.monotonic()
        if kind == "speak":
            item_id: str | None = f"s{index}"
            burst = Burst(index, kind, sent_at, mark_name, item_id, None)
            script.bursts.append(burst)
            await session.send({"type": "speak", "id": item_id, "text": self._next_text()})
        else:
            burst = Burst(index, kind, sent_at, mark_name, None, self.audio_ms)
            script.bursts.append(burst)
            for chunk in self.audio_chunks:
                await session.send_binary(chunk)
        await session.send({"type": "mark", "name": mark_name})
        if cleared:
            delay_s = sent_at + self.clear_after_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if session.closed:
                return
            burst.clear_at = time.monotonic()
            await session.send({"type": "clear"})


def caller_tone_ulaw(ms: float) -> bytes:
    """The caller's voice stand-in: a 440 Hz tone, µ-law 8 kHz."""
    return au.ulaw_encode(au.tone_pcm16(CALLER_TONE_HZ, ms, 8000, amplitude=6000))


async def drive_caller(call: SipCaller | LeanTwilioCall, tone_ulaw: bytes, period_s: float) -> None:
    """Queue ``tone_ulaw`` every ``period_s``; continuous media fills the rest with silence.

    With a 1 s tone every 2 s the caller talks half of the time. A SIP caller's packets, and a
    Twilio caller's messages, are sent by its worker's ticker; this only hands it the tone.
    """
    while not call.closed:
        call.talk(tone_ulaw)
        await asyncio.sleep(period_s)
