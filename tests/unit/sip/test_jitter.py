"""The adaptive jitter buffer in virtual time: a lossy, jittery fake link feeds `push`, a 20 ms
media clock calls `pop` (draining what is due on each tick)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appbridge.carriers.sip.jitter import JitterBuffer, JitterFrame, SlidingRange
from appbridge.carriers.sip.rtp import RtpPacket
from appbridge.clock import VirtualClock

TICK_S = 0.020
T0 = 1000.0


def payload(i: int) -> bytes:
    return i.to_bytes(4, "big") * 40  # 160 bytes, distinct per packet


def stream(
    n: int,
    *,
    first_seq: int = 1000,
    first_ts: int = 5000,
    units: int = 160,
    period_s: float = TICK_S,
) -> list[tuple[float, RtpPacket]]:
    """(send time, packet) for `n` packets of one stream."""
    return [
        (
            T0 + i * period_s,
            RtpPacket(
                0, (first_seq + i) & 0xFFFF, (first_ts + i * units) & 0xFFFFFFFF, 1, payload(i)
            ),
        )
        for i in range(n)
    ]


def simulate(
    jb: JitterBuffer,
    sends: Iterable[tuple[float, RtpPacket]],
    *,
    delay_s: Callable[[int], float | None] = lambda i: 0.005,
    until_s: float | None = None,
    from_s: float = T0,
    tick_phase_s: float = 0.013,
    ready: bool = False,
) -> list[tuple[float, JitterFrame]]:
    """Runs the link and the media clock; `delay_s(i)` None drops packet i. With `ready`,
    packets in sequence are handed out on arrival (`pop_ready`), as the call leg does. The
    concealment frames after the last real one (the buffer cannot tell the end of a stream from
    loss until it has waited) are left out of the result."""
    events: list[tuple[float, int, RtpPacket | None]] = []
    last = T0
    for i, (t, p) in enumerate(sends):
        d = delay_s(i)
        last = max(last, t)
        if d is not None:
            events.append((t + d, 0, p))
    end = until_s if until_s is not None else last + 0.6
    k = 0
    while from_s + tick_phase_s + k * TICK_S <= end:
        events.append((from_s + tick_phase_s + k * TICK_S, 1, None))
        k += 1
    events.sort(key=lambda e: (e[0], e[1]))
    clock = VirtualClock(start=from_s)
    out: list[tuple[float, JitterFrame]] = []
    for t, _kind, p in events:
        clock.advance(max(0.0, t - clock.now()))
        if p is not None:
            if jb.push(p, clock.now()) and ready:
                while (frame := jb.pop_ready(clock.now())) is not None:
                    out.append((clock.now(), frame))
            continue
        while (frame := jb.pop(clock.now())) is not None:
            out.append((clock.now(), frame))
    while out and out[-1][1].concealed:
        out.pop()
    return out


def concealed(frames: list[tuple[float, JitterFrame]]) -> int:
    return sum(f.concealed for _, f in frames)


def real(frames: list[tuple[float, JitterFrame]]) -> list[JitterFrame]:
    return [f for _, f in frames if not f.concealed]


def test_in_order_stream_plays_every_frame_once_after_the_minimum_delay() -> None:
    jb = JitterBuffer()
    frames = simulate(jb, stream(50))
    assert [f.sequence for f in real(frames)] == list(range(1000, 1050))
    assert all(not f.concealed for _, f in frames)
    assert [f.payload for _, f in frames] == [payload(i) for i in range(50)]
    # One frame per tick, and the first one 20..40 ms after it arrived.
    times = [t for t, _ in frames]
    assert all(b - a == pytest.approx(TICK_S) for a, b in itertools.pairwise(times))
    assert 0.020 <= times[0] - (T0 + 0.005) < 0.040
    assert jb.target_delay_ms == pytest.approx(20)
    assert jb.stats.played == 50 and jb.stats.late == 0


def test_reordered_packets_come_out_in_order() -> None:
    sends = stream(20)
    sends[5], sends[6] = (sends[5][0], sends[6][1]), (sends[6][0], sends[5][1])
    sends[10], sends[12] = (sends[10][0], sends[12][1]), (sends[12][0], sends[10][1])
    jb = JitterBuffer(min_delay_ms=60)
    frames = simulate(jb, sends)
    assert [f.sequence for _, f in frames] == list(range(1000, 1020))
    assert concealed(frames) == 0 and jb.stats.late == 0


def test_a_lost_packet_is_concealed_in_its_slot_repeat_then_silence() -> None:
    lost = {7, 12, 13}
    jb = JitterBuffer()
    frames = simulate(jb, stream(20), delay_s=lambda i: None if i in lost else 0.005)
    seqs = [f.sequence for _, f in frames]
    assert seqs == list(range(1000, 1020))
    by_seq = {f.sequence: f for _, f in frames}
    assert by_seq[1007].concealed and by_seq[1007].payload == payload(6)  # repeat
    assert by_seq[1012].concealed and by_seq[1012].payload == payload(11)
    assert by_seq[1013].concealed and by_seq[1013].payload == b""  # then silence
    assert by_seq[1013].duration_units == 160 and by_seq[1013].timestamp == 5000 + 13 * 160
    assert concealed(frames) == 3
    times = [t for t, _ in frames]
    assert all(b - a == pytest.approx(TICK_S) for a, b in itertools.pairwise(times))


def test_silence_concealment_mode() -> None:
    jb = JitterBuffer(concealment="silence")
    frames = simulate(jb, stream(10), delay_s=lambda i: None if i == 4 else 0.005)
    assert [f.payload for _, f in frames if f.concealed] == [b""]


def test_duplicates_are_dropped_and_counted() -> None:
    sends = stream(10)
    dup_now = [sends[3], sends[3]]  # duplicate while still buffered
    jb = JitterBuffer(min_delay_ms=40)
    frames = simulate(jb, sends[:3] + dup_now + sends[4:])
    assert [f.sequence for _, f in frames] == list(range(1000, 1010))
    assert jb.stats.duplicates == 1
    # A copy of an already played packet is a duplicate too, not "late".
    assert jb.push(sends[0][1], T0 + 1.0) is False
    assert jb.stats.duplicates == 2 and jb.stats.late == 0


def test_late_packet_is_dropped_counted_and_grows_the_delay() -> None:
    jb = JitterBuffer()
    frames = simulate(jb, stream(40), delay_s=lambda i: 0.150 if i == 10 else 0.005)
    by_seq = {f.sequence: f for _, f in frames}
    assert by_seq[1010].concealed
    assert jb.stats.late == 1
    assert jb.stats.grown_frames >= 5  # 150 ms late: the delay grew at once
    assert [f.sequence for _, f in frames] == list(range(1000, 1040))


def test_sequence_wraps_at_65535() -> None:
    jb = JitterBuffer()
    sends = stream(30, first_seq=65520, first_ts=2**32 - 1600)
    sends[14], sends[15] = (sends[14][0], sends[15][1]), (sends[15][0], sends[14][1])  # 65534/5
    frames = simulate(jb, sends, delay_s=lambda i: None if i == 17 else 0.004)
    seqs = [f.sequence for _, f in frames]
    assert seqs == [(65520 + i) & 0xFFFF for i in range(30)]
    assert seqs[15:18] == [65535, 0, 1]
    assert [f.concealed for _, f in frames].count(True) == 1
    assert frames[17][1].timestamp == (2**32 - 1600 + 17 * 160) & 0xFFFFFFFF


def test_adapts_up_to_jitter_then_back_down() -> None:
    rng = random.Random(7)
    n = 600  # 12 s: 4 s calm, 4 s of up to 100 ms jitter, 4 s calm
    delays = [
        0.005 + (rng.uniform(0, 0.100) if 200 <= i < 400 else rng.uniform(0, 0.002))
        for i in range(n)
    ]
    jb = JitterBuffer()
    targets: dict[str, float] = {}

    def delay(i: int) -> float:
        return delays[i]

    sends = stream(n)
    frames = simulate(jb, sends[:200], delay_s=delay, until_s=T0 + 4.0)
    targets["calm"] = jb.target_delay_ms
    late_before = jb.stats.late
    frames += simulate(
        jb, sends[200:400], delay_s=lambda i: delays[200 + i], from_s=T0 + 4.0, until_s=T0 + 8.0
    )
    targets["jitter"] = jb.target_delay_ms
    jittery_delay_ms = jb.current_delay_ms
    late_jitter_end = jb.stats.late
    frames += simulate(
        jb, sends[400:], delay_s=lambda i: delays[400 + i], from_s=T0 + 8.0, until_s=T0 + 12.6
    )
    targets["calm again"] = jb.target_delay_ms

    assert targets["calm"] == pytest.approx(20)
    assert 80 <= targets["jitter"] <= 200
    assert jittery_delay_ms >= 80
    assert targets["calm again"] == pytest.approx(20)
    assert jb.current_delay_ms <= 45
    assert jb.stats.shrunk_frames >= 3
    # Few packets late during the jitter: the buffer grew to cover it.
    assert late_jitter_end - late_before <= 20
    # Every packet that was not late is played exactly once, in order.
    seqs = [f.sequence for f in real(frames)]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == n - jb.stats.late


def test_target_never_exceeds_max_delay() -> None:
    rng = random.Random(3)
    jb = JitterBuffer(max_delay_ms=120)
    simulate(jb, stream(300), delay_s=lambda i: rng.uniform(0, 0.500))
    assert jb.target_delay_ms <= 120
    assert jb.current_delay_ms <= 120 + 20


def test_memory_is_bounded_without_pops() -> None:
    jb = JitterBuffer()
    for t, p in stream(1000):
        jb.push(p, t)
        assert len(jb) <= jb.capacity_packets
    assert jb.stats.overflow == 1000 - jb.capacity_packets


def test_reordering_outside_the_span_is_bounded_too() -> None:
    jb = JitterBuffer(capacity_packets=8)
    for i in (0, 7, 3, 5, 1, 6, 2, 4, 12, 9, 14, 15):
        jb.push(RtpPacket(0, i, i * 160, 1, b"x"), T0)
        assert len(jb) <= 8


def test_paused_stream_stops_then_rebuffers() -> None:
    jb = JitterBuffer()
    first = stream(10)
    # The sender pauses 1 s (silence suppression): sequence continues, timestamp jumps.
    second = [
        (t + 1.2, RtpPacket(0, p.sequence + 10, p.timestamp + 10 * 160 + 8000, 1, p.payload))
        for t, p in stream(10)
    ]
    second = [(t, RtpPacket(0, p.sequence, int(p.timestamp), 1, p.payload)) for t, p in second]
    frames = simulate(jb, first + second)
    assert jb.stats.underruns == 2  # the pause, and the end of the stream
    assert concealed(frames) <= 2
    assert [f.sequence for f in real(frames)] == list(range(1000, 1020))
    resumed = next(t for t, f in frames if f.sequence == 1010 and not f.concealed)
    assert 0.020 <= resumed - (T0 + 1.2 + 0.005) < 0.040


def test_sequence_jump_resyncs() -> None:
    jb = JitterBuffer()
    first = stream(10)
    later = [(t + 0.2, p) for t, p in stream(10, first_seq=30000, first_ts=900000)]
    frames = simulate(jb, first + later)
    assert jb.stats.resyncs == 1
    # What the old stream still had buffered (its last packet, at 20 ms of delay) is flushed.
    assert jb.stats.flushed == 1
    assert [f.sequence for f in real(frames)] == list(range(1000, 1009)) + list(range(30000, 30010))


def test_timestamp_discontinuity_resyncs() -> None:
    jb = JitterBuffer()
    first = stream(10)
    later = [(t + 0.2, p) for t, p in stream(10, first_seq=1010, first_ts=10**9)]
    frames = simulate(jb, first + later)
    assert jb.stats.resyncs == 1 and jb.stats.flushed == 1
    assert [f.timestamp for f in real(frames)][9:] == [10**9 + i * 160 for i in range(10)]


@pytest.mark.parametrize("step_s", [0.25, 0.3, 0.45, 1.0])
@pytest.mark.parametrize("ready", [False, True])
def test_a_step_up_in_delay_beyond_the_largest_costs_one_gap(step_s: float, ready: bool) -> None:
    """The path's delay steps up by more than `max_delay_ms` and stays there (a sender whose
    clock fell behind and resynchronised, a new route). The stream pauses for the step, then plays
    every packet once: no packet is late for ever after, and no concealment follows each packet,
    which had stretched 2.2 s of speech to 13 to 17 s."""
    jb = JitterBuffer()
    frames = simulate(
        jb,
        stream(300),
        delay_s=lambda i: 0.005 + (step_s if i >= 100 else 0.0),
        until_s=T0 + 6.6 + step_s,
        ready=ready,
    )
    assert [f.sequence for f in real(frames)] == list(range(1000, 1300))
    assert jb.stats.late == 0
    assert concealed(frames) <= 2 + math.ceil(jb.target_delay_ms / 20)  # the step's own gap
    assert jb.stats.rebased == 1


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tick_phase_s", [0.001, 0.005, 0.013, 0.017])
def test_a_stream_jittering_within_the_buffer_loses_nothing_once_it_has_adapted(
    seed: int, tick_phase_s: float
) -> None:
    """Up to 30 ms of jitter: the delay must keep the slowest packets ahead of the concealment,
    which runs half a frame before a slot, or the buffer swings between dropping a late packet and
    shrinking again."""
    rng = random.Random(seed)
    jb = JitterBuffer()
    simulate(
        jb,
        stream(600),
        delay_s=lambda i: rng.uniform(0, 0.030),
        ready=True,
        tick_phase_s=tick_phase_s,
    )
    assert jb.stats.late <= 1  # at most the second packet, before any jitter was seen


def test_thirty_ms_packets_on_a_twenty_ms_tick() -> None:
    jb = JitterBuffer()
    frames = simulate(jb, stream(30, units=240, period_s=0.030))
    assert [f.sequence for _, f in frames] == list(range(1000, 1030))
    assert concealed(frames) == 0
    assert {f.duration_units for _, f in frames[1:]} == {240}


def test_reset_forgets_the_stream_but_keeps_stats() -> None:
    jb = JitterBuffer()
    simulate(jb, stream(5))
    played = jb.stats.played
    jb.reset()
    assert len(jb) == 0 and not jb.playing
    assert jb.stats.played == played
    assert jb.pop(T0 + 10) is None


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError):
        JitterBuffer(min_delay_ms=100, max_delay_ms=50)
    with pytest.raises(ValueError):
        JitterBuffer(clock_rate_hz=0)


def test_pop_ready_hands_on_in_order_packets_on_arrival_and_leaves_gaps_to_pop() -> None:
    """In-order delivery for the app path (inbound latency): a packet that continues
    the sequence is handed on when it arrives; a gap waits for `pop`, which conceals it only once
    the missing packet is overdue, so a packet reordered within the delay still plays in order."""
    jb = JitterBuffer(min_delay_ms=60)
    packets = [p for _, p in stream(6)]
    jb.push(packets[0], T0)
    first = jb.pop_ready(T0)
    assert first is not None and first.sequence == packets[0].sequence  # no start-up delay
    assert jb.pop_ready(T0) is None  # nothing more here
    jb.push(packets[1], T0 + 0.020)
    assert jb.pop_ready(T0 + 0.020).sequence == packets[1].sequence  # type: ignore[union-attr]
    # Packet 2 (sent at +40 ms) is 30 ms late and 3 arrives first: 3 waits, and pop conceals
    # nothing while 2 is within the 60 ms delay.
    jb.push(packets[3], T0 + 0.060)
    assert jb.pop_ready(T0 + 0.060) is None
    assert jb.pop(T0 + 0.060) is None and not jb.stats.concealed
    jb.push(packets[2], T0 + 0.070)
    assert [jb.pop_ready(T0 + 0.070).sequence, jb.pop_ready(T0 + 0.070).sequence] == [  # type: ignore[union-attr]
        packets[2].sequence,
        packets[3].sequence,
    ]
    assert jb.stats.concealed == 0 and jb.stats.late == 0
    # Packet 4 never comes: the tick's pop conceals its slot once it is overdue, then 5 goes on.
    jb.push(packets[5], T0 + 0.100)
    assert jb.pop_ready(T0 + 0.100) is None
    frame = None
    now = T0 + 0.100
    while frame is None or not frame.concealed:
        now += 0.020
        frame = jb.pop(now)
    assert frame.sequence == packets[4].sequence
    assert jb.pop_ready(now).sequence == packets[5].sequence  # type: ignore[union-attr]


# ---------------------------------------------------------------------- the transit window
@given(
    size=st.integers(min_value=1, max_value=12),
    values=st.lists(st.floats(min_value=-1e3, max_value=1e3), min_size=1, max_size=300),
    clear_at=st.integers(min_value=0, max_value=300),
)
def test_sliding_range_is_the_min_and_max_of_the_last_values(
    size: int, values: list[float], clear_at: int
) -> None:
    window = SlidingRange(size)
    seen: list[float] = []
    for k, value in enumerate(values):
        if k == clear_at:
            window.clear()
            seen.clear()
            assert len(window) == 0
        window.push(value)
        seen.append(value)
        last = seen[-size:]
        assert len(window) == len(last)
        assert (window.smallest, window.largest) == (min(last), max(last))


def test_sliding_range_refuses_an_empty_window_and_reading_nothing() -> None:
    with pytest.raises(ValueError):
        SlidingRange(0)
    with pytest.raises(IndexError):
        _ = SlidingRange(3).smallest


@pytest.mark.parametrize("step", [1.0, -1.0])
def test_sliding_range_stays_right_over_a_long_monotonic_run(step: float) -> None:
    """A rising (falling) run keeps every value in the min (max) queue, so entries depart one
    per push and the queue is compacted many times over."""
    window = SlidingRange(5)
    for k in range(1000):
        window.push(k * step)
        last = [j * step for j in range(max(0, k - 4), k + 1)]
        assert (window.smallest, window.largest) == (min(last), max(last))
