"""The browser leg without a network (appbridge/carriers/webrtc/leg.py, track.py): one frame per
media-clock tick, silence when the app is quiet, bounded queue, hang-ups told once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import av
import pytest
from aiortc.mediastreams import MediaStreamError

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.webrtc.leg import WebRtcLeg
from appbridge.carriers.webrtc.track import MAX_QUEUED, OutboundTrack
from appbridge.media.codecs import pcm16_to_ulaw
from appbridge.testing.audio import tone_pcm16


class Events:
    def __init__(self) -> None:
        self.audio: list[bytes] = []
        self.digits: list[str] = []
        self.hangups = 0

    def on_carrier_audio(self, payload: bytes) -> None:
        self.audio.append(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        self.digits.append(digit)

    def on_carrier_hangup(self) -> None:
        self.hangups += 1


class Deferred:
    """The media clock's after-slice hook, run by hand."""

    def __init__(self) -> None:
        self.hooks: list[Callable[[], None]] = []

    def __call__(self, hook: Callable[[], None]) -> None:
        self.hooks.append(hook)

    def run(self) -> None:
        hooks, self.hooks = self.hooks, []
        for hook in hooks:
            hook()


def _leg(codec: str = "opus") -> tuple[WebRtcLeg, Deferred, Events]:
    deferred, events = Deferred(), Events()
    leg = WebRtcLeg(codec, OutboundTrack(), defer=deferred, label="t")
    leg.attach(events)
    return leg, deferred, events


def _tick(leg: WebRtcLeg, deferred: Deferred, frame: bytes | None) -> None:
    assert leg.frames_wanted(frame is not None) == 1
    if frame is not None:
        leg.send_frame(frame)
    deferred.run()


async def test_one_frame_per_tick_and_silence_when_nothing_plays() -> None:
    leg, deferred, _ = _leg("PCMU")
    tone = tone_pcm16(440, 20, 8000)
    _tick(leg, deferred, tone)
    _tick(leg, deferred, None)
    assert (leg.frames_sent, leg.silence_sent, leg.unplayed_frames()) == (2, 1, 2)
    first = await leg.track.recv()
    second = await leg.track.recv()
    assert isinstance(first, av.Packet) and isinstance(second, av.Packet)
    assert bytes(first) == pcm16_to_ulaw(tone)
    assert bytes(second) == b"\xff" * 160  # µ-law silence
    assert (first.pts, second.pts) == (0, 160)


async def test_catch_up_ticks_lose_no_frame() -> None:
    """Back-to-back ticks (the media clock catching up) end the open tick first."""
    leg, deferred, _ = _leg("PCMU")
    a, b = tone_pcm16(440, 20, 8000), tone_pcm16(880, 20, 8000)
    leg.frames_wanted(True)
    leg.send_frame(a)
    leg.frames_wanted(True)  # the next tick begins before the first one's end ran
    leg.send_frame(b)
    deferred.run()
    assert leg.frames_sent == 2 and leg.silence_sent == 0
    packets = [await leg.track.recv(), await leg.track.recv()]
    assert all(isinstance(p, av.Packet) for p in packets)
    assert [p.pts for p in packets] == [0, 160]


async def test_a_slow_sender_drops_the_oldest_and_counts_them() -> None:
    leg, deferred, _ = _leg("PCMA")
    for _ in range(MAX_QUEUED + 3):
        _tick(leg, deferred, None)
    assert leg.unplayed_frames() == MAX_QUEUED
    assert leg.audio_dropped == 3
    oldest = await leg.track.recv()
    assert oldest.pts == 3 * 160


async def test_clear_drops_what_is_queued() -> None:
    leg, deferred, _ = _leg()
    _tick(leg, deferred, None)
    leg.frames_wanted(True)
    leg.send_frame(tone_pcm16(440, 20, 16000))
    leg.clear_output()  # within the tick: its frame goes too, silence is sent instead
    deferred.run()
    assert leg.unplayed_frames() == 1 and leg.silence_sent == 2


async def test_the_sender_waits_for_the_tick_and_ends_with_the_track() -> None:
    leg, deferred, _ = _leg()
    waiting = asyncio.ensure_future(leg.track.recv())
    await asyncio.sleep(0)
    assert not waiting.done()
    _tick(leg, deferred, None)
    assert (await asyncio.wait_for(waiting, 1)).pts == 0
    waiting = asyncio.ensure_future(leg.track.recv())
    await asyncio.sleep(0)
    await leg.close()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(waiting, 1)
    _tick(leg, deferred, None)  # a closed leg sends nothing
    assert leg.unplayed_frames() == 0


async def test_hangups_and_keypresses_from_the_browser() -> None:
    leg, _, events = _leg()
    leg.dtmf("5")
    leg.remote_hangup()
    leg.remote_hangup()  # the data channel's hangup and then the connection's close
    assert (events.digits, events.hangups) == (["5"], 1)
    hung_up: list[int] = []

    async def on_hangup() -> None:
        hung_up.append(1)

    early = WebRtcLeg("opus", OutboundTrack(), defer=Deferred(), on_hangup=on_hangup)
    early.remote_hangup()  # before the engine attached: told on attach
    late = Events()
    early.attach(late)
    await asyncio.sleep(0)
    assert late.hangups == 1
    await early.hangup()  # the browser already left: nothing to tell it
    assert hung_up == []


async def test_hangup_runs_the_callback_once_and_transfers_are_refused() -> None:
    calls: list[int] = []

    async def on_hangup() -> None:
        calls.append(1)

    leg = WebRtcLeg("opus", OutboundTrack(), defer=Deferred(), on_hangup=on_hangup)
    await leg.hangup()
    await leg.hangup()
    assert calls == [1] and leg.closed
    assert leg.send_dtmf("1") is False
    assert leg.native_cold_transfer is False
    for attempt in (
        leg.transfer("+15550001111", "cold", None, None),
        leg.dial_party("+15550001111", caller_id="x", headers=None, timeout_s=1),
        leg.refer("sip:a@b", None),
    ):
        with pytest.raises(TransferError) as err:
            await attempt
        assert err.value.code == "feature_not_supported"
