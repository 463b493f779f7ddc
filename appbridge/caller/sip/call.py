"""One scripted SIP test call, as ``appbridge call sip:...`` places it (docs/caller.md).

Same options, output style and exit codes as the Twilio test caller
(:mod:`appbridge.caller.twilio`): one line per event stamped with seconds since the INVITE;
``--digits`` from 2 s after the answer, one per second; ``--play`` any WAV, resampled to 8 kHz
and sent in real time; ``--record`` saves what was heard (pcm16 8 kHz mono);
``--duration``/``--seconds`` then BYE; Ctrl-C hangs up (BYE, or CANCEL before the answer), a
second Ctrl-C abandons. Exit 0 answered and ended cleanly, 1 not answered (the SIP status is
printed) or the recording failed, 2 usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from appbridge.caller.audio import rms_pcm16
from appbridge.caller.common import DIGIT_INTERVAL_S, DIGITS_START_S, CallerUsageError
from appbridge.caller.sip.link import parse_sip_target
from appbridge.caller.sip.uac import (
    DEFAULT_FROM_USER,
    DTMF_DIGITS,
    FRAME_BYTES,
    FRAME_S,
    Emit,
    SipCallFailed,
    SipTestCaller,
)
from appbridge.media.codecs import PCM16_8K, AudioFormat, Converter
from appbridge.media.wav import WavError, parse_wav, write_wav

__all__ = [
    "SipCallPlan",
    "SipCallReport",
    "load_wav_pcm16_8k",
    "place_sip_call",
]


@dataclass
class SipCallPlan:
    """What ``appbridge call sip:...`` does on the call (``--digits`` timing as for Twilio)."""

    uri: str
    from_user: str = DEFAULT_FROM_USER
    play_pcm16: bytes = b""
    digits: str = ""
    digits_start_s: float = DIGITS_START_S
    digit_interval_s: float = DIGIT_INTERVAL_S
    duration_s: float = 15.0
    answer_timeout_s: float = 30.0
    record: Path | None = None

    def validate(self) -> None:
        """Raise :class:`CallerUsageError` for anything the call cannot be placed with."""
        try:
            parse_sip_target(self.uri)
        except ValueError as exc:
            raise CallerUsageError(str(exc)) from None
        bad = sorted(set(self.digits.upper()) - DTMF_DIGITS)
        if bad:
            raise CallerUsageError(f"--digits takes 0-9, *, #, A-D only; got {''.join(bad)!r}")
        if not 0 < self.duration_s <= 24 * 3600:
            raise CallerUsageError("--duration must be above 0 and at most 86400 seconds")
        if self.record is not None and not self.record.parent.is_dir():
            raise CallerUsageError(f"--record: no such directory: {self.record.parent}")


@dataclass
class SipCallReport:
    status: int | None = None
    reason: str = ""
    answered: bool = False
    hung_up_by: str = ""
    duration_s: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    heard_pcm16: bytes = b""
    voiced_frames: int = 0
    lines: list[str] = field(default_factory=list)
    saved_to: Path | None = None
    save_error: str | None = None

    @property
    def exit_code(self) -> int:
        """0 answered and ended cleanly, 1 not answered (or the recording failed)."""
        return 0 if self.answered and self.save_error is None else 1

    def summary(self) -> str:
        if not self.answered:
            return f"summary: not answered: {self.status} {self.reason}"
        who = "you hung up" if self.hung_up_by == "caller" else "the remote end hung up"
        heard_s = len(self.heard_pcm16) / (2 * PCM16_8K.rate_hz)
        st = self.stats
        return (
            f"summary: {self.status} {self.reason}; talked {self.duration_s:.2f} s, {who}; "
            f"RTP sent {st.get('sent', 0)} packets, received {st.get('received', 0)} "
            f"({st.get('lost', 0)} lost); heard {heard_s:.1f} s, "
            f"{self.voiced_frames * FRAME_S:.1f} s of it not silent"
        )


class _Voice:
    """Narrates when the far end starts and stops making sound (not one line per frame)."""

    SILENCE_RMS = 100.0
    HOLD_S = 0.5

    def __init__(self, say: Emit) -> None:
        self.say = say
        self.read_bytes = 0
        self.voiced_frames = 0
        self.frames = 0
        self.start: int | None = None
        self.last_voiced = 0

    def feed(self, heard: bytes, *, final: bool = False) -> None:
        while len(heard) - self.read_bytes >= FRAME_BYTES:
            frame = heard[self.read_bytes : self.read_bytes + FRAME_BYTES]
            self.read_bytes += FRAME_BYTES
            self.frames += 1
            if rms_pcm16(frame) >= self.SILENCE_RMS:
                self.voiced_frames += 1
                self.last_voiced = self.frames
                if self.start is None:
                    self.start = self.frames
                    self.say("audio from the far end starts")
            elif self.start is not None and (self.frames - self.last_voiced) * FRAME_S >= 0.5:
                self._close()
        if final:
            self._close()

    def _close(self) -> None:
        if self.start is not None:
            self.say(f"audio stops ({(self.last_voiced - self.start + 1) * FRAME_S:.2f} s)")
            self.start = None


def load_wav_pcm16_8k(path: Path) -> bytes:
    """A WAV file of any supported format and rate as pcm16 8 kHz mono, what goes on the call."""
    try:
        audio = parse_wav(path.read_bytes())
    except OSError as exc:
        raise CallerUsageError(f"--play: cannot read {path}: {exc.strerror or exc}") from None
    except WavError as exc:
        raise CallerUsageError(f"--play: {path}: {exc}") from None
    return Converter(AudioFormat("pcm16", audio.rate_hz), PCM16_8K).convert(audio.pcm16)


async def place_sip_call(
    plan: SipCallPlan, *, emit: Emit | None = None, hang_up: asyncio.Event | None = None
) -> SipCallReport:
    """Place one SIP call as the CLI does and return what happened; ``hang_up`` ends it early
    (BYE, or CANCEL before the answer)."""
    plan.validate()
    out: Emit = emit or (lambda line: print(line, flush=True))
    report = SipCallReport()

    def line(text: str) -> None:
        report.lines.append(text)
        out(text)

    hang_up = hang_up or asyncio.Event()
    caller = SipTestCaller(plan.uri, from_user=plan.from_user, emit=line)
    voice = _Voice(lambda text: line(f"{caller._rel():8.3f}s  {text}"))
    try:
        call = asyncio.ensure_future(caller.call(plan.answer_timeout_s))
        stop = asyncio.ensure_future(hang_up.wait())
        await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            line(f"{caller._rel():8.3f}s  hanging up (Ctrl-C) before the answer")
            await caller.hangup()
        with contextlib.suppress(SipCallFailed):
            await call
        if caller.answered:
            await _talk(caller, plan, hang_up, voice, line)
        stop.cancel()
    finally:
        await caller.close()
    voice.feed(caller.heard(), final=True)
    report.status, report.reason = caller.status, caller.reason
    report.answered = caller.answered
    report.hung_up_by = caller.hung_up_by
    report.duration_s = caller.duration_s
    report.stats = caller.stats()
    report.heard_pcm16 = caller.heard()
    report.voiced_frames = voice.voiced_frames
    if plan.record is not None and report.answered:
        try:
            plan.record.write_bytes(write_wav(report.heard_pcm16, PCM16_8K.rate_hz))
        except OSError as exc:
            report.save_error = f"cannot save {plan.record}: {exc.strerror or exc}"
            line(report.save_error)
        else:
            report.saved_to = plan.record
            heard_s = len(report.heard_pcm16) / (2 * PCM16_8K.rate_hz)
            line(f"saved {heard_s:.1f} s to {plan.record}")
    line(report.summary())
    return report


async def _talk(
    caller: SipTestCaller, plan: SipCallPlan, hang_up: asyncio.Event, voice: _Voice, line: Emit
) -> None:
    """From the answer to the end: audio, keypresses on schedule, then BYE."""
    start = time.monotonic()
    digits = [
        (start + plan.digits_start_s + i * plan.digit_interval_s, d)
        for i, d in enumerate(plan.digits)
    ]
    if plan.play_pcm16:
        await caller.send_audio(plan.play_pcm16, wait=False)
    while not caller.ended:
        now = time.monotonic()
        voice.feed(caller.heard())
        if hang_up.is_set() or now - start >= plan.duration_s:
            why = "Ctrl-C" if hang_up.is_set() else f"--duration {plan.duration_s:g} s reached"
            line(f"{caller._rel():8.3f}s  hanging up ({why})")
            await caller.hangup()
            break
        while digits and digits[0][0] <= now:
            await caller.send_digits(digits.pop(0)[1], wait=False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hang_up.wait(), _POLL_S)


_POLL_S = 0.05
