"""The Twilio test caller: ``appbridge call http://...`` plays Twilio's part against a gateway.

Why it exists: there is no real carrier on a developer's machine, yet a newcomer who started the
gateway (``make run``) should be able to place a test call and hear it (docs/caller.md). This
module places that call through the gateway's Twilio ingress exactly as Twilio Programmable Voice
would (docs/protocol-twilio.md, "Carrier side"): it POSTs the voice webhook, follows the TwiML
``<Connect><Stream>`` into a bidirectional Media Stream, sends caller audio every 20 ms (a WAV
file or silence) and keypresses, plays what the gateway sends on a real-time timeline, and hangs
up with ``stop``. The wire work is :class:`~appbridge.caller.twilio_carrier.TwilioCarrier`'s and
:class:`~appbridge.caller.twilio_stream.TwilioStreamCall`'s; this module schedules the call,
narrates what it sees and keeps what was heard.

Exit codes (docs/caller.md, "Exit codes"): 0 the call connected (a media stream was opened), 1 it
did not (a non-200 webhook, TwiML without ``<Stream>``, a refused upgrade or an unreachable
gateway, or a recording that could not be saved). Usage errors raise :class:`CallerUsageError`,
which :mod:`appbridge.caller.cli` turns into exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from appbridge.caller.audio import rms_pcm16, ulaw_decode
from appbridge.caller.common import (
    DIGIT_INTERVAL_S,
    DIGITS_START_S,
    DTMF_DIGITS,
    EXIT_CONNECTED,
    EXIT_NOT_CONNECTED,
    SILENCE_RMS,
    CallerUsageError,
    Emit,
)
from appbridge.caller.twilio_carrier import TwilioCarrier
from appbridge.caller.twilio_stream import FRAME_S, ULAW_RATE_HZ, TwilioStreamCall
from appbridge.config.model import DEMO_ACCOUNT_SID
from appbridge.media.codecs import PCM16_8K, PCMU_8K, AudioFormat, Converter
from appbridge.media.wav import WavError, parse_wav, write_wav

__all__ = [
    "CallPlan",
    "CallReport",
    "describe_twiml",
    "load_wav_ulaw",
    "place_test_call",
]

DEFAULT_FROM = "+15550001111"
DEFAULT_TO = "+15550002222"
#: Pauses shorter than this inside speech (between words and sentences) do not end a stretch of
#: sound; eSpeak's sentence pauses measure about 0.3 s.
VOICE_HOLD_S = 0.5
#: The WAV is queued this far ahead of real time, so a keypress waits at most this long behind it
#: (the stream sends a keypress after the audio queued before it).
FEED_AHEAD_S = 0.1
#: How often the connecting phase looks for the webhook's answer.
_WEBHOOK_POLL_S = 0.005
_MAX_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What to do on the call. ``url`` is the gateway's base URL (``http://127.0.0.1:8080``);
    ``public_url`` is how the gateway knows itself (its ``server.public_url``), which the
    signatures are computed over (docs/configuration.md, ``[carriers.twilio]``)."""

    url: str
    from_: str = DEFAULT_FROM
    to: str = DEFAULT_TO
    play_ulaw: bytes = b""
    digits: str = ""
    digits_start_s: float = DIGITS_START_S
    digit_interval_s: float = DIGIT_INTERVAL_S
    seconds: float = 15.0
    auth_token: str | None = None
    account_sid: str = DEMO_ACCOUNT_SID
    public_url: str | None = None
    record: Path | None = None

    def validate(self) -> None:
        """Raise :class:`CallerUsageError` for anything the call cannot be placed with."""
        if self.url.lower().startswith(("sip:", "sips:")):
            raise CallerUsageError(
                "a sip: URI is placed by appbridge.caller.sip (SipCallPlan), not by CallPlan"
            )
        for name, value in (("URL", self.url), ("--public-url", self.public_url)):
            if value is not None:
                _check_http_url(name, value)
        if not self.from_ or not self.to:
            raise CallerUsageError("--from and --to must not be empty")
        bad = sorted(set(self.digits) - DTMF_DIGITS)
        if bad:
            raise CallerUsageError(f"--digits takes 0-9, *, #, A-D only; got {''.join(bad)!r}")
        if not 0 < self.seconds <= _MAX_SECONDS:
            raise CallerUsageError(f"--seconds must be above 0 and at most {_MAX_SECONDS:g}")
        if self.digits_start_s < 0 or self.digit_interval_s <= 0:
            raise CallerUsageError("digit timing must be non-negative with a positive interval")
        if self.record is not None and not self.record.parent.is_dir():
            raise CallerUsageError(f"--record: no such directory: {self.record.parent}")


def _check_http_url(name: str, value: str) -> None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CallerUsageError(
            f"{name} must be the gateway's http:// or https:// base URL, got {value!r}"
        )
    if parts.query or parts.fragment:
        raise CallerUsageError(f"{name} must carry no query or fragment, got {value!r}")


def load_wav_ulaw(path: Path) -> bytes:
    """A WAV file of any supported format and rate as µ-law 8 kHz, Twilio's only media format
    (docs/protocol-twilio.md, "The messages")."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CallerUsageError(f"--play: cannot read {path}: {exc.strerror or exc}") from None
    try:
        audio = parse_wav(data)
    except WavError as exc:
        raise CallerUsageError(f"--play: {path}: {exc}") from None
    return Converter(AudioFormat("pcm16", audio.rate_hz), PCMU_8K).convert(audio.pcm16)


@dataclass
class CallReport:
    """What happened, with times in seconds since the webhook was posted."""

    webhook_status: int = 0
    verdict: str = ""
    connected: bool = False
    stream_open_at_s: float | None = None
    hung_up_by: str = ""  # "caller" or "gateway"; empty when no stream was opened
    end_reason: str = ""
    lines: list[str] = field(default_factory=list)
    digits_sent: list[tuple[float, str]] = field(default_factory=list)
    marks_received: list[tuple[float, str]] = field(default_factory=list)
    clears_received: list[float] = field(default_factory=list)
    voiced_spans: list[tuple[float, float]] = field(default_factory=list)
    voiced_frames: int = 0
    heard_ulaw: bytes = b""
    saved_to: Path | None = None
    save_error: str | None = None

    @property
    def heard_s(self) -> float:
        """Length of the playout timeline, silence included."""
        return len(self.heard_ulaw) / ULAW_RATE_HZ

    @property
    def voiced_s(self) -> float:
        return self.voiced_frames * FRAME_S

    @property
    def exit_code(self) -> int:
        if not self.connected or self.save_error is not None:
            return EXIT_NOT_CONNECTED
        return EXIT_CONNECTED

    def heard_pcm16(self) -> bytes:
        """The timeline as 16-bit 8 kHz PCM, as ``--record`` saves it."""
        return Converter(PCMU_8K, PCM16_8K).convert(self.heard_ulaw)

    def summary(self) -> str:
        if not self.connected:
            return f"summary: not connected ({self.verdict})"
        who = "you hung up" if self.hung_up_by == "caller" else "the gateway hung up"
        return (
            f"summary: heard {self.heard_s:.1f} s, {self.voiced_s:.1f} s of it not silent; "
            f"{who} ({self.end_reason})"
        )


class _Narrator:
    """Prints one line per event, stamped with seconds since the webhook POST."""

    def __init__(self, t0: float, emit: Emit, report: CallReport) -> None:
        self.t0 = t0
        self.emit = emit
        self.report = report

    def rel(self, t: float) -> float:
        return t - self.t0

    def say(self, t: float, text: str) -> None:
        line = f"{self.rel(t):8.3f}s  {text}"
        self.report.lines.append(line)
        self.emit(line)


class _VoiceTracker:
    """Turns the playout timeline into stretches of sound, so the caller can narrate when the
    gateway starts and stops talking without a line per 20 ms frame."""

    def __init__(self, narrator: _Narrator) -> None:
        self.narrator = narrator
        self.start: float | None = None
        self.last_end = 0.0

    def feed(self, t: float, frame: bytes) -> None:
        voiced = rms_pcm16(ulaw_decode(frame)) >= SILENCE_RMS
        report = self.narrator.report
        if voiced:
            report.voiced_frames += 1
            if self.start is None:
                self.start = t
                self.narrator.say(t, "audio from the gateway starts")
            self.last_end = t + FRAME_S
        elif self.start is not None and t - self.last_end >= VOICE_HOLD_S:
            self.close()

    def close(self) -> None:
        if self.start is None:
            return
        span = (self.narrator.rel(self.start), self.narrator.rel(self.last_end))
        self.narrator.report.voiced_spans.append(span)
        self.narrator.say(self.last_end, f"audio stops ({self.last_end - self.start:.2f} s)")
        self.start = None


def describe_twiml(call: TwilioStreamCall) -> str:
    """A one-line reading of the webhook's answer, saying why a call did not connect."""
    if call.webhook_status != 200:
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(call.twiml).get("message", ""))
        hint = {
            403: " (the gateway checks X-Twilio-Signature: pass --auth-token, and --public-url "
            "when the gateway has a public_url)",
            404: " (no Twilio routes: the gateway's configuration has no [carriers.twilio])",
        }.get(call.webhook_status, "")
        return f"refused: HTTP {call.webhook_status} {detail}".rstrip() + hint
    if call.twiml_error:
        return f"unusable TwiML: {call.twiml_error}"
    if call.stream_url:
        names = ", ".join(call.params) or "none"
        return f"TwiML <Connect><Stream url={call.stream_url}> (parameters: {names})"
    try:
        root = ET.fromstring(call.twiml)
    except ET.ParseError:
        return "TwiML without <Stream>"
    verbs = []
    for verb in root:
        attrs = "".join(f' {k}="{v}"' for k, v in verb.attrib.items())
        text = (verb.text or "").strip()
        verbs.append(f"<{verb.tag}{attrs}>{text}</{verb.tag}>" if text else f"<{verb.tag}{attrs}/>")
    return f"TwiML {''.join(verbs) or '<Response/>'}: no <Stream>, so the call ends here"


async def _post_webhook(
    fake: TwilioCarrier, plan: CallPlan, narrator: _Narrator, report: CallReport
) -> TwilioStreamCall | None:
    """Post the webhook and open the stream, narrating both at the moment they happen."""
    signed = "signed" if plan.auth_token else "unsigned"
    narrator.say(
        narrator.t0,
        f"POST {fake.gateway_base_url}/twilio/voice  From {plan.from_} To {plan.to} ({signed})",
    )
    task = asyncio.create_task(
        fake.place_call(plan.from_, plan.to, pace=True, continuous_media=True)
    )
    try:
        # The carrier lists the call as soon as the webhook is answered, before it opens the
        # stream: watching the list stamps the answer with its own time.
        while not task.done() and not fake.calls:
            await asyncio.wait({task}, timeout=_WEBHOOK_POLL_S)
        if fake.calls:
            answered = fake.calls[0]
            report.webhook_status = answered.webhook_status
            report.verdict = describe_twiml(answered)
            narrator.say(
                time.monotonic(), f"webhook answered {answered.webhook_status}: {report.verdict}"
            )
        call = await task
    except httpx.HTTPError as exc:
        report.verdict = f"gateway unreachable: {type(exc).__name__}: {exc}"
        narrator.say(time.monotonic(), report.verdict)
        return None
    if call.has_stream:
        opened = call.sent[0][0] if call.sent else time.monotonic()
        report.connected = True
        report.stream_open_at_s = narrator.rel(opened)
        url = fake.dial_url_for(call.stream_url or "")
        narrator.say(opened, f"media stream open: {url} (streamSid {call.stream_sid})")
    elif call.stream_url:
        why = f"HTTP {call.stream_status}" if call.stream_status else call.stream_error
        report.verdict = f"media stream refused: {why}"
        narrator.say(time.monotonic(), report.verdict)
    return call


class _Watcher:
    """Carries the call through its life: feeds audio and keypresses on schedule, narrates what
    comes back, and decides when the caller hangs up."""

    def __init__(self, call: TwilioStreamCall, plan: CallPlan, narrator: _Narrator) -> None:
        self.call = call
        self.plan = plan
        self.narrator = narrator
        self.report = narrator.report
        self.voice = _VoiceTracker(narrator)
        self.start = call.sent[0][0] if call.sent else time.monotonic()
        self.deadline = self.start + plan.seconds
        first = self.start + plan.digits_start_s
        self.digit_plan = [
            (first + i * plan.digit_interval_s, d) for i, d in enumerate(plan.digits)
        ]
        self.fed = 0
        self.n_received = self.n_sent = self.n_heard = self.n_echoed = self.n_errors = 0

    def _changed(self) -> bool:
        # Frames are read one behind the newest (see _observe): a new one means two unread.
        call = self.call
        fresh_frame = len(call.heard) > self.n_heard + 1
        return call.closed or len(call.received) != self.n_received or fresh_frame

    async def run(self, hang_up: asyncio.Event) -> None:
        call = self.call
        while True:
            now = time.monotonic()
            await self._feed(now)
            self._observe(final=False)
            if call.closed:
                self.report.hung_up_by = "gateway"
                self.report.end_reason = f"it closed the stream, code {call.close_code}"
                self.narrator.say(
                    time.monotonic(), f"the gateway hung up: {self.report.end_reason}"
                )
                break
            if hang_up.is_set() or now >= self.deadline:
                why = "Ctrl-C" if hang_up.is_set() else f"--seconds {self.plan.seconds:g} reached"
                self.report.hung_up_by = "caller"
                self.report.end_reason = why
                self.narrator.say(now, f"hanging up ({why}): sending stop")
                await call.hangup()
                self.narrator.say(time.monotonic(), "stream closed")
                break
            wake_at = min([self.deadline] + [t for t, _ in self.digit_plan[:1]])
            timeout_s = max(0.001, wake_at - now)
            with contextlib.suppress(TimeoutError):
                await call.wait_until(lambda: self._changed() or hang_up.is_set(), timeout_s)
        self._observe(final=True)

    async def _feed(self, now: float) -> None:
        play = self.plan.play_ulaw
        if self.fed < len(play):
            due = min(len(play), int((now - self.start + FEED_AHEAD_S) * ULAW_RATE_HZ))
            if due > self.fed:
                await self.call.send_audio_ulaw(play[self.fed : due])
                self.fed = due
        while self.digit_plan and self.digit_plan[0][0] <= now:
            _, digit = self.digit_plan.pop(0)
            await self.call.send_dtmf(digit)

    def _observe(self, *, final: bool) -> None:
        call, say = self.call, self.narrator.say
        for t, msg in call.sent[self.n_sent :]:
            if msg.get("event") == "dtmf":
                digit = str(msg["dtmf"]["digit"])
                self.report.digits_sent.append((self.narrator.rel(t), digit))
                say(t, f"sent DTMF {digit}")
        self.n_sent = len(call.sent)
        for t, msg in call.received[self.n_received :]:
            event = msg.get("event")
            if event == "mark":
                name = str((msg.get("mark") or {}).get("name", ""))
                self.report.marks_received.append((self.narrator.rel(t), name))
                say(t, f"mark {name!r} received")
            elif event == "clear":
                self.report.clears_received.append(self.narrator.rel(t))
                say(t, "clear received: buffered audio dropped")
        self.n_received = len(call.received)
        for t, name in call.marks_echoed_at[self.n_echoed :]:
            say(t, f"mark {name!r} played, echoed back")
        self.n_echoed = len(call.marks_echoed_at)
        for error in call.protocol_errors[self.n_errors :]:
            say(time.monotonic(), f"protocol error from the gateway: {error}")
        self.n_errors = len(call.protocol_errors)
        # The newest frame may still be cut short by a clear, so it is read on the next pass.
        ready = len(call.heard) if final else len(call.heard) - 1
        for t, frame in call.heard[self.n_heard : ready]:
            self.voice.feed(t, frame)
        self.n_heard = max(self.n_heard, ready)
        if final:
            self.voice.close()


async def place_test_call(
    plan: CallPlan, *, emit: Emit | None = None, hang_up: asyncio.Event | None = None
) -> CallReport:
    """Place one call as Twilio would and return what happened; ``hang_up`` ends it early.

    Raises :class:`CallerUsageError` for an invalid plan. Each event is passed to ``emit`` as one
    line (default: printed to stdout).
    """
    plan.validate()
    out: Emit = emit or (lambda line: print(line, flush=True))
    hang_up = hang_up or asyncio.Event()
    report = CallReport()
    narrator = _Narrator(time.monotonic(), out, report)
    fake = TwilioCarrier(
        plan.url,
        account_sid=plan.account_sid,
        auth_token=plan.auth_token,
        public_url=plan.public_url,
    )
    try:
        call = await _post_webhook(fake, plan, narrator, report)
        if call is not None and call.has_stream:
            await _Watcher(call, plan, narrator).run(hang_up)
            report.heard_ulaw = b"".join(frame for _, frame in call.heard)
    finally:
        await fake.aclose()
    if plan.record is not None and report.connected:
        try:
            plan.record.write_bytes(write_wav(report.heard_pcm16(), PCM16_8K.rate_hz))
        except OSError as exc:
            report.save_error = f"cannot save {plan.record}: {exc.strerror or exc}"
            narrator.say(time.monotonic(), report.save_error)
        else:
            report.saved_to = plan.record
            narrator.say(time.monotonic(), f"saved {report.heard_s:.1f} s to {plan.record}")
    out(report.summary())
    return report
