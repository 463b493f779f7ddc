"""What the benchmark reads off the fake peers' timelines: pure functions, tested on fixed data.

Every time here is ``time.monotonic()`` seconds taken inside the load generator's process, so
the caller (fake Twilio) and the app (fake fonoster app) share one clock and can be subtracted.
The quantities (docs/PERFORMANCE.md, "Method"):

* **caller jitter**: how far each gap between consecutive ``media`` messages arriving at the
  caller strays from 20 ms (docs/protocol-twilio.md: Twilio plays 20 ms per message). The gateway
  sends nothing while its output queue is empty, so only gaps inside a run of audio count; the
  first messages of a run are the pacer's lead (appbridge/media/pacing.py sends them at once) and
  are skipped.
* **inbound added latency**: caller ``media`` sent → the app's binary frame received. Frames
  are paired by order (the gateway forwards every caller frame, in order, to the app,
  docs/protocol-session-v1.md), which holds only when none was dropped; a call whose counts
  disagree is left out.
* **frames lost during bursts**: audio the caller should have heard in a burst (what the app
  sent, or what ``output.done`` says was played) against the audio that reached it.
* **clear-to-silence**: from the app sending ``clear`` to the caller's playout going silent
  (docs/protocol-session-v1.md, "clear": within 40 ms), read with
  ``LeanTwilioCall.silence_after``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FRAME_BYTES",
    "FRAME_S",
    "BurstOutcome",
    "audio_frames_between",
    "burst_frames_lost",
    "caller_jitter_ms",
    "inbound_latencies_ms",
    "is_loud",
    "onset_latencies_flags_ms",
    "onset_latencies_ms",
    "playing_at",
]

#: One µ-law 8 kHz frame of 20 ms (docs/protocol-twilio.md, "The messages").
FRAME_S = 0.020
FRAME_BYTES = 160
#: A gap longer than this ends a run of gateway audio (bursts are seconds apart).
RUN_GAP_S = 0.25


#: With ``lead_building``, the longest a run's lead may take to build before gaps count anyway.
MAX_LEAD_ARRIVALS = 10


def caller_jitter_ms(
    arrivals: Sequence[float],
    *,
    frame_s: float = FRAME_S,
    skip_per_run: int = 3,
    run_gap_s: float = RUN_GAP_S,
    lead_building: bool = False,
) -> list[float]:
    """|gap - 20 ms| in ms for each steady-state gap between consecutive media arrivals.

    ``arrivals`` are sorted arrival times. A run is a stretch without a gap above ``run_gap_s``;
    its first ``skip_per_run`` arrivals (the pacer's lead, sent in one tick) open no gap.

    ``lead_building``: the app streams its audio in (a Pipecat-style app at 2x real time,
    bench/pipecat_app.py) rather than queueing a burst at once, so the gateway's pacer
    (appbridge/media/pacing.py) fills its lead over several ticks, sending two frames in a tick
    while it catches up. Those 0 ms gaps are the lead being built, not jitter the caller hears
    (Twilio buffers what is ahead): gaps count only once the run is ``skip_per_run - 1`` frames
    ahead of one frame per 20 ms since its first arrival, or after :data:`MAX_LEAD_ARRIVALS`
    arrivals whatever the lead (so a run that never builds one is still measured). When the
    lead comes in one tick this is the same as the plain rule.
    """
    out: list[float] = []
    in_run = 0
    run_start = 0.0
    steady = False
    previous: float | None = None
    for t in arrivals:
        if previous is None or t - previous > run_gap_s:
            in_run, run_start, steady = 1, t, False
        else:
            in_run += 1
            if in_run > skip_per_run and (steady or not lead_building):
                out.append(abs((t - previous) - frame_s) * 1000.0)
        if lead_building and not steady and in_run >= skip_per_run:
            ahead = in_run - 1 - round((t - run_start) / frame_s)
            steady = ahead >= skip_per_run - 1 or in_run >= MAX_LEAD_ARRIVALS
        previous = t
    return out


def inbound_latencies_ms(
    sent: Sequence[float],
    received: Sequence[float],
    *,
    window: tuple[float, float] | None = None,
    max_unmatched: int = 1,
) -> list[float] | None:
    """Latency (ms) of each caller frame to the app, pairing the k-th sent with the k-th received.

    ``sent`` holds the send time of every caller media message of the call and ``received`` the
    arrival time of every inbound binary frame at the app, both complete (read after the call
    ended) and sorted. Pairs whose send time falls in ``window`` are kept. Returns None when the
    pairing cannot be trusted: more frames received than sent, an arrival before its sending, or
    more than ``max_unmatched`` frames never delivered (one lost frame would put every later pair
    off by a frame, reading 20 ms too slow). One unmatched frame is allowed: a gateway that
    reframes caller audio may hold back a partial last frame when the call ends.
    """
    if len(received) > len(sent) or len(sent) - len(received) > max_unmatched:
        return None
    out: list[float] = []
    for t_sent, t_received in zip(sent, received, strict=False):
        if t_received < t_sent:
            return None
        if window is not None and not (window[0] <= t_sent < window[1]):
            continue
        out.append((t_received - t_sent) * 1000.0)
    return out


#: A 16-bit sample louder than this is the caller's tone (amplitude 6000), not silence.
LOUD_SAMPLE = 1000


def is_loud(pcm16: bytes | memoryview) -> bool:
    """Whether a little-endian PCM16 frame holds a sample louder than :data:`LOUD_SAMPLE`."""
    samples = memoryview(pcm16).cast("h") if len(pcm16) % 2 == 0 else memoryview(b"").cast("h")
    return any(abs(v) > LOUD_SAMPLE for v in samples)


def onset_latencies_ms(
    onsets: Sequence[float],
    received: Sequence[tuple[float, bytes]],
    *,
    window: tuple[float, float] | None = None,
    max_wait_s: float = 1.0,
) -> list[float]:
    """Latency (ms) from each talkspurt onset at the caller to the first loud frame at the app.

    For SIP calls, where frames cannot be paired one by one: the gateway's jitter buffer adds
    concealment frames and drops late ones, so counts differ. ``onsets`` are the send times of
    each tone's first packet; ``received`` is (arrival, PCM16 payload) per inbound frame at the
    app, sorted. An onset with no loud frame within ``max_wait_s`` is skipped.
    """
    flags = [(t, is_loud(payload)) for t, payload in received]
    return onset_latencies_flags_ms(onsets, flags, window=window, max_wait_s=max_wait_s)


def onset_latencies_flags_ms(
    onsets: Sequence[float],
    received: Sequence[tuple[float, bool]],
    *,
    window: tuple[float, float] | None = None,
    max_wait_s: float = 1.0,
) -> list[float]:
    """:func:`onset_latencies_ms` over (arrival, loud) per frame: the lean app
    (bench/lean_app.py) decides loudness as each frame arrives and keeps no audio."""
    out: list[float] = []
    k = 0
    for onset in onsets:
        if window is not None and not (window[0] <= onset < window[1]):
            continue
        while k < len(received) and received[k][0] < onset:
            k += 1
        j = k
        while j < len(received) and received[j][0] <= onset + max_wait_s:
            if received[j][1]:
                out.append((received[j][0] - onset) * 1000.0)
                break
            j += 1
    return out


def audio_frames_between(media: Sequence[tuple[float, int]], start: float, end: float) -> int:
    """20 ms frames of gateway audio that reached the caller in [start, end).

    ``media`` is (arrival time, payload bytes) per media message; bytes are summed and rounded
    up to whole frames, as the gateway pads a short last frame with silence.
    """
    total = sum(n for t, n in media if start <= t < end)
    return math.ceil(total / FRAME_BYTES)


def playing_at(heard: Sequence[tuple[float, bytes, int]], t: float) -> bool:
    """Whether the caller's playout was playing gateway audio at instant ``t``.

    ``heard`` is a caller's ``heard_frames()`` (bench/lean_twilio.py, bench/sip_caller.py):
    (tick start, frame, audio bytes in it).
    """
    for start, _frame, n in heard:
        if start <= t < start + FRAME_S:
            return start + n / 8000.0 > t
        if start > t:
            return False
    return False


@dataclass(frozen=True)
class BurstOutcome:
    """One burst the app played: how many frames were due and how many arrived."""

    expected_frames: int
    received_frames: int

    @property
    def lost(self) -> int:
        return max(0, self.expected_frames - self.received_frames)

    @property
    def extra(self) -> int:
        return max(0, self.received_frames - self.expected_frames)


def burst_frames_lost(outcomes: Sequence[BurstOutcome]) -> tuple[int, int, int]:
    """(frames expected, frames lost, extra frames) over the bursts."""
    expected = sum(o.expected_frames for o in outcomes)
    lost = sum(o.lost for o in outcomes)
    extra = sum(o.extra for o in outcomes)
    return expected, lost, extra
