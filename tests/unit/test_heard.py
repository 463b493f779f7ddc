"""Output events timed by what the caller heard (docs/protocol-session-v1.md: ``mark`` when
everything queued before it was heard, ``output.done`` when heard completely, ``heardMs``), on a
carrier that keeps a lead over its playout (Twilio). A real ``Call`` in virtual time
(``test_transfer_engine``'s rig) with a leg that models the far end: it plays one buffered frame per
tick and drops its buffer on ``clear``, as Twilio does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from appbridge.media.codecs import PCMU_8K
from appbridge.media.output_queue import OutputQueue, WordTiming
from appbridge.media.pacing import LeadPacer
from tests.unit.test_transfer_engine import FakeLeg, Rig, open_rig

SILENCE = PCMU_8K.silence(20)


def frame(value: int) -> bytes:
    return bytes([value]) * PCMU_8K.frame_bytes(20)


class LeadLeg(FakeLeg):
    """A leg two frames ahead of a far end that plays one frame per tick, in order."""

    lead_frames = 2

    def __init__(self) -> None:
        super().__init__()
        self.pacer = LeadPacer(self.lead_frames)
        self.buffer: list[bytes] = []
        self.played: list[bytes] = []

    def frames_wanted(self, playing: bool) -> int:
        if self.buffer:
            self.played.append(self.buffer.pop(0))  # the far end played one frame since
        return self.pacer.frames_wanted(playing)

    def send_frame(self, frame: bytes) -> None:
        super().send_frame(frame)
        self.pacer.on_sent()
        self.buffer.append(frame)

    def clear_output(self) -> None:
        self.pacer.on_cleared()
        self.buffer.clear()

    def unplayed_frames(self) -> int:
        return self.pacer.buffered

    def heard(self, value: int) -> int:
        return sum(f == frame(value) for f in self.played)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with open_rig(LeadLeg()) as r:
        yield r


def far(rig: Rig) -> LeadLeg:
    assert isinstance(rig.leg, LeadLeg)
    return rig.leg


def queue_of(rig: Rig) -> OutputQueue:
    queue = rig.call.queue
    assert queue is not None
    return queue


async def ticks_until(rig: Rig, kind: str, limit: int = 50) -> int:
    """Ticks until the app has a ``kind`` message; how many it took."""
    for n in range(1, limit + 1):
        await rig.ticks(1)
        if rig.link.of_type(kind):
            return n
    raise AssertionError(f"no {kind} within {limit} ticks: {rig.link.messages}")


async def test_a_mark_waits_until_the_far_end_played_everything_before_it(rig: Rig) -> None:
    leg = far(rig)
    rig.call.on_app_binary(frame(0x20) * 10)
    await rig.command({"type": "mark", "name": "m"})
    heard_before: list[int] = []
    for _ in range(30):
        await rig.ticks(1)
        if rig.link.of_type("mark"):
            break
        heard_before.append(leg.heard(0x20))
    assert rig.link.of_type("mark") == [{"type": "mark", "name": "m", "cleared": False}]
    # Not one tick early: until then some of the audio was still unplayed at the far end,
    # and the mark came on the tick the last frame finished playing.
    assert max(heard_before) < 10
    assert leg.heard(0x20) == 10
    assert heard_before[-1] == 9


async def test_a_mark_on_an_emptied_queue_still_waits_for_the_lead(rig: Rig) -> None:
    leg = far(rig)
    rig.call.on_app_binary(frame(0x21) * 3)
    await rig.ticks(1)  # the first tick hands all three frames over (the lead)
    assert queue_of(rig).queued_bytes == 0 and leg.heard(0x21) == 0
    await rig.command({"type": "mark", "name": "after"})
    assert rig.link.of_type("mark") == []
    waited = await ticks_until(rig, "mark")
    assert leg.heard(0x21) == 3 and waited == 3


async def test_clear_turns_a_held_mark_into_cleared(rig: Rig) -> None:
    leg = far(rig)
    rig.call.on_app_binary(frame(0x22) * 4)
    await rig.command({"type": "mark", "name": "end"})
    await rig.ticks(3)  # all four frames pulled and the mark reached; two still unplayed
    assert rig.link.of_type("mark") == [] and leg.heard(0x22) == 2
    await rig.command({"type": "clear"})
    assert rig.link.of_type("mark") == [{"type": "mark", "name": "end", "cleared": True}]
    await rig.ticks(5)
    assert leg.heard(0x22) == 2  # the rest was dropped: never heard
    assert len(rig.link.of_type("mark")) == 1  # and the mark is not reported twice


async def test_output_done_comes_when_the_item_was_heard_completely(rig: Rig) -> None:
    leg = far(rig)
    queue = queue_of(rig)
    queue.add_item("s1")
    queue.append_audio("s1", frame(0x30) * 8)
    queue.close_item("s1")
    started = await ticks_until(rig, "output.started")
    assert started == 1  # the first frame plays as soon as Twilio has it
    await ticks_until(rig, "output.done")
    assert leg.heard(0x30) == 8
    done = rig.link.of_type("output.done")
    assert done == [{"type": "output.done", "id": "s1", "heardMs": 160}]


async def test_clear_reports_what_the_far_end_played_not_what_was_sent(rig: Rig) -> None:
    leg = far(rig)
    queue = queue_of(rig)
    queue.add_item("s1")
    queue.append_audio("s1", frame(0x31) * 50)
    queue.append_words(
        "s1", [WordTiming(0, 100, "one"), WordTiming(100, 180, "two"), WordTiming(180, 240, "3")]
    )
    queue.close_item("s1")
    await rig.ticks(10)  # 12 frames sent, 9 played, 3 in the far end's buffer
    assert leg.heard(0x31) == 9
    await rig.command({"type": "clear"})
    (interrupted,) = rig.link.of_type("output.interrupted")
    assert interrupted["heardMs"] == 9 * 20  # 240 if the lead counted as heard
    assert interrupted["heardText"] == "one two"  # "3" ends at 240 ms: not heard
    await rig.ticks(3)
    assert leg.heard(0x31) == 9


async def test_clear_settles_held_events_by_what_was_heard(rig: Rig) -> None:
    """A short item's tail and a next item's start still in the lead when the app clears: the
    first was cut off after its first frame, the second never started."""
    leg = far(rig)
    queue = queue_of(rig)
    for item_id, value, frames in (("a", 0x40, 3), ("b", 0x41, 10)):
        queue.add_item(item_id)
        queue.append_audio(item_id, frame(value) * frames)
        queue.close_item(item_id)
    await rig.ticks(2)  # a's 3 frames, then b's first; the far end played a's first
    assert [m["id"] for m in rig.link.of_type("output.started")] == ["a"]
    await rig.command({"type": "clear"})
    outputs = [m for m in rig.link.messages if m["type"].startswith("output.")]
    assert outputs == [
        {"type": "output.started", "id": "a"},
        {"type": "output.interrupted", "id": "a", "heardMs": 20, "heardText": ""},
        {"type": "output.interrupted", "id": "b", "heardMs": 0, "heardText": ""},
    ]
    await rig.ticks(5)
    assert leg.heard(0x40) == 1 and leg.heard(0x41) == 0
    assert [m for m in rig.link.messages if m["type"].startswith("output.")] == outputs


async def test_a_leg_without_a_lead_reports_events_on_the_tick(rig: Rig) -> None:
    """SIP sends each frame on its tick: events are not held (``lead_frames`` 0)."""
    async with open_rig(FakeLeg()) as sip:
        sip.call.on_app_binary(frame(0x50) * 2)
        await sip.command({"type": "mark", "name": "m"})
        assert await ticks_until(sip, "mark") == 3  # the pull after the last frame


async def test_hold_lets_the_lead_play_out_and_the_queue_waits(rig: Rig) -> None:
    """``hold`` pauses the app's queue; the audio the leg already took from it is heard (not
    dropped at Twilio, which would lose it for good), and a mark behind the rest waits for
    ``resume``."""
    leg = far(rig)
    rig.call.on_app_binary(frame(0x23) * 4)
    await rig.command({"type": "mark", "name": "after"})
    await rig.ticks(1)  # three frames handed over (the lead), one still queued
    await rig.command({"type": "hold", "id": "h"})
    await rig.ticks(10)
    assert leg.heard(0x23) == 3
    assert rig.link.of_type("mark") == []
    await rig.command({"type": "resume", "id": "r"})
    await ticks_until(rig, "mark")
    assert leg.heard(0x23) == 4
    assert rig.link.of_type("mark") == [{"type": "mark", "name": "after", "cleared": False}]
