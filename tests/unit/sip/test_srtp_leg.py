"""SRTP through the SIP leg's own code with libsrtp (pylibsrtp): protect, unprotect, drops.

Two legs face each other with mirrored keys (what one offer/answer gives both ends): what one
sends the other hears; replayed, tampered and foreign packets are dropped and counted, never
raise; plain RTP to an SRTP leg is dropped; SRTCP on the RTP port is checked; a re-INVITE's new
key takes over on the side that changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from pylibsrtp import Policy, Session

from appbridge.carriers.sip.leg import SipLeg
from appbridge.carriers.sip.offer_answer import NegotiatedAudio
from appbridge.carriers.sip.rtp import RtpPacket, RtpSender
from appbridge.carriers.sip.sdes import SrtpKeys, new_key
from appbridge.carriers.sip.sdp import PCMU
from appbridge.carriers.sip.srtp import DROPS, SrtpStreams
from appbridge.clock import VirtualClock

PEER = ("127.0.0.1", 40000)
SUITE = "AES_CM_128_HMAC_SHA1_80"


class Events:
    def __init__(self) -> None:
        self.audio: list[bytes] = []

    def on_carrier_audio(self, payload: bytes) -> None:
        self.audio.append(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        pass

    def on_carrier_hangup(self) -> None:
        pass


def negotiated(keys: SrtpKeys | None) -> NegotiatedAudio:
    return NegotiatedAudio(
        codec=PCMU,
        send_payload_type=0,
        receive_payload_type=0,
        send_event_payload_type=None,
        receive_event_payload_type=None,
        remote_address=PEER[0],
        remote_port=PEER[1],
        local_direction="sendrecv",
        remote_direction="sendrecv",
        remote_ptime_ms=20,
        srtp=keys,
    )


def make_leg(
    keys: SrtpKeys | None,
) -> tuple[SipLeg, VirtualClock, list[bytes], list[Callable[[], None]], Events]:
    clock = VirtualClock()
    wire: list[bytes] = []
    deferred: list[Callable[[], None]] = []
    leg = SipLeg(
        negotiated(keys),
        clock=clock,
        send_datagram=lambda data, addr: wire.append(data),
        defer=deferred.append,
        ssrc=99,
        initial_sequence=65530,  # wraps during the test: the rollover counter runs
        initial_timestamp=0,
    )
    events = Events()
    leg.attach(events)
    return leg, clock, wire, deferred, events


def send_frames(leg: SipLeg, deferred: list[Callable[[], None]], frames: list[bytes]) -> None:
    for frame in frames:
        leg.frames_wanted(True)
        leg.send_frame(frame)
        deferred.pop()()


def pair() -> tuple[SrtpKeys, SrtpKeys]:
    a, b = new_key(), new_key()
    return SrtpKeys(SUITE, 1, a, b), SrtpKeys(SUITE, 1, b, a)


FRAMES = [bytes([0x10 + i]) * 160 for i in range(20)]


def test_round_trip_between_two_legs() -> None:
    ours, theirs = pair()
    alice, clock, wire, deferred, _ = make_leg(ours)
    bob, _, _, _, heard = make_leg(theirs)
    send_frames(alice, deferred, FRAMES)
    assert len(wire) == len(FRAMES)
    for data, frame in zip(wire, FRAMES, strict=True):
        assert frame not in data  # the payload is encrypted on the wire
        assert len(data) == 12 + 160 + 10  # the 80-bit tag (RFC 3711 §4.2)
        bob.datagram_received(data, PEER, clock.now())
    assert heard.audio == FRAMES  # decrypted in order, across the sequence wrap
    assert bob.srtp is not None and bob.srtp.dropped == 0


def test_replayed_and_tampered_packets_are_dropped_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    ours, theirs = pair()
    alice, clock, wire, deferred, _ = make_leg(ours)
    bob, _, _, _, heard = make_leg(theirs)
    send_frames(alice, deferred, FRAMES[:3])
    for data in wire:
        bob.datagram_received(data, PEER, clock.now())
    replays_before, auth_before = DROPS.replays, DROPS.auth_failures
    bob.datagram_received(wire[1], PEER, clock.now())  # replayed
    send_frames(alice, deferred, FRAMES[3:4])
    tampered = bytearray(wire[3])
    tampered[20] ^= 0x01
    bob.datagram_received(bytes(tampered), PEER, clock.now())
    bob.datagram_received(b"\x80\x00junk", PEER, clock.now())  # too short to be SRTP
    plain = RtpSender(payload_type=0, ssrc=5).audio(b"\xff" * 160)
    bob.datagram_received(plain, PEER, clock.now())  # plain RTP to an SRTP leg
    srtp = bob.srtp
    assert srtp is not None
    assert (srtp.replays, srtp.auth_failures) == (1, 3)
    # The process-wide totals behind /metrics moved by as much.
    assert (DROPS.replays - replays_before, DROPS.auth_failures - auth_before) == (1, 3)
    assert heard.audio == FRAMES[:3]
    # The genuine packet still gets through after the forged one.
    bob.datagram_received(wire[3], PEER, clock.now())
    assert heard.audio == FRAMES[:4]
    drops = [r for r in caplog.records if "SRTP dropped" in r.getMessage()]
    assert len(drops) == 1  # rate-limited: one line per LOG_INTERVAL_S
    clock.advance(11.0)
    bob.datagram_received(wire[0], PEER, clock.now())
    assert len([r for r in caplog.records if "SRTP dropped" in r.getMessage()]) == 2


def test_srtcp_on_the_rtp_port_is_checked_then_ignored() -> None:
    ours, theirs = pair()
    bob, clock, _, _, heard = make_leg(theirs)
    # A receiver report (RFC 3550 §6.4.2) from the peer, protected with the peer's key.
    rr = bytes([0x80, 201, 0, 1]) + (1234).to_bytes(4, "big")
    peer = Session(Policy(key=ours.send_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND))
    bob.datagram_received(peer.protect_rtcp(rr), PEER, clock.now())
    srtp = bob.srtp
    assert srtp is not None
    assert srtp.rtcp_received == 1 and srtp.dropped == 0
    assert bob.receiver.stats.rtcp == 1 and heard.audio == []
    bob.datagram_received(rr + bytes(14), PEER, clock.now())  # unauthenticated RTCP
    assert srtp.auth_failures == 1 and bob.receiver.stats.rtcp == 1


def test_protect_rtcp_round_trip() -> None:
    ours, theirs = pair()
    rr = bytes([0x80, 201, 0, 1]) + (99).to_bytes(4, "big")
    sent = SrtpStreams(ours).protect_rtcp(rr)
    assert SrtpStreams(theirs).unprotect(sent, 0.0) == rr


def test_streams_over_sessions_keyed_elsewhere() -> None:
    """A browser leg's sessions come from its DTLS handshake (RFC 5764 §4.2): counted and
    dropped the same way, never rekeyed by SDES."""
    ours, theirs = pair()
    into = Session(Policy(key=ours.receive_key, ssrc_type=Policy.SSRC_ANY_INBOUND))
    out = Session(Policy(key=ours.send_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND))
    streams = SrtpStreams.over(into, out, label="webrtc CA1")
    peer = SrtpStreams(theirs)
    packet = RtpSender(payload_type=0, ssrc=7).audio(b"x" * 160)
    assert peer.unprotect(streams.protect(packet), 0.0) == packet
    sent = peer.protect(packet)
    assert streams.unprotect(sent, 0.0) == packet
    assert streams.unprotect(sent, 0.0) is None and streams.replays == 1
    assert "webrtc CA1" in repr(streams) and streams.keys is None
    with pytest.raises(ValueError):
        streams.rekey(ours)


def test_plain_leg_sends_plain_rtp() -> None:
    leg, _, wire, deferred, _ = make_leg(None)
    assert leg.srtp is None
    send_frames(leg, deferred, FRAMES[:1])
    assert RtpPacket.parse(wire[0]).payload == FRAMES[0]


def test_rekey_follows_the_side_that_changed() -> None:
    ours, theirs = pair()
    alice, clock, wire, deferred, _ = make_leg(ours)
    bob, _, _, _, heard = make_leg(theirs)
    send_frames(alice, deferred, FRAMES[:2])
    for data in wire:
        bob.datagram_received(data, PEER, clock.now())
    # A re-INVITE: alice offers a new key, bob answers with a new one too.
    a2, b2 = new_key(), new_key()
    alice.update_media(negotiated(SrtpKeys(SUITE, 1, a2, b2)))
    bob.update_media(negotiated(SrtpKeys(SUITE, 1, b2, a2)))
    wire.clear()
    send_frames(alice, deferred, FRAMES[2:5])
    for data in wire:
        bob.datagram_received(data, PEER, clock.now())
    assert heard.audio == FRAMES[:5]
    # The old key no longer authenticates.
    old = SrtpStreams(ours)
    bob.datagram_received(old.protect(RtpSender(payload_type=0, ssrc=7).audio(b"x" * 160)), PEER, 0)
    assert bob.srtp is not None and bob.srtp.auth_failures == 1
    # An unchanged key keeps the session (its replay state carries on).
    before = bob.srtp
    bob.update_media(negotiated(SrtpKeys(SUITE, 1, b2, a2)))
    assert bob.srtp is before
    bob.datagram_received(wire[0], PEER, clock.now())
    assert bob.srtp.replays == 1
