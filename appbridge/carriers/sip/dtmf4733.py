"""RFC 4733 telephone-events: keypresses carried in RTP, both ways.

Theory of operation
-------------------
Payload (RFC 4733 section 2.3): event code (8 bits), E = end (1), R (1), volume in -dBm0 (6),
duration in timestamp units (16 bits). Events 0-9, 10 = ``*``, 11 = ``#``, 12-15 = A-D are the
DTMF digits (section 3.2); 16 is flash, negotiated with ``0-16`` but not a digit. Several events
may share one packet (section 2.5.1.5); each is four bytes and the later ones start where the
earlier ones end.

*Receiving* (section 2.5.2). An event is identified by its RTP timestamp (its start time, the
same in every packet of the event). The first packet of a new event, whichever it is (the
marker packet may be lost), yields ONE `DtmfDigit`; later updates, the end packet and its
retransmissions (the sender repeats the final packet three times, section 2.5.1.4) only update
or close that event. A packet of an event older than the current one is stale and ignored. An
event that never reports its end is closed `event_timeout_s` after its last packet (`poll`); a
sender that reuses the timestamp of an ended event for a new keypress (seen on devices whose RTP
clock stops when no audio flows) starts a new event when the packet is not an end packet and
arrives at least `reuse_guard_s` after the end.

*Sending* (section 2.5.1). Each digit starts with a packet carrying the marker bit and duration
0, then updates every `update_interval_ms` with the duration so far (computed from the schedule,
not from when the media clock happened to poll, so durations are exact multiples), then the end
packet with the full duration and E set, three times, `end_interval_ms` apart, all with the
event's start timestamp. The next digit starts `gap_ms` after the last end packet. ``,`` in the
digits is a pause of `pause_ms`. The call leg stops audio (and keeps its RTP clock going with
`RtpSender.skip`) while `busy` is true, and passes the sender's clock to `poll`.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DIGIT_EVENTS",
    "DtmfDigit",
    "EventPacket",
    "Rfc4733Receiver",
    "Rfc4733Sender",
    "TelephoneEvent",
    "TelephoneEventError",
    "TelephoneEventStats",
]

_EVENT: Final = struct.Struct("!BBH")
_DIGITS: Final = "0123456789*#ABCD"
#: Digit character to RFC 4733 event code (section 3.2, table 3).
DIGIT_EVENTS: Final[dict[str, int]] = {d: i for i, d in enumerate(_DIGITS)}
_MAX_DURATION_UNITS: Final = 0xFFFF
_EPSILON_S: Final = 1e-9  # float sums of schedule offsets must not slip a poll


class TelephoneEventError(ValueError):
    """A telephone-event payload that is not 4-byte events (RFC 4733 section 2.3)."""


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """One 4-byte telephone-event record."""

    event: int
    end: bool
    volume: int
    duration_units: int

    @classmethod
    def parse_all(cls, payload: bytes) -> list[TelephoneEvent]:
        """All events of a payload; raises `TelephoneEventError` when it is not a whole,
        non-zero number of 4-byte records."""
        n = len(payload)
        if n == 0 or n % 4:
            raise TelephoneEventError(f"telephone-event payload of {n} bytes")
        out = []
        for offset in range(0, n, 4):
            event, flags, duration = _EVENT.unpack_from(payload, offset)
            out.append(cls(event, bool(flags & 0x80), flags & 0x3F, duration))
        return out

    def serialize(self) -> bytes:
        if not 0 <= self.event <= 255 or not 0 <= self.volume <= 63:
            raise TelephoneEventError("event is 0..255 and volume 0..63")
        if not 0 <= self.duration_units <= _MAX_DURATION_UNITS:
            raise TelephoneEventError("duration is 0..65535 timestamp units")
        flags = (0x80 if self.end else 0) | self.volume
        return _EVENT.pack(self.event, flags, self.duration_units)


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    """A keypress: reported once per event. `duration_units` is what was known when it was
    reported (0 at the start; the full length for a timeout report)."""

    digit: str
    event: int
    timestamp: int
    duration_units: int


@dataclass(slots=True)
class TelephoneEventStats:
    events: int = 0
    ended: int = 0
    timed_out: int = 0
    retransmissions: int = 0
    stale: int = 0
    invalid: int = 0
    non_digit: int = 0


def _ts_newer(a: int, b: int) -> bool:
    """True when 32-bit timestamp `a` is after `b` (serial arithmetic)."""
    return 0 < ((a - b) & 0xFFFF_FFFF) < 0x8000_0000


class Rfc4733Receiver:
    """Turns telephone-event payloads into one `DtmfDigit` per keypress (module doc)."""

    def __init__(self, *, event_timeout_s: float = 0.5, reuse_guard_s: float = 0.25) -> None:
        self._timeout_s = event_timeout_s
        self._guard_s = reuse_guard_s
        self._ts: int | None = None  # timestamp of the current (latest) event
        self._event = -1
        self._duration = 0
        self._active = False
        self._ended_at = 0.0
        self._last_packet_s = 0.0
        self.stats = TelephoneEventStats()

    @property
    def active_digit(self) -> str | None:
        """The digit being pressed now, if any (the leg may mute in-band audio meanwhile)."""
        if self._active and 0 <= self._event < len(_DIGITS):
            return _DIGITS[self._event]
        return None

    def next_deadline(self) -> float | None:
        return self._last_packet_s + self._timeout_s if self._active else None

    def poll(self, now: float) -> list[DtmfDigit]:
        """Closes an event whose end never came; returns it (already reported at its start)."""
        if self._active and now >= self._last_packet_s + self._timeout_s:
            self._active = False
            self._ended_at = now
            self.stats.timed_out += 1
            assert self._ts is not None
            if 0 <= self._event < len(_DIGITS):
                return [DtmfDigit(_DIGITS[self._event], self._event, self._ts, self._duration)]
        return []

    def receive(self, payload: bytes, *, timestamp: int, now: float) -> list[DtmfDigit]:
        """Handles one telephone-event packet; returns the keypresses that start in it."""
        self.poll(now)
        try:
            events = TelephoneEvent.parse_all(payload)
        except TelephoneEventError:
            self.stats.invalid += 1
            return []
        out: list[DtmfDigit] = []
        ts = timestamp & 0xFFFF_FFFF
        for ev in events:
            digit = self._one(ev, ts, now)
            if digit is not None:
                out.append(digit)
            ts = (ts + ev.duration_units) & 0xFFFF_FFFF
        return out

    def _one(self, ev: TelephoneEvent, ts: int, now: float) -> DtmfDigit | None:
        stats = self.stats
        same = self._ts is not None and ts == self._ts
        if same and not self._active:
            reused = not ev.end and now - self._ended_at >= self._guard_s
            if not reused:
                stats.retransmissions += 1
                return None
        elif self._ts is not None and not same and not _ts_newer(ts, self._ts):
            stats.stale += 1
            return None
        self._last_packet_s = now
        if same and self._active:
            if ev.event != self._event:
                stats.invalid += 1
                return None
            self._duration = max(self._duration, ev.duration_units)
            if ev.end:
                self._close(now)
            return None
        # A new event: a new timestamp, or a reused one after the guard time.
        if self._active:
            self._close(now)  # the previous event's end was lost; a new start ends it
        self._ts = ts
        self._event = ev.event
        self._duration = ev.duration_units
        self._active = True
        stats.events += 1
        if ev.end:
            self._close(now)
        if ev.event >= len(_DIGITS):
            stats.non_digit += 1
            return None
        return DtmfDigit(_DIGITS[ev.event], ev.event, ts, ev.duration_units)

    def _close(self, now: float) -> None:
        self._active = False
        self._ended_at = now
        self.stats.ended += 1


@dataclass(frozen=True, slots=True)
class EventPacket:
    """What the call leg sends with `RtpSender.event(payload, timestamp=, marker=)`."""

    payload: bytes
    timestamp: int
    marker: bool
    end: bool


@dataclass(slots=True)
class _Digit:
    event: int
    start_s: float
    timestamp: int | None = None
    next_index: int = 0  # index into the digit's packet schedule


class Rfc4733Sender:
    """Schedules the telephone-event packets of queued digits (module doc)."""

    def __init__(
        self,
        *,
        clock_rate_hz: int = 8000,
        tone_ms: int = 100,
        gap_ms: int = 50,
        pause_ms: int = 500,
        update_interval_ms: int = 50,
        end_interval_ms: int = 20,
        end_repeats: int = 3,
        volume: int = 10,
    ) -> None:
        if tone_ms * clock_rate_hz // 1000 > _MAX_DURATION_UNITS:
            raise ValueError("tone too long for one event's 16-bit duration")
        if not (tone_ms > 0 and update_interval_ms > 0 and end_repeats >= 1 and 0 <= volume < 64):
            raise ValueError("invalid RFC 4733 sender parameters")
        self._rate_hz = clock_rate_hz
        self._tone_s = tone_ms / 1000
        self._gap_s = gap_ms / 1000
        self._pause_s = pause_ms / 1000
        self._update_s = update_interval_ms / 1000
        self._end_s = end_interval_ms / 1000
        self._volume = volume
        self._tone_units = tone_ms * clock_rate_hz // 1000
        # The schedule of one digit: (offset_s, duration_units, end) for every packet.
        sched: list[tuple[float, int, bool]] = []
        k = 0
        while k * self._update_s < self._tone_s - 1e-9:
            units = round(k * update_interval_ms * clock_rate_hz / 1000)
            sched.append((k * self._update_s, units, False))
            k += 1
        for i in range(end_repeats):
            sched.append((self._tone_s + i * self._end_s, self._tone_units, True))
        self._schedule = tuple(sched)
        self._digit_s = self._schedule[-1][0]
        self._queue: deque[int | None] = deque()  # event codes; None for a pause
        self._current: _Digit | None = None
        self._free_at = float("-inf")  # when the next digit may start
        self.digits_sent = 0

    @property
    def busy(self) -> bool:
        """True while a digit is being sent or waits its turn (audio must not be sent)."""
        return self._current is not None or bool(self._queue)

    def send(self, digits: str, now: float) -> None:
        """Queues digits (0-9, *, #, A-D; ',' pauses). Raises ValueError for anything else,
        before queueing any of them."""
        codes: list[int | None] = []
        for ch in digits.upper():
            if ch == ",":
                codes.append(None)
            elif ch in DIGIT_EVENTS:
                codes.append(DIGIT_EVENTS[ch])
            else:
                raise ValueError(f"{ch!r} is not a DTMF digit")
        if not self.busy:
            self._free_at = max(self._free_at, now)
        self._queue.extend(codes)

    def cancel(self) -> None:
        """Drops queued digits; a digit already started still finishes with its end packets,
        so the far end never sees a stuck key."""
        self._queue.clear()

    def next_deadline(self) -> float | None:
        if self._current is not None:
            return self._current.start_s + self._schedule[self._current.next_index][0]
        if self._queue:
            return self._free_at
        return None

    def poll(self, now: float, rtp_timestamp: int) -> list[EventPacket]:
        """Packets due by `now`. `rtp_timestamp` is the sender's media clock, which becomes the
        timestamp of a digit that starts in this call (RFC 4733 section 2.3.1)."""
        out: list[EventPacket] = []
        while True:
            cur = self._current
            if cur is None:
                if not self._queue or now + _EPSILON_S < self._free_at:
                    return out
                code = self._queue.popleft()
                if code is None:
                    self._free_at += self._pause_s
                    continue
                # Polled late (a stalled tick): shift the digit rather than burst its packets.
                start_s = self._free_at if now - self._free_at <= self._end_s else now
                cur = self._current = _Digit(code, start_s)
            if cur.timestamp is None:
                cur.timestamp = rtp_timestamp & 0xFFFF_FFFF
            while cur.next_index < len(self._schedule):
                offset, units, end = self._schedule[cur.next_index]
                if now + _EPSILON_S < cur.start_s + offset:
                    return out
                payload = _EVENT.pack(cur.event, (0x80 if end else 0) | self._volume, units)
                out.append(EventPacket(payload, cur.timestamp, cur.next_index == 0, end))
                cur.next_index += 1
            self._current = None
            self._free_at = cur.start_s + self._digit_s + self._gap_s
            self.digits_sent += 1
