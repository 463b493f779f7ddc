"""From the peers' recordings of one step to the figures of the table (bench/README.md).

Reads the callers (:class:`bench.lean_twilio.LeanTwilioCall`, and
:class:`bench.sip_caller.SipCaller`, which offers the same views) and
:class:`bench.talker.AppScript` after the calls have hung up; only what happened inside the
hold window counts (the ramp and the hang-up are excluded). The pure pieces are in
:mod:`bench.measure`.

Receive stamps: the lean peers and the SIP caller record when the kernel queued what they
received (bench/stamped.py), and also when their loop read it. The figures use the kernel's;
inbound latency and caller jitter are computed a second time from the loop's
(``inbound_latency_loop_ms``, ``jitter_loop_ms``) to show how much of the old figures was the
generator's own lag. A recording without loop stamps gives the same figure twice.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.lean_app import LeanSession
from bench.lean_twilio import LeanTwilioCall
from bench.measure import (
    FRAME_BYTES,
    FRAME_S,
    BurstOutcome,
    audio_frames_between,
    burst_frames_lost,
    caller_jitter_ms,
    inbound_latencies_ms,
    onset_latencies_flags_ms,
    playing_at,
)
from bench.pipecat_app import TwilioAppSession
from bench.report import Summary, summarize
from bench.sip_caller import SipCaller
from bench.talker import AppScript

#: A Twilio caller (bench/lean_twilio.py) or a SIP/RTP one (bench/sip_caller.py).
Caller = LeanTwilioCall | SipCaller

__all__ = ["Caller", "CallerFigures", "analyse_calls"]

INBOUND_TRACK_ID = 1
#: A burst counts when the window still held it whole: sent this long before the window closed.
BURST_TAIL_S = 3.0


#: How many lost bursts :class:`CallerFigures` describes in full, per worker.
LOST_BURSTS_KEPT = 20
#: How far before a lost burst's send the caller's arrivals are listed (``just_before_ms``).
LOOK_BEFORE_S = 0.1
#: Arrivals this little before a burst's stamped send count as the burst's. The caller's kernel
#: stamps reach the monotonic clock through a bracketed offset (bench/stamped.py), so a frame
#: the gateway forwards at once can be dated a hair before the send it answers. No frame of the
#: burst before can arrive then in a step that keeps the bars: bursts start 5 s apart and play
#: for about 2 s.
STAMP_SLACK_S = 0.002


@dataclass
class CallerFigures:
    """Everything measured at the callers and apps during one hold window."""

    jitter_ms: list[float] = field(default_factory=list)
    clear_to_silence_ms: list[float] = field(default_factory=list)
    clears_while_silent: int = 0
    clears_sent: int = 0  # by the apps, in the window
    clears_at_caller: int = 0  # of those, how many reached the caller as Twilio ``clear``
    inbound_latency_ms: list[float] = field(default_factory=list)
    # The same two figures from the loop's read instants instead of the kernel's (module doc).
    inbound_latency_loop_ms: list[float] = field(default_factory=list)
    jitter_loop_ms: list[float] = field(default_factory=list)
    inbound_unpaired_calls: int = 0
    inbound_frames_sent: int = 0
    inbound_frames_received: int = 0
    bursts_measured: int = 0
    frames_expected: int = 0
    frames_lost: int = 0
    frames_extra: int = 0
    expected_by_kind: dict[str, int] = field(default_factory=dict)
    lost_by_kind: dict[str, int] = field(default_factory=dict)
    bursts_silent: int = 0  # bursts of which not one frame reached the caller
    sip_speak_bursts_unmeasured: int = 0  # frames lost is not measurable there (see below)
    calls_with_silent_bursts: int = 0
    marks_missing: int = 0
    marks_sent: int = 0  # by the apps, one per burst measured
    marks_echoed: int = 0  # of those, how many came back (played, or on clear)
    marks_duplicated: int = 0  # echoes of a mark already echoed
    done_missing: int = 0
    gateway_errors: dict[str, int] = field(default_factory=dict)
    caller_protocol_errors: int = 0
    app_protocol_errors: int = 0
    #: The first bursts (up to :data:`LOST_BURSTS_KEPT` per worker) that lost frames, each
    #: with what reached the caller: where to start looking when ``frames_lost`` is not 0.
    lost_bursts: list[dict[str, Any]] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """Everything, samples included (rounded to µs), for the trip from a worker process."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, list) and key != "lost_bursts":
                out[key] = [round(v, 3) for v in value]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> CallerFigures:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def merge(self, other: CallerFigures) -> None:
        """Add another worker's figures to these (samples pooled, counts summed)."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, dict):
                for key, count in theirs.items():
                    mine[key] = mine.get(key, 0) + count
            else:
                setattr(self, f.name, mine + theirs)

    def summaries(self) -> dict[str, Summary]:
        return {
            "caller_jitter_ms": summarize(self.jitter_ms),
            "clear_to_silence_ms": summarize(self.clear_to_silence_ms),
            "inbound_latency_ms": summarize(self.inbound_latency_ms),
            "inbound_latency_loop_ms": summarize(self.inbound_latency_loop_ms),
            "caller_jitter_loop_ms": summarize(self.jitter_loop_ms),
        }

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v.as_dict() for k, v in self.summaries().items()}
        out.update(
            clears_measured=len(self.clear_to_silence_ms),
            clears_while_silent=self.clears_while_silent,
            clears_sent=self.clears_sent,
            clears_at_caller=self.clears_at_caller,
            inbound_unpaired_calls=self.inbound_unpaired_calls,
            inbound_frames_sent=self.inbound_frames_sent,
            inbound_frames_received=self.inbound_frames_received,
            bursts_measured=self.bursts_measured,
            frames_expected=self.frames_expected,
            frames_lost=self.frames_lost,
            frames_extra=self.frames_extra,
            expected_by_kind=dict(self.expected_by_kind),
            lost_by_kind=dict(self.lost_by_kind),
            bursts_silent=self.bursts_silent,
            sip_speak_bursts_unmeasured=self.sip_speak_bursts_unmeasured,
            calls_with_silent_bursts=self.calls_with_silent_bursts,
            marks_missing=self.marks_missing,
            marks_sent=self.marks_sent,
            marks_echoed=self.marks_echoed,
            marks_duplicated=self.marks_duplicated,
            lost_bursts=self.lost_bursts[:LOST_BURSTS_KEPT],
            output_done_missing=self.done_missing,
            gateway_errors=dict(self.gateway_errors),
            caller_protocol_errors=self.caller_protocol_errors,
            app_protocol_errors=self.app_protocol_errors,
        )
        return out


def _expected_frames(script: AppScript, burst_index: int) -> int | None:
    burst = script.bursts[burst_index]
    if burst.audio_ms is not None:
        return math.ceil(burst.audio_ms / (FRAME_S * 1000))
    for _, msg in script.events("output.done"):
        if msg.get("id") == burst.item_id and isinstance(msg.get("heardMs"), int | float):
            return math.ceil(float(msg["heardMs"]) / (FRAME_S * 1000))
    return None


def _loop_times(loop_times: Sequence[float], times: Sequence[float]) -> Sequence[float]:
    """The loop-time stamps of a recording, or its only stamps when it has no separate ones
    (a recording built without them, as the unit tests' are)."""
    return loop_times if len(loop_times) == len(times) else times


def _inbound_times(session: LeanSession, *, loop: bool = False) -> list[float]:
    """Arrival of each binary frame of the caller's track at the app (``loop``: when the app's
    loop read it, rather than the kernel's stamp)."""
    times: Sequence[float] = session.audio_times
    if loop:
        times = _loop_times(session.audio_loop_times, times)
    return [
        t for t, track in zip(times, session.audio_tracks, strict=True) if track == INBOUND_TRACK_ID
    ]


def _inbound_loudness(session: LeanSession, *, loop: bool = False) -> list[tuple[float, bool]]:
    """(arrival, loud) per caller frame at a lean app that tracked loudness (SIP calls)."""
    times: Sequence[float] = session.audio_times
    if loop:
        times = _loop_times(session.audio_loop_times, times)
    return [
        (t, bool(loud))
        for t, track, loud in zip(times, session.audio_tracks, session.audio_loud, strict=True)
        if track == INBOUND_TRACK_ID
    ]


def _marks_echoed(script: AppScript) -> tuple[dict[str, dict[str, Any]], int]:
    """The mark echoes the app received by name, and how many repeated a name.

    Fonoster: ``{"type":"mark","name":…,"cleared":…}`` (docs/protocol-session-v1.md). Twilio
    dialect: ``{"event":"mark","mark":{"name":…}}`` (docs/protocol-twilio.md), with no
    ``cleared`` flag: the echo of a played mark and of a cleared one look alike there.
    """
    marks: dict[str, dict[str, Any]] = {}
    duplicated = 0
    for _, msg in script.events("mark"):
        body = msg.get("mark")
        name = str(body.get("name") if isinstance(body, dict) else msg.get("name"))
        if name in marks:
            duplicated += 1
        marks[name] = msg
    return marks, duplicated


def _lost_burst(
    call: Caller,
    script: AppScript,
    index: int,
    outcome: BurstOutcome,
    media: Sequence[tuple[float, int]],
    span: tuple[float, float],
    *,
    window_start: float,
) -> dict[str, Any]:
    """What reached the caller during one burst that lost frames (``span``: the arrivals that
    count as the burst's; times in ms from its send): the first and last arrival, every gap over
    two frames, and every message that was not one whole frame."""
    burst = script.bursts[index]
    start, stop = span
    arrivals = [(t, n) for t, n in media if start <= t < stop]
    gaps = [
        [round((a - burst.sent_at) * 1000, 1), round((b - a) * 1000, 1)]
        for (a, _), (b, _) in itertools.pairwise(arrivals)
        if b - a > 2 * FRAME_S
    ]
    odd = [[round((t - burst.sent_at) * 1000, 1), n] for t, n in arrivals if n != FRAME_BYTES]
    # What reached the caller before the burst was stamped as sent, beyond the stamps' slack: a
    # frame of the burst counted as the previous one's would show here.
    before = [
        round((t - burst.sent_at) * 1000, 1)
        for t, _ in media
        if burst.sent_at - LOOK_BEFORE_S <= t < start
    ]
    previous = script.bursts[index - 1] if index > 0 else None
    return {
        "call": getattr(call, "stream_sid", None) or script.call_ref,
        "carrier": "sip" if isinstance(call, SipCaller) else "twilio",
        "burst": burst.index,
        "kind": burst.kind,
        "sent_at_s": round(burst.sent_at - window_start, 3),
        "after_cleared": previous is not None and previous.clear_at is not None,
        "expected": outcome.expected_frames,
        "received": outcome.received_frames,
        "messages": len(arrivals),
        "first_ms": round((arrivals[0][0] - burst.sent_at) * 1000, 1) if arrivals else None,
        "last_ms": round((arrivals[-1][0] - burst.sent_at) * 1000, 1) if arrivals else None,
        "gaps_ms": gaps[:10],
        "odd_messages": odd[:10],
        "just_before_ms": before[-10:],
    }


def _analyse_one(
    call: Caller, script: AppScript, window: tuple[float, float], out: CallerFigures
) -> None:
    t0, t1 = window
    media = call.media_arrivals()
    # RTP is continuous (silence when idle): its pacing is every packet's, audio or not.
    paced = call.recv_times if isinstance(call, SipCaller) else [t for t, _ in media]
    # A Pipecat-style app streams its bursts in at 2x real time: the pacer builds its lead
    # over a few ticks instead of one (bench/measure.py caller_jitter_ms).
    streamed = isinstance(script.session, TwilioAppSession)
    out.jitter_ms += caller_jitter_ms([t for t in paced if t0 <= t < t1], lead_building=streamed)
    paced_loop = _loop_times(call.recv_loop_times, paced)
    out.jitter_loop_ms += caller_jitter_ms(
        [t for t in paced_loop if t0 <= t < t1], lead_building=streamed
    )
    out.caller_protocol_errors += len(call.protocol_errors)
    out.app_protocol_errors += len(script.session.protocol_errors)

    # Inbound: caller media sent -> the app's binary frame on the inbound track.
    sent = call.sent_media_times()
    session = script.session
    received = _inbound_times(session)
    out.inbound_frames_sent += sum(1 for t in sent if t0 <= t < t1)
    out.inbound_frames_received += sum(1 for t in received if t0 <= t < t1)
    if isinstance(call, SipCaller):
        # Frames cannot be paired over SIP (the jitter buffer conceals and drops): measure from
        # each talkspurt's first packet to the first loud frame at the app instead.
        flags = _inbound_loudness(session)
        onsets = call.onset_times
        out.inbound_latency_ms += onset_latencies_flags_ms(onsets, flags, window=window)
        loop_flags = _inbound_loudness(session, loop=True)
        out.inbound_latency_loop_ms += onset_latencies_flags_ms(onsets, loop_flags, window=window)
    else:
        paired = inbound_latencies_ms(sent, received, window=window)
        if paired is None:
            out.inbound_unpaired_calls += 1
        else:
            out.inbound_latency_ms += paired
            received_loop = _inbound_times(session, loop=True)
            out.inbound_latency_loop_ms += (
                inbound_latencies_ms(sent, received_loop, window=window) or []
            )

    for _, msg in script.events("error"):
        code = str(msg.get("code"))
        out.gateway_errors[code] = out.gateway_errors.get(code, 0) + 1

    marks, duplicated = _marks_echoed(script)
    out.marks_duplicated += duplicated
    heard = call.heard_frames()
    bursts = script.bursts
    outcomes: list[BurstOutcome] = []
    silent_bursts = 0
    for i, burst in enumerate(bursts):
        if not (t0 <= burst.sent_at and burst.sent_at + BURST_TAIL_S <= t1):
            continue
        out.bursts_measured += 1
        mark = marks.get(burst.mark_name)
        out.marks_sent += 1
        out.marks_echoed += 0 if mark is None else 1
        if burst.clear_at is not None:
            out.clears_sent += 1
            # docs/protocol-twilio.md: the gateway passes a clear on to Twilio.
            if any(burst.clear_at <= t < burst.clear_at + BURST_TAIL_S for t in call.clear_times):
                out.clears_at_caller += 1
            if playing_at(heard, burst.clear_at):
                silent_at = call.silence_after(burst.clear_at)
                if silent_at is not None:
                    out.clear_to_silence_ms.append((silent_at - burst.clear_at) * 1000.0)
            else:
                out.clears_while_silent += 1
            if mark is None:
                out.marks_missing += 1
            continue
        # A fonoster echo must say the mark was played; a Twilio-dialect one cannot say.
        if mark is None or ("event" not in mark and mark.get("cleared") is not False):
            out.marks_missing += 1
        if burst.kind == "speak" and isinstance(call, SipCaller):
            # RTP never stops (silence when idle), so a frame of eSpeak's own digital silence
            # cannot be told from "nothing played": spoken bursts are not counted over SIP.
            out.sip_speak_bursts_unmeasured += 1
            continue
        expected = _expected_frames(script, i)
        if expected is None:
            out.done_missing += 1
            continue
        end = bursts[i + 1].sent_at if i + 1 < len(bursts) else t1
        span = (burst.sent_at - STAMP_SLACK_S, end - STAMP_SLACK_S)
        outcome = BurstOutcome(expected, audio_frames_between(media, *span))
        outcomes.append(outcome)
        out.expected_by_kind[burst.kind] = out.expected_by_kind.get(burst.kind, 0) + expected
        out.lost_by_kind[burst.kind] = out.lost_by_kind.get(burst.kind, 0) + outcome.lost
        if outcome.lost and len(out.lost_bursts) < LOST_BURSTS_KEPT:
            out.lost_bursts.append(
                _lost_burst(call, script, i, outcome, media, span, window_start=t0)
            )
        if outcome.received_frames == 0:
            silent_bursts += 1
    out.bursts_silent += silent_bursts
    out.calls_with_silent_bursts += 1 if silent_bursts else 0
    expected_total, lost, extra = burst_frames_lost(outcomes)
    out.frames_expected += expected_total
    out.frames_lost += lost
    out.frames_extra += extra


def analyse_calls(
    pairs: Sequence[tuple[Caller, AppScript]], window: tuple[float, float]
) -> CallerFigures:
    """The figures over every (caller, app session) pair that lived through the window."""
    out = CallerFigures()
    for call, script in pairs:
        _analyse_one(call, script, window, out)
    return out
