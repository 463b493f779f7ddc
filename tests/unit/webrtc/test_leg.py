"""The browser leg in virtual time (appbridge/carriers/webrtc/leg.py): no frames before the
media is up, one SRTP packet per media-clock tick after, the browser's packets decoded in order,
gaps concealed on the tick, RTCP reports and a BYE, hang-ups told once.

The media path is a real one but for the ICE socket: SRTP sessions keyed both ways with
pylibsrtp (the gateway's and the browser's), and a route that keeps what the leg sends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
from aiortc.rtp import RtcpByePacket, RtcpPacket, RtcpSdesPacket, RtcpSrPacket
from pylibsrtp import Policy, Session

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.rtp import RtpPacket, RtpSender
from appbridge.carriers.sip.srtp import SrtpStreams
from appbridge.carriers.webrtc.leg import WebRtcLeg
from appbridge.carriers.webrtc.rtp_path import MediaPath, mid_extension
from appbridge.clock import VirtualClock
from appbridge.media.codecs import pcm16_to_ulaw, ulaw_to_pcm16
from appbridge.testing.audio import tone_pcm16

GATEWAY_KEY, BROWSER_KEY = os.urandom(30), os.urandom(30)
PCMU_PT, SSRC = 0, 0x1234ABCD


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


class Route:
    """The ICE socket's stand-in: keeps the datagrams the leg sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.released = False

    def send(self, data: bytes) -> bool:
        self.sent.append(data)
        return True

    def release(self) -> None:
        self.released = True


class Browser:
    """The far end's SRTP: protects what it sends, unprotects what the leg sent."""

    def __init__(self) -> None:
        out = Policy(key=BROWSER_KEY, ssrc_type=Policy.SSRC_ANY_OUTBOUND)
        into = Policy(key=GATEWAY_KEY, ssrc_type=Policy.SSRC_ANY_INBOUND)
        self.tx, self.rx = Session(out), Session(into)
        self.rtp = RtpSender(payload_type=PCMU_PT, frame_units=160, ssrc=0xB0B)

    def packet(self, pcm16: bytes) -> bytes:
        return self.tx.protect(self.rtp.audio(pcm16_to_ulaw(pcm16)))

    def read(self, datagram: bytes) -> RtpPacket | list[object]:
        if 192 <= datagram[1] <= 223:
            return list(RtcpPacket.parse(self.rx.unprotect_rtcp(datagram)))
        return RtpPacket.parse(self.rx.unprotect(datagram))


def _path(route: Route, *, sending: bool = True) -> MediaPath:
    gateway = SrtpStreams.over(
        Session(Policy(key=BROWSER_KEY, ssrc_type=Policy.SSRC_ANY_INBOUND)),
        Session(Policy(key=GATEWAY_KEY, ssrc_type=Policy.SSRC_ANY_OUTBOUND)),
        label="t",
    )
    path = MediaPath(
        codec="PCMU",
        payload_type=PCMU_PT,
        ssrc=SSRC,
        cname="gw",
        mid="0",
        extension=mid_extension(1, "0"),
        sending=sending,
        srtp=gateway,
    )
    path.route = route  # type: ignore[assignment]
    return path


def _leg(
    *, connected: bool = True, sending: bool = True
) -> tuple[WebRtcLeg, Deferred, Events, Route, VirtualClock]:
    clock, deferred, events, route = VirtualClock(), Deferred(), Events(), Route()
    leg = WebRtcLeg("PCMU", clock=clock, defer=deferred, label="t", wallclock=clock.wall)
    leg.attach(events)
    if connected:
        leg.connect_media(_path(route, sending=sending))
    return leg, deferred, events, route, clock


def _tick(leg: WebRtcLeg, deferred: Deferred, clock: VirtualClock, frame: bytes | None) -> None:
    assert leg.frames_wanted(frame is not None) == 1
    if frame is not None:
        leg.send_frame(frame)
    deferred.run()
    clock.advance(0.02)


def _rtp(route: Route, browser: Browser) -> list[RtpPacket]:
    return [p for p in map(browser.read, route.sent) if isinstance(p, RtpPacket)]


async def test_no_frames_are_taken_before_the_media_is_up() -> None:
    leg, deferred, _, route, _ = _leg(connected=False)
    assert leg.frames_wanted(True) == 0  # the app's first words wait in the output queue
    assert deferred.hooks == [] and route.sent == []


async def test_one_srtp_packet_per_tick_with_the_mid_and_silence_when_quiet() -> None:
    leg, deferred, _, route, clock = _leg()
    tone = tone_pcm16(440, 20, 8000)
    _tick(leg, deferred, clock, tone)
    _tick(leg, deferred, clock, None)
    first, second = _rtp(route, Browser())
    assert (first.payload, second.payload) == (pcm16_to_ulaw(tone), b"\xff" * 160)
    assert (first.ssrc, first.payload_type, first.marker, second.marker) == (SSRC, 0, True, False)
    assert second.sequence == (first.sequence + 1) & 0xFFFF
    assert second.timestamp == (first.timestamp + 160) & 0xFFFFFFFF
    assert (first.extension_profile, first.extension) == (0xBEDE, mid_extension(1, "0")[4:])
    assert (leg.frames_sent, leg.silence_sent, leg.unplayed_frames()) == (2, 1, 0)


async def test_catch_up_ticks_lose_no_frame() -> None:
    """Back-to-back ticks (the media clock catching up) end the open tick first."""
    leg, deferred, _, route, _ = _leg()
    a, b = tone_pcm16(440, 20, 8000), tone_pcm16(880, 20, 8000)
    leg.frames_wanted(True)
    leg.send_frame(a)
    leg.frames_wanted(True)  # the next tick begins before the first one's end ran
    leg.send_frame(b)
    deferred.run()
    payloads = [p.payload for p in _rtp(route, Browser())]
    assert payloads == [pcm16_to_ulaw(a), pcm16_to_ulaw(b)] and leg.silence_sent == 0


async def test_clear_within_a_tick_sends_silence_instead() -> None:
    leg, deferred, _, route, _ = _leg()
    leg.frames_wanted(True)
    leg.send_frame(tone_pcm16(440, 20, 8000))
    leg.clear_output()
    deferred.run()
    assert [p.payload for p in _rtp(route, Browser())] == [b"\xff" * 160]


async def test_the_browsers_audio_comes_in_order_and_gaps_are_concealed_on_the_tick() -> None:
    leg, deferred, events, _, clock = _leg()
    browser = Browser()
    tones = [tone_pcm16(300 + 100 * i, 20, 8000) for i in range(4)]
    packets = [browser.packet(t) for t in tones]
    leg.datagram_received(packets[0])  # in sequence: on to the engine at once
    leg.datagram_received(packets[2])  # after a gap: they wait
    leg.datagram_received(packets[3])
    assert [ulaw_to_pcm16(pcm16_to_ulaw(tones[0]))] == events.audio
    for _ in range(20):  # the missing packet is overdue: concealed, then the rest plays
        if len(events.audio) >= 4:
            break
        _tick(leg, deferred, clock, None)
    assert len(events.audio) == 4
    assert events.audio[2] == ulaw_to_pcm16(pcm16_to_ulaw(tones[2]))
    assert events.audio[3] == ulaw_to_pcm16(pcm16_to_ulaw(tones[3]))
    assert leg.jitter.stats.concealed == 1 and leg.frames_received == 4


async def test_forged_and_replayed_datagrams_are_dropped_and_counted() -> None:
    leg, _, events, _, _ = _leg()
    browser = Browser()
    good = browser.packet(tone_pcm16(440, 20, 8000))
    forged = good[:-1] + bytes([good[-1] ^ 1])
    leg.datagram_received(forged)
    leg.datagram_received(good)
    leg.datagram_received(good)
    srtp = leg.media.srtp if leg.media else None
    assert srtp is not None and (srtp.auth_failures, srtp.replays) == (1, 1)
    assert len(events.audio) == 1


async def test_rtcp_reports_go_out_on_the_tick_and_a_bye_at_the_close() -> None:
    leg, deferred, _, route, clock = _leg()
    browser = Browser()
    for _ in range(int(8 / 0.02)):  # past the first report's time
        leg.datagram_received(browser.packet(tone_pcm16(440, 20, 8000)))
        _tick(leg, deferred, clock, None)
    reports = [p for p in map(browser.read, route.sent) if isinstance(p, list)]
    assert reports
    sr = reports[0][0]
    assert isinstance(sr, RtcpSrPacket) and sr.ssrc == SSRC
    assert [r.ssrc for r in sr.reports] == [0xB0B]
    assert any(isinstance(p, RtcpSdesPacket) for p in reports[0])
    await leg.close()
    last = browser.read(route.sent[-1])
    assert isinstance(last, list) and isinstance(last[-1], RtcpByePacket)
    assert route.released
    sent = len(route.sent)
    assert leg.frames_wanted(True) == 0 and len(route.sent) == sent  # closed: nothing more


async def test_a_browser_that_only_sends_gets_no_audio_but_is_heard() -> None:
    leg, deferred, events, route, clock = _leg(sending=False)
    _tick(leg, deferred, clock, tone_pcm16(440, 20, 8000))
    assert _rtp(route, Browser()) == []
    leg.datagram_received(Browser().packet(tone_pcm16(440, 20, 8000)))
    assert len(events.audio) == 1


async def test_hangups_and_keypresses_from_the_browser() -> None:
    leg, _, events, _, _ = _leg()
    leg.dtmf("5")
    leg.remote_hangup()
    leg.remote_hangup()  # the data channel's hangup and then the connection's close
    assert (events.digits, events.hangups) == (["5"], 1)
    hung_up: list[int] = []

    async def on_hangup() -> None:
        hung_up.append(1)

    early = WebRtcLeg("opus", clock=VirtualClock(), defer=Deferred(), on_hangup=on_hangup)
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

    leg = WebRtcLeg("opus", clock=VirtualClock(), defer=Deferred(), on_hangup=on_hangup)
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
