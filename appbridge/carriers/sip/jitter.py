"""An adaptive, bounded jitter buffer for one incoming RTP audio stream.

Theory of operation
-------------------
Packets are kept in a dict keyed by their *extended* sequence number (the 16-bit RTP sequence
unwrapped against the highest one seen, RFC 3550 appendix A.1), so reordering and the wrap at
65535 need no special case. Playout runs on a timeline anchored when playback starts: the frame
with RTP timestamp `ts` is due at ``t0 + (ts - ts0) / rate``. The media clock calls `pop(now)`
every 20 ms tick (and again while it returns frames, so a late tick catches up); a frame is
handed out once it is due (half a frame of tolerance absorbs tick jitter).

*Delay.* Every packet's relative transit time ``arrival - ts / rate`` goes into a window of the
last `window_packets` arrivals (`SlidingRange`: its smallest and largest are kept as packets come,
so no read scans the window). The playout offset ``t0 - ts0 / rate`` minus the smallest transit
is the delay the fastest packets see (`current_delay_ms`); the largest minus the smallest transit
(the spread) is the delay the stream needs so that its slowest packets are still on time. A gap
is concealed half a frame before its slot, so the target is ``max(spread + half a frame,
jitter_factor * J)``, clamped to ``[min_delay_ms, max_delay_ms]``, where J is the interarrival
jitter of RFC 3550 section 6.4.1. The delay adapts **up** at once when a packet
misses its slot (the offset grows by whole frames, which makes pop return nothing for those
ticks, never fake audio) and **down** by one frame per `adapt_interval_frames` when the delay
exceeds the target by more than a frame (frames are then handed out early; none is dropped).
When playback starts again after a pause and its first packet came more than the largest delay
later than the window's fastest, the path's delay has stepped up (a sender that lost time, a new
route): the window then restarts from the packets buffered now (`rebased`), since anchoring on
the old floor would put every coming frame in the past.

*Gaps.* When the next frame is due and its packet has not come, the packet is at least the
target delay late relative to its successors: pop returns a concealment frame (a repeat of the
last payload once, then silence, or silence only) and the sequence moves on, so a packet that
turns up later is late: dropped and counted. With nothing buffered at all the stream has paused
(silence suppression, an RFC 4733 event, hold): after a few concealment frames playback stops,
and the next packet starts it again after the target delay.

*Bounds.* At most `capacity_packets` packets are held and the span from the next frame to the
newest packet never exceeds it; older packets give way (`overflow`). A sequence or timestamp
jump that cannot be a delay (a restarted stream) resets playback (`resyncs`); what was still
buffered of the old stream, at most the target delay, is dropped (`flushed`), as on an SSRC
change.

Telephone-event packets (RFC 4733) do not belong here: their timestamps mark event starts, not
media time. The call leg routes them to `dtmf4733.Rfc4733Receiver` by payload type.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from appbridge.carriers.sip.rtp import InterarrivalJitter, RtpPacket, seq_delta

__all__ = ["JitterBuffer", "JitterFrame", "JitterStats", "SlidingRange"]

_EXT_BASE: Final = 1 << 20  # keeps extended sequence numbers positive after early reordering
_MAX_FRAME_S: Final = 0.2  # a packet longer than this is not a telephony frame
_COMPACT_AT: Final = 64  # SlidingRange drops its departed entries this many at a time
_DISCONTINUITY_S: Final = 0.5  # a packet this far off the timeline restarts playback


def _signed32(value: int) -> int:
    return ((value + 0x8000_0000) & 0xFFFF_FFFF) - 0x8000_0000


@dataclass(slots=True, init=False)
class JitterFrame:
    """One frame of playout. `payload` is b"" for a silence concealment frame; the caller
    decodes `duration_units` of silence then. Not frozen: one is made per frame, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__`` (0.85 µs instead of
    0.23 µs here); nothing changes one after it is made."""

    payload: bytes
    payload_type: int | None
    sequence: int
    timestamp: int
    duration_units: int
    concealed: bool
    marker: bool = False

    def __init__(  # written out: see RtpPacket
        self,
        payload: bytes,
        payload_type: int | None,
        sequence: int,
        timestamp: int,
        duration_units: int,
        concealed: bool,
        marker: bool = False,
    ) -> None:
        self.payload = payload
        self.payload_type = payload_type
        self.sequence = sequence
        self.timestamp = timestamp
        self.duration_units = duration_units
        self.concealed = concealed
        self.marker = marker


class _WindowMinimum:
    """The smallest of the values pushed whose push count is above the last departed one: a
    monotonic queue (values with the push count that brought each in), in lists read from a
    head index and compacted every `_COMPACT_AT` departures (compiled, a list index is a C array
    read where a deque index is a call)."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.pushes: list[int] = []
        self.head = 0

    def clear(self) -> None:
        self.values.clear()
        self.pushes.clear()
        self.head = 0

    def push(self, value: float, at: int, gone: int) -> None:
        """Add push number `at`; push number `gone` (and every earlier one) has left."""
        values, pushes, head = self.values, self.pushes, self.head
        while len(values) > head and values[-1] >= value:
            values.pop()
            pushes.pop()
        values.append(value)
        pushes.append(at)
        if pushes[head] <= gone:
            head += 1
            if head >= _COMPACT_AT:
                del values[:head]
                del pushes[:head]
                head = 0
            self.head = head

    def front(self) -> float:
        return self.values[self.head]


class SlidingRange:
    """The smallest and the largest of the last `size` values pushed.

    Two monotonic queues (`_WindowMinimum`; the largest is the smallest of the negated values):
    a new value removes every queued value it makes irrelevant (no larger one can be the minimum
    while it is in the window) and the oldest entry leaves once it falls out of the window. Each
    value enters and leaves each queue once, so a push costs O(1) amortised and a read O(1),
    where `min`/`max` over a deque of the window read all of it.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("the window needs at least one value")
        self._size = size
        self._pushed = 0
        self._lo = _WindowMinimum()
        self._hi = _WindowMinimum()

    def __len__(self) -> int:
        return min(self._pushed, self._size)

    def clear(self) -> None:
        self._pushed = 0
        self._lo.clear()
        self._hi.clear()

    def push(self, value: float) -> None:
        at = self._pushed
        self._pushed = at + 1
        gone = at - self._size  # the push that leaves the window now
        self._lo.push(value, at, gone)
        self._hi.push(-value, at, gone)

    @property
    def smallest(self) -> float:
        """The smallest value in the window; IndexError when nothing was pushed."""
        return self._lo.front()

    @property
    def largest(self) -> float:
        """The largest value in the window; IndexError when nothing was pushed."""
        return -self._hi.front()


@dataclass(slots=True)
class JitterStats:
    pushed: int = 0
    played: int = 0
    late: int = 0
    duplicates: int = 0
    concealed: int = 0
    overflow: int = 0
    resyncs: int = 0
    flushed: int = 0  # packets still buffered when a resync restarted playback
    underruns: int = 0
    grown_frames: int = 0
    shrunk_frames: int = 0
    rebased: int = 0  # restarts whose delay floor was renewed (a step up in the path's delay)


class JitterBuffer:
    """Adaptive playout buffer (module doc); `push(packet, now)`, `pop(now)`."""

    def __init__(
        self,
        *,
        clock_rate_hz: int = 8000,
        frame_ms: int = 20,
        min_delay_ms: int = 20,
        max_delay_ms: int = 200,
        jitter_factor: float = 3.0,
        concealment: Literal["repeat", "silence"] = "repeat",
        capacity_packets: int | None = None,
        window_packets: int = 100,
        adapt_interval_frames: int = 10,
    ) -> None:
        if not 0 < min_delay_ms <= max_delay_ms:
            raise ValueError("need 0 < min_delay_ms <= max_delay_ms")
        if clock_rate_hz <= 0 or frame_ms <= 0:
            raise ValueError("clock rate and frame length must be positive")
        self._rate_hz = clock_rate_hz
        self._frame_s = frame_ms / 1000
        self._tol_s = self._frame_s / 2
        self._min_s = min_delay_ms / 1000
        self._max_s = max_delay_ms / 1000
        self._factor = jitter_factor
        self._repeat = concealment == "repeat"
        self._capacity = capacity_packets or math.ceil(2 * self._max_s / self._frame_s) + 4
        self._adapt_every = adapt_interval_frames
        self._window = SlidingRange(window_packets)
        self._jitter = InterarrivalJitter(clock_rate_hz)
        self.stats = JitterStats()
        self._target_s = self._min_s
        self._reset_stream()

    # -- state ---------------------------------------------------------------------------

    def _reset_stream(self) -> None:
        self._buf: dict[int, tuple[RtpPacket, float]] = {}
        self._highest: int | None = None
        self._next: int | None = None
        self._next_ts = 0
        self._packet_units = round(self._frame_s * self._rate_hz)
        self._playing = False
        self._fill_start: float | None = None
        self._t0 = 0.0
        self._ts0 = 0
        self._conceal_run = 0
        self._last_payload = b""
        self._played: deque[int] = deque(maxlen=64)
        self._last_played_ext = -1
        self._last_played_ts = 0
        self._since_adapt = 0
        self._ts_ref: int | None = None
        self._ts_ref_ext = 0
        self._window.clear()
        self._jitter.reset()

    def reset(self) -> None:
        """Forgets the stream (new SSRC, re-latched source, re-INVITE); stats are kept."""
        self._reset_stream()

    def __len__(self) -> int:
        return len(self._buf)

    @property
    def playing(self) -> bool:
        return self._playing

    @property
    def target_delay_ms(self) -> float:
        return self._target_s * 1000

    @property
    def current_delay_ms(self) -> float:
        """Delay of the fastest recent packets: playout offset minus the smallest transit."""
        if not self._playing or not len(self._window):
            return 0.0
        return (self._offset_s() - self._window.smallest) * 1000

    @property
    def jitter_ms(self) -> float:
        return self._jitter.jitter_s * 1000

    @property
    def capacity_packets(self) -> int:
        return self._capacity

    # -- timeline ------------------------------------------------------------------------

    def _ts_ext(self, ts: int) -> int:
        """Unwraps a 32-bit timestamp against a moving reference."""
        if self._ts_ref is None:
            self._ts_ref = ts
            self._ts_ref_ext = ts
            return ts
        ext = self._ts_ref_ext + _signed32(ts - self._ts_ref)
        if ext > self._ts_ref_ext:
            self._ts_ref, self._ts_ref_ext = ts, ext
        return ext

    def _due(self, ts: int) -> float:
        return self._t0 + _signed32(ts - self._ts0) / self._rate_hz

    def _offset_s(self) -> float:
        """Playout offset in the transit frame of reference: t0 - ts0/rate (unwrapped)."""
        return self._t0 - self._ts_ext_peek(self._ts0) / self._rate_hz

    def _ts_ext_peek(self, ts: int) -> int:
        if self._ts_ref is None:
            return ts
        return self._ts_ref_ext + _signed32(ts - self._ts_ref)

    # -- input ---------------------------------------------------------------------------

    def push(self, packet: RtpPacket, now: float) -> bool:
        """Stores a packet; False when it was dropped (late, duplicate, or out of bounds)."""
        stats = self.stats
        stats.pushed += 1
        seq = packet.sequence
        if self._highest is None:
            ext = _EXT_BASE + seq
        else:
            ext = self._highest + seq_delta(seq, self._highest & 0xFFFF)
        nxt = self._next
        if nxt is not None and ext < nxt:
            if ext in self._played:
                stats.duplicates += 1
            else:
                stats.late += 1
                if self._playing:
                    self._grow(now - self._due(packet.timestamp))
            return False
        if ext in self._buf:
            stats.duplicates += 1
            return False
        jump = self._highest is not None and ext - self._highest > self._capacity
        off_timeline = self._playing and not (
            now - _DISCONTINUITY_S
            < self._due(packet.timestamp)
            < now + self._max_s + _DISCONTINUITY_S
        )
        if jump or off_timeline:
            # More loss than the buffer spans, or a timestamp that cannot be network delay:
            # a restarted stream. Rebuffer from this packet rather than conceal a burst.
            stats.resyncs += 1
            stats.flushed += len(self._buf)
            self._reset_stream()
            ext = _EXT_BASE + seq
        self._jitter.update(packet.timestamp, now)
        self._window.push(now - self._ts_ext(packet.timestamp) / self._rate_hz)
        self._buf[ext] = (packet, now)
        if self._highest is None or ext > self._highest:
            self._highest = ext
        self._learn_duration(ext, packet)
        if self._fill_start is None:
            self._fill_start = now
        self._enforce_bounds()
        return True

    def _learn_duration(self, ext: int, packet: RtpPacket) -> None:
        """Learns the packet time from neighbours (a 30 ms sender works on a 20 ms tick too)."""
        prev = self._buf.get(ext - 1)
        if prev is not None:
            prev_ts: int | None = prev[0].timestamp
        else:
            prev_ts = self._last_played_ts if ext - 1 == self._last_played_ext else None
        if prev_ts is not None:
            units = _signed32(packet.timestamp - prev_ts)
            if 0 < units <= _MAX_FRAME_S * self._rate_hz:
                self._packet_units = units

    def _enforce_bounds(self) -> None:
        assert self._highest is not None
        floor = self._highest - self._capacity + 1
        if self._next is not None:
            if self._next < floor:
                self._next = floor
                self._conceal_run = 0
            elif len(self._buf) <= self._capacity:
                return  # every buffered packet is at or above the next one: within bounds
        while len(self._buf) > self._capacity or (self._buf and min(self._buf) < floor):
            oldest = min(self._buf)
            del self._buf[oldest]
            self.stats.overflow += 1
            if self._next is not None and self._next <= oldest:
                self._next = oldest + 1

    # -- adaptation ----------------------------------------------------------------------

    def _compute_target(self) -> float:
        window = self._window
        spread = window.largest - window.smallest if len(window) else 0.0
        want = max(spread + self._tol_s, self._factor * self._jitter.jitter_s)
        return min(self._max_s, max(self._min_s, want))

    def _grow(self, lateness_s: float) -> None:
        """A packet missed its slot by `lateness_s`: add whole frames of delay at once."""
        frames = max(1, math.ceil((lateness_s - self._tol_s) / self._frame_s))
        room = math.floor((self._max_s - self.current_delay_ms / 1000) / self._frame_s + 1e-9)
        frames = min(frames, max(0, room))
        if frames:
            self._t0 += frames * self._frame_s
            self.stats.grown_frames += frames

    def _adapt(self) -> None:
        self._target_s = self._compute_target()
        current = self.current_delay_ms / 1000
        if current < self._target_s - self._tol_s:
            frames = math.ceil((self._target_s - current) / self._frame_s - 1e-9)
            self._t0 += frames * self._frame_s
            self.stats.grown_frames += frames
        elif current > self._max_s:
            frames = math.floor((current - self._target_s) / self._frame_s)
            self._t0 -= frames * self._frame_s
            self.stats.shrunk_frames += frames
        elif current > self._target_s + self._frame_s:
            self._t0 -= self._frame_s
            self.stats.shrunk_frames += 1

    # -- output --------------------------------------------------------------------------

    def pop(self, now: float) -> JitterFrame | None:
        """The frame due at `now`, a concealment frame for a gap, or None (not yet, or idle)."""
        if not self._playing and not self._start(now):
            return None
        nxt = self._next
        assert nxt is not None
        entry = self._buf.get(nxt)
        due = self._due(entry[0].timestamp if entry is not None else self._next_ts)
        if due > now + self._tol_s:
            return None
        if entry is None:
            if self._buf:
                # Re-estimate the missing frame's timestamp from the next buffered packet, so
                # the concealment keeps time even after a timestamp jump.
                lo = min(self._buf)
                est = self._buf[lo][0].timestamp - (lo - nxt) * self._packet_units
                if _signed32(est - self._next_ts) > 0:
                    self._next_ts = est & 0xFFFF_FFFF
                    if self._due(self._next_ts) > now + self._tol_s:
                        return None
            return self._conceal(nxt)
        return self._take(nxt, entry[0])

    def pop_ready(self, now: float) -> JitterFrame | None:
        """The next frame in sequence if its packet is already here, before its playout time:
        in-order delivery for consumers that need no smoothing (the app and the ears buffer on
        their side). Playback starts at once rather than after the target delay. A gap is not
        filled here: `pop` conceals it once the missing packet is overdue on the timeline, which
        keeps the target delay, so reordering within it still plays in order."""
        if not self._playing and not self._start(now, force=True):
            return None
        nxt = self._next
        assert nxt is not None
        entry = self._buf.get(nxt)
        if entry is None:
            return None
        return self._take(nxt, entry[0])

    def _take(self, nxt: int, packet: RtpPacket) -> JitterFrame:
        del self._buf[nxt]
        self._next = nxt + 1
        after = self._buf.get(nxt + 1)
        units = self._packet_units
        if after is not None:
            gap = _signed32(after[0].timestamp - packet.timestamp)
            if 0 < gap <= _MAX_FRAME_S * self._rate_hz:
                units = gap
        self._next_ts = (packet.timestamp + units) & 0xFFFF_FFFF
        self._conceal_run = 0
        self._last_payload = packet.payload
        self._played.append(nxt)
        self._last_played_ext = nxt
        self._last_played_ts = packet.timestamp
        self.stats.played += 1
        self._since_adapt += 1
        if self._since_adapt >= self._adapt_every:
            self._since_adapt = 0
            self._adapt()
        return JitterFrame(
            packet.payload,
            packet.payload_type,
            packet.sequence,
            packet.timestamp,
            units,
            False,
            packet.marker,
        )

    def _start(self, now: float, *, force: bool = False) -> bool:
        if not self._buf or self._fill_start is None:
            return False
        self._target_s = self._compute_target()
        if not force and now + 1e-9 < self._fill_start + self._target_s:
            return False
        first = min(self._buf)
        packet, arrived = self._buf[first]
        if self._transit(packet, arrived) - self._window.smallest > self._max_s + self._tol_s:
            self._rebase_window()
            self._target_s = self._compute_target()
        self._next = first
        self._next_ts = packet.timestamp
        # Anchor so that the fastest recent packets wait the target delay; a first packet that
        # came slowly then plays at once instead of adding its lateness to the whole call.
        ideal_t0 = self._window.smallest + self._target_s
        ideal_t0 += self._ts_ext_peek(packet.timestamp) / self._rate_hz
        # A forced start (in-order delivery, `pop_ready`) keeps the target delay on the timeline
        # so that `pop` still waits that long before it conceals a gap.
        self._t0 = ideal_t0 if force else min(now, ideal_t0)
        self._ts0 = packet.timestamp
        self._playing = True
        self._since_adapt = 0
        return True

    def _transit(self, packet: RtpPacket, arrived: float) -> float:
        return arrived - self._ts_ext_peek(packet.timestamp) / self._rate_hz

    def _rebase_window(self) -> None:
        """The transits seen before a step up in delay are no floor any more (module doc,
        *Delay*): anchored on them, each coming packet would be followed by a burst of
        concealment, so the window restarts from the packets buffered now."""
        self._window.clear()
        for ext in sorted(self._buf):
            packet, arrived = self._buf[ext]
            self._window.push(self._transit(packet, arrived))
        self.stats.rebased += 1

    def _conceal(self, nxt: int) -> JitterFrame | None:
        if not self._buf:
            limit = max(2, math.ceil(self._target_s / self._frame_s))
            if self._conceal_run >= limit:
                # Nothing buffered for a while: the stream paused. Rebuffer when it resumes,
                # from the first concealed sequence number: with nothing received after them,
                # those were guesses, and the sender's next packet may carry that number.
                self._next = nxt - self._conceal_run
                self._conceal_run = 0
                self._playing = False
                self._fill_start = None
                self.stats.underruns += 1
                return None
        payload = self._last_payload if self._repeat and self._conceal_run == 0 else b""
        self._conceal_run += 1
        self.stats.concealed += 1
        ts = self._next_ts
        self._next = nxt + 1
        self._next_ts = (ts + self._packet_units) & 0xFFFF_FFFF
        return JitterFrame(payload, None, nxt & 0xFFFF, ts, self._packet_units, True)
