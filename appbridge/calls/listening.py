"""The call's ears: VAD on every caller frame, a streaming STT opened at call start, and the turn
detector that turns both into ``turn.*`` events (docs/protocol-session-v1.md, "Listening": turn
events, ``subscribe``, ``listen.update``).

Caller audio reaches here as 20 ms pcm16 frames at 16 kHz (or 8 kHz when the carrier is narrow
band and the session asks for 8 kHz), converted once per frame next to the app's own frames. The
detector is sans-I/O (``appbridge/turn/detector.py``): this shell feeds it, arms one
``call_later`` for its next deadline, and reads the STT stream's results in one task per call.

Rules carried out here:
- On hold no caller audio reaches the detector and no turn events are sent; the open turn is
  dropped silently (``TurnDetector.reset``).
- ``turn.estimate`` and ``transcript.partial`` are sent only after ``subscribe`` names them;
  ``turn.estimate`` at most every 100 ms (the detector throttles it).
- ``listen.update``: ``patience`` applies at once; ``language`` or ``hints`` reopen the STT
  stream (the providers take both at open time).
- A provider failure is reported once as ``error`` ``provider_unavailable`` /
  ``provider_timeout`` (``relatesTo`` ``listen``); the call goes on without transcripts. There
  is never a switch to another provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from appbridge.media.codecs import AudioFormat
from appbridge.media.reframe import FrameConverter
from appbridge.protocol import session_v1 as sv1
from appbridge.speech.base import SpeechError, SttProvider, SttStream
from appbridge.turn.detector import (
    Backchannel,
    Ended,
    Estimate,
    LikelyEnded,
    Resumed,
    TurnDetector,
    TurnEvent,
    UserStarted,
)
from appbridge.turn.vad import Vad

if TYPE_CHECKING:
    from appbridge.calls.call import Call

log = logging.getLogger(__name__)

EARS_RATE_HZ: Final = 16000
#: ``appbridge_turns_total{outcome}`` (docs/operations.md, "Metrics"): turns started, ended with
#: their final, ended without it (the text may be a preview's), abandoned, and backchannels.
TURN_OUTCOMES: Final = ("started", "ended", "ended_without_final", "abandoned", "backchannel")


class Ears:
    def __init__(
        self,
        call: Call,
        provider: SttProvider | None,
        carrier_format: AudioFormat,
        *,
        language: str,
        patience: str = "normal",
    ) -> None:
        self.call = call
        self.provider = provider
        rate = 8000 if carrier_format.rate_hz <= 8000 else EARS_RATE_HZ
        self.format = AudioFormat("pcm16", rate)
        self._conv = FrameConverter(carrier_format, self.format)
        self.vad = Vad(rate)
        self.language = language
        self.hints: list[str] = []
        now = call.gw.clock.now()
        self.detector = TurnDetector(
            now, patience=patience, language=language, transcripts=provider is not None
        )
        self.stream: SttStream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # the clock time _timer was armed for
        self._loop = asyncio.get_running_loop()
        self._failed_reported = False
        self.paused = False
        self.closed = False

    # -- the STT stream
    def open(self) -> None:
        """Open the stream now (at call start), so the first turn pays no set-up."""
        self._opening = self.call.spawn(self._open(), "stt-open")

    async def _open(self) -> None:
        if self.provider is None:
            return  # speech.stt = "none": VAD-only turns
        try:
            stream = await self.provider.open_stream(self.language, self.format.rate_hz, self.hints)
        except SpeechError as exc:
            self._report(exc)
            return
        if self.closed:
            await stream.aclose()
            return
        self.stream = stream
        self._reader = self.call.spawn(self._read(stream), "stt-results")

    async def _read(self, stream: SttStream) -> None:
        try:
            async for transcript in stream.results():
                if self.closed or stream is not self.stream:
                    return
                wanted = "transcript.partial" in self._subscriptions()
                if wanted and not transcript.is_final and not self.paused and transcript.text:
                    partial = sv1.TranscriptPartial(
                        text=transcript.text, language=transcript.language
                    )
                    self.call.send_event(partial)
                self._emit(self.detector.on_transcript(self.call.gw.clock.now(), transcript))
                self._tell_owed(stream)
        except SpeechError as exc:
            self._report(exc)
            self._tell_owed(None)

    def _report(self, exc: SpeechError) -> None:
        name = self.provider.name if self.provider is not None else "none"
        log.warning("call %s: STT provider %s failed: %s", self.call.call_ref, name, exc)
        if not self._failed_reported:
            self._failed_reported = True
            self.call.send_error(exc.code, str(exc), "listen")  # type: ignore[arg-type]

    async def _reopen(self) -> None:
        old, self.stream = self.stream, None
        if self._reader is not None:
            self._reader.cancel()
        if old is not None:
            with contextlib.suppress(Exception):
                await old.aclose()
        self._failed_reported = False
        await self._open()

    # -- frames
    def on_carrier_frame(self, payload: bytes) -> None:
        """A carrier frame, converted here to the ears' format."""
        if self.paused or self.closed:
            return
        self.on_frames(self._conv.convert(payload))

    def on_frames(self, frames: Sequence[bytes]) -> None:
        """Frames already in the ears' format (20 ms pcm16)."""
        if self.paused or self.closed:
            return
        now = self.call.gw.clock.now()
        stream = self.stream
        for frame in frames:
            if stream is not None:
                stream.feed(frame)
            self._emit(self.detector.on_frame(now, self.vad.is_speech(frame)))
        self._tell_owed(stream)

    def _tell_owed(self, stream: SttStream | None) -> None:
        """Pass a change in the stream's owed finals to the detector, which waits for an owed
        final before it ends a turn (docs/turn-taking.md, "The rules", 5)."""
        owed = stream is not None and stream.finals_owed > 0
        if owed is not self.detector.final_owed:
            self._emit(self.detector.on_final_owed(self.call.gw.clock.now(), owed))

    # -- the detector's events and timer
    def _emit(self, events: Sequence[TurnEvent]) -> None:
        if events and not self.paused:
            subscribed = self._subscriptions()
            for ev in events:
                message = _to_message(ev, subscribed)
                if message is not None:
                    self.call.send_event(message)
                    self._count(ev)
        self._arm()

    def _count(self, ev: TurnEvent) -> None:
        if isinstance(ev, UserStarted):
            outcome = "started"
        elif isinstance(ev, Ended):
            missing = "ended_without_final" if ev.without_final else "ended"
            outcome = "abandoned" if ev.abandoned else missing
        elif isinstance(ev, Backchannel):
            outcome = "backchannel"
        else:
            return
        turns = self.call.gw.metrics.turns
        turns[outcome] = turns.get(outcome, 0) + 1

    def _arm(self) -> None:
        """One timer for the detector's next deadline. Called after every frame, so a timer that
        is due no later than the deadline is kept: the deadline of a caller who talks moves out
        by a frame each time, and firing early costs one ``on_timer`` that finds nothing due
        (and arms again), where cancelling and re-creating the timer cost a timer per frame."""
        deadline = self.detector.next_deadline()
        timer = self._timer
        if deadline is None or self.closed:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        if timer is not None:
            if self._timer_due <= deadline:
                return
            timer.cancel()
        self._timer_due = deadline
        delay = max(0.0, deadline - self.call.gw.clock.now())
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        try:
            self._emit(self.detector.on_timer(self.call.gw.clock.now()))
        except Exception:
            log.exception("call %s: turn detector failed", self.call.call_ref)

    def _subscriptions(self) -> set[str]:
        return self.call.core.subscriptions

    # -- control
    def pause(self) -> None:
        """Hold: no caller audio, no turn events; an open turn is dropped."""
        self.paused = True
        self.detector.reset(self.call.gw.clock.now())
        self._arm()

    def resume(self) -> None:
        self.paused = False
        self.detector.reset(self.call.gw.clock.now())

    def update(
        self, *, language: str | None, hints: list[str] | None, patience: str | None
    ) -> None:
        if patience is not None:
            self.detector.set_patience(patience)
        reopen = False
        if language is not None and language != self.language:
            self.language = language
            self.detector.set_language(language)
            reopen = True
        if hints is not None and hints != self.hints:
            self.hints = list(hints)
            reopen = True
        if reopen:
            self.call.spawn(self._reopen(), "stt-reopen")

    async def close(self) -> None:
        self.closed = True
        # The tasks are the call's (it cancels them as it ends); a cancelled one keeps its
        # exception, whose traceback holds this object: let go of them, no reference cycle.
        self._reader = self._opening = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.aclose()


def _to_message(ev: TurnEvent, subscribed: set[str]) -> Any:
    if isinstance(ev, UserStarted):
        return sv1.TurnUserStarted()
    if isinstance(ev, LikelyEnded):
        return sv1.TurnLikelyEnded(text=ev.text)
    if isinstance(ev, Resumed):
        return sv1.TurnResumed()
    if isinstance(ev, Ended):
        return sv1.TurnEnded(
            text=ev.text,
            language=ev.language,
            confidence=ev.confidence,
            duration_ms=ev.duration_ms,
            abandoned=ev.abandoned,
        )
    if isinstance(ev, Backchannel):
        return sv1.TurnBackchannel(text=ev.text)
    if isinstance(ev, Estimate):
        if "turn.estimate" not in subscribed:
            return None
        return sv1.TurnEstimate(eot=ev.eot, speaking=ev.speaking, kind=ev.kind)
    return None
