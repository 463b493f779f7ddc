"""Output pacing in virtual time: one media clock, the output queue, a leg's lead, and clear."""

from __future__ import annotations

import pytest

from appbridge.media.codecs import PCMU_8K
from appbridge.media.media_clock import MediaClock
from appbridge.media.output_queue import OutputDone, OutputInterrupted, OutputQueue, OutputStarted
from appbridge.media.pacing import LeadPacer

FRAME = PCMU_8K.frame_bytes(20)


class FarEnd:
    """A carrier that plays one buffered frame per tick, like Twilio's playout."""

    def __init__(self) -> None:
        self.buffer: list[bytes] = []
        self.played: list[bytes | None] = []

    def tick(self) -> None:
        self.played.append(self.buffer.pop(0) if self.buffer else None)

    def clear(self) -> None:
        self.buffer.clear()


def make_call(lead: int) -> tuple[OutputQueue, LeadPacer, FarEnd, list[object], MediaClock]:
    queue = OutputQueue(FRAME, PCMU_8K.silence(20))
    pacer = LeadPacer(lead)
    far = FarEnd()
    events: list[object] = []
    clock = MediaClock()

    def on_tick(tick: int, now: float) -> None:
        far.tick()
        for _ in range(pacer.frames_wanted(not queue.is_empty)):
            frame, evs = queue.pull_frame()
            events.extend(evs)
            if frame is None:
                break
            pacer.on_sent()
            far.buffer.append(frame)

    clock.subscribe(on_tick)
    return queue, pacer, far, events, clock


def test_steady_state_sends_one_frame_per_tick_after_a_lead() -> None:
    queue, _pacer, far, events, clock = make_call(lead=2)
    queue.add_item("a")
    queue.append_audio("a", bytes(range(160)) * 50)  # 1 s of audio
    queue.close_item("a")
    clock.run_tick()
    assert len(far.buffer) == 3  # the first tick builds the lead
    for _ in range(10):
        clock.run_tick()
        assert 2 <= len(far.buffer) <= 3
    assert isinstance(events[0], OutputStarted)


def test_every_frame_is_played_once_in_order() -> None:
    queue, _pacer, far, events, clock = make_call(lead=2)
    frames = [bytes([i]) * FRAME for i in range(25)]
    queue.add_item("a")
    queue.append_audio("a", b"".join(frames))
    queue.close_item("a")
    for _ in range(40):
        clock.run_tick()
    assert [f for f in far.played if f is not None] == frames
    done = [e for e in events if isinstance(e, OutputDone)]
    assert done == [OutputDone("a", 500)]


def test_clear_reaches_silence_on_the_next_tick() -> None:
    queue, pacer, far, events, clock = make_call(lead=2)
    queue.add_item("a")
    queue.append_audio("a", b"\x10" * FRAME * 100)
    queue.close_item("a")
    for _ in range(10):
        clock.run_tick()
    # The app sends clear between two ticks: the queue empties and the far end drops its buffer.
    events.extend(queue.clear())
    pacer.on_cleared()
    far.clear()
    clock.run_tick()
    assert far.played[-1] is None  # silence within one 20 ms tick
    interrupted = [e for e in events if isinstance(e, OutputInterrupted)]
    assert interrupted and interrupted[0].heard_ms > 0


def test_idle_calls_send_nothing() -> None:
    _queue, _pacer, far, events, clock = make_call(lead=2)
    for _ in range(5):
        clock.run_tick()
    assert far.played == [None] * 5
    assert events == []


def test_a_failing_subscriber_is_removed_and_others_keep_ticking() -> None:
    clock = MediaClock()
    ticks: list[int] = []

    def bad(tick: int, now: float) -> None:
        raise RuntimeError("boom")

    clock.subscribe(bad)
    clock.subscribe(lambda tick, now: ticks.append(tick))
    clock.run_tick()
    clock.run_tick()
    assert ticks == [1, 2]
    assert clock.tick_errors == 1
    assert clock.subscribers == 1


# -- the tick in slices: the loop serves sockets between slices -------------------------


async def test_a_sliced_tick_lets_other_callbacks_run_between_slices() -> None:
    import asyncio

    from appbridge.media.media_clock import slice_from_env

    loop = asyncio.get_running_loop()
    clock = MediaClock(slice_size=2)
    clock._loop = loop  # what start() sets; the test drives the ticks itself
    seen: list[str] = []

    def sub(name: str, action: object = None) -> int:
        def on_tick(tick: int, now: float) -> None:
            seen.append(f"{name}@{tick}")
            if callable(action):
                action()

        return clock.subscribe(on_tick)

    sub("a", lambda: loop.call_soon(seen.append, "packet"))  # as a socket read would be
    sub("b")
    sub("c", lambda: clock.unsubscribe(d_key))  # a call ending mid-tick
    d_key = sub("d")
    sub("e")
    clock.begin_tick()
    clock.call_after_tick(lambda: seen.append("after"))
    clock._run_slice(clock.slice_size)
    assert seen == ["a@1", "b@1"] and clock.in_tick
    for _ in range(3):
        await asyncio.sleep(0)
    assert seen == ["a@1", "b@1", "packet", "c@1", "e@1", "after"]
    assert not clock.in_tick
    clock.call_after_tick(lambda: seen.append("between ticks"))  # no tick running: at once
    assert seen[-1] == "between ticks"
    assert slice_from_env({}) == 32 and slice_from_env({"APPBRIDGE_TICK_SLICE": "0"}) is None
    assert slice_from_env({"APPBRIDGE_TICK_SLICE": "x"}) == 32


async def test_a_tick_never_overlaps_the_next_one() -> None:
    import asyncio

    clock = MediaClock(slice_size=1)
    clock._loop = asyncio.get_running_loop()
    seen: list[str] = []
    clock.subscribe(lambda tick, now: seen.append(f"x@{tick}"))
    clock.subscribe(lambda tick, now: seen.append(f"y@{tick}"))
    clock.begin_tick()
    clock._run_slice(1)
    assert seen == ["x@1"]
    # The next deadline came before the loop ran the rest (an overloaded loop): tick 1 ends
    # first, then tick 2 begins; the stale slice callback of tick 1 does nothing.
    clock.begin_tick()
    clock._run_slice(1)
    assert seen == ["x@1", "y@1", "x@2"]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert seen == ["x@1", "y@1", "x@2", "y@2"]


async def test_a_clock_stopped_mid_tick_finishes_it_in_the_pending_slice() -> None:
    import asyncio

    clock = MediaClock(slice_size=1)
    clock._loop = asyncio.get_running_loop()
    seen: list[str] = []
    for name in "xyz":
        clock.subscribe(lambda tick, now, name=name: seen.append(f"{name}@{tick}"))
    clock.begin_tick()
    clock._run_slice(1)
    clock._loop = None  # what stop() leaves behind
    await asyncio.sleep(0)
    assert seen == ["x@1", "y@1", "z@1"] and not clock.in_tick


async def test_every_subscriber_of_a_tick_gets_the_same_now_read_once_per_tick() -> None:
    """``now`` is read from the clock when the tick begins and passed to every subscriber, in
    every slice of the tick, even when the clock moves on while the tick runs."""
    import asyncio

    from appbridge.clock import VirtualClock

    clock = VirtualClock(start=100.0)
    media = MediaClock(slice_size=2, clock=clock)
    media._loop = asyncio.get_running_loop()  # what start() sets; the test drives the ticks
    seen: list[tuple[str, int, float]] = []

    def sub(name: str) -> None:
        def on_tick(tick: int, now: float) -> None:
            seen.append((name, tick, now))
            clock.advance(0.001)  # each call's work takes a while

        media.subscribe(on_tick)

    for name in "abc":
        sub(name)
    media.begin_tick()
    media._run_slice(media.slice_size)
    await asyncio.sleep(0)  # the second slice
    assert seen == [("a", 1, 100.0), ("b", 1, 100.0), ("c", 1, 100.0)]
    assert media.now == 100.0 and not media.in_tick
    clock.advance(0.017)
    media.run_tick()
    assert [now for _, tick, now in seen if tick == 2] == [pytest.approx(100.020)] * 3
