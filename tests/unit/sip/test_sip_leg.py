"""SipLeg pacing in virtual time: one RTP packet per tick, silence when the engine has nothing,
continuous sequence/timestamps, RFC 4733 out replacing audio, caller audio and DTMF in."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from appbridge.carriers.sip.dtmf4733 import TelephoneEvent
from appbridge.carriers.sip.leg import RtpPortPool, SipLeg
from appbridge.carriers.sip.rtp import RtpPacket
from appbridge.carriers.sip.sdp import PCMU, NegotiatedAudio
from appbridge.clock import VirtualClock

PEER = ("127.0.0.1", 40000)


class Events:
    def __init__(self) -> None:
        self.audio: list[bytes] = []
        self.digits: list[str] = []

    def on_carrier_audio(self, payload: bytes) -> None:
        self.audio.append(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        self.digits.append(digit)

    def on_carrier_hangup(self) -> None:
        pass


def make_leg() -> tuple[SipLeg, VirtualClock, list[RtpPacket], list[Callable[[], None]], Events]:
    neg = NegotiatedAudio(
        codec=PCMU,
        send_payload_type=0,
        receive_payload_type=0,
        send_event_payload_type=101,
        receive_event_payload_type=101,
        remote_address=PEER[0],
        remote_port=PEER[1],
        local_direction="sendrecv",
        remote_direction="sendrecv",
        remote_ptime_ms=20,
    )
    clock = VirtualClock()
    sent: list[RtpPacket] = []
    deferred: list[Callable[[], None]] = []
    leg = SipLeg(
        neg,
        clock=clock,
        send_datagram=lambda data, addr: sent.append(RtpPacket.parse(data)),
        defer=deferred.append,
        ssrc=1234,
        initial_sequence=65534,
        initial_timestamp=1000,
    )
    events = Events()
    leg.attach(events)
    return leg, clock, sent, deferred, events


def tick(
    leg: SipLeg, clock: VirtualClock, deferred: list[Callable[[], None]], frame: bytes | None
) -> None:
    assert leg.frames_wanted(frame is not None) == 1
    if frame is not None:
        leg.send_frame(frame)
    assert len(deferred) == 1
    deferred.pop()()
    clock.advance(0.020)


def test_one_packet_per_tick_with_silence_and_continuous_numbers() -> None:
    leg, clock, sent, deferred, _ = make_leg()
    for i in range(6):
        tick(leg, clock, deferred, b"\x11" * 160 if i % 2 == 0 else None)
    assert len(sent) == 6
    assert [p.sequence for p in sent] == [65534, 65535, 0, 1, 2, 3]
    assert [p.timestamp for p in sent] == [1000 + 160 * i for i in range(6)]
    assert {p.ssrc for p in sent} == {1234}
    assert sent[1].payload == b"\xff" * 160  # µ-law silence when the engine had nothing
    assert sent[0].payload == b"\x11" * 160 and sent[0].marker and not sent[1].marker
    assert leg.silence_sent == 3


def test_rfc4733_out_replaces_audio_and_keeps_the_clock() -> None:
    leg, clock, sent, deferred, _ = make_leg()
    tick(leg, clock, deferred, None)
    assert leg.send_dtmf("5")
    for _ in range(15):
        tick(leg, clock, deferred, b"\x11" * 160)
    events = [p for p in sent if p.payload_type == 101]
    audio = [p for p in sent if p.payload_type == 0]
    assert events and events[0].marker
    parsed = [TelephoneEvent.parse_all(p.payload)[0] for p in events]
    assert {e.event for e in parsed} == {5}
    assert sum(1 for e in parsed if e.end) == 3
    # Audio resumes after the event with the timestamp that ran on underneath it.
    assert audio[-1].timestamp == 1000 + 160 * 15
    seqs = [p.sequence for p in sent]
    assert all((b - a) & 0xFFFF == 1 for a, b in itertools.pairwise(seqs))


def test_caller_audio_and_dtmf_in() -> None:
    leg, clock, _, deferred, events = make_leg()
    for i in range(10):
        pkt = RtpPacket(0, 100 + i, 5000 + 160 * i, 99, b"\x22" * 160)
        leg.datagram_received(pkt.serialize(), PEER, clock.now())
        tick(leg, clock, deferred, None)
    for _ in range(5):
        tick(leg, clock, deferred, None)
    # Ten frames, plus one repeat when the stream pauses (jitter.py: conceal by repeating once).
    assert events.audio.count(b"\x22" * 160) == 11
    assert events.audio[-1] == b"\xff" * 160
    ev = TelephoneEvent(event=11, end=False, volume=10, duration_units=0).serialize()
    for i in range(3):
        pkt = RtpPacket(101, 200 + i, 9000, 99, ev, marker=i == 0)
        leg.datagram_received(pkt.serialize(), PEER, clock.now())
    assert events.digits == ["#"]


def test_port_pool_quarantines_released_ports() -> None:
    pool = RtpPortPool(20001, 20006, quarantine_s=10.0)
    assert [pool.acquire(0.0) for _ in range(3)] == [20002, 20004, 20006]
    assert pool.acquire(0.0) is None
    pool.release(20004, 1.0)
    assert pool.acquire(5.0) is None
    assert pool.acquire(11.0) == 20004
