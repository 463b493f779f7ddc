"""RTP packets, the continuous sender and the latching receiver (RFC 3550, RFC 3551)."""

from __future__ import annotations

import struct

import pytest

from appbridge.carriers.sip.rtp import (
    InterarrivalJitter,
    RtpError,
    RtpPacket,
    RtpReceiver,
    RtpSender,
    is_rtcp,
    seq_delta,
)
from appbridge.clock import VirtualClock

from .media_fixtures import SIPP_DIR, load_captures, pcap_udp_payloads

PEER = ("198.51.100.7", 40000)
OTHER = ("203.0.113.9", 50000)


def pkt(seq: int, ts: int = 0, pt: int = 0, ssrc: int = 0x1234, payload: bytes = b"\xff") -> bytes:
    return RtpPacket(pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc, payload).serialize()


# -- packet format ---------------------------------------------------------------------------


def test_parse_minimal_header_fields() -> None:
    data = bytes.fromhex("80e52f30000044e00e05384e") + b"\x00\x0a\x00\x00"
    p = RtpPacket.parse(data)
    assert (p.payload_type, p.marker, p.sequence, p.timestamp, p.ssrc) == (
        101,
        True,
        0x2F30,
        0x44E0,
        0x0E05384E,
    )
    assert p.payload == b"\x00\x0a\x00\x00"
    assert p.csrc == () and p.extension_profile is None and p.padding_bytes == 0
    assert p.serialize() == data


def test_round_trip_with_csrc_extension_and_padding() -> None:
    p = RtpPacket(
        payload_type=96,
        sequence=65535,
        timestamp=0xFFFFFFFF,
        ssrc=0xDEADBEEF,
        payload=b"abc",
        marker=True,
        csrc=(1, 2, 0xFFFFFFFF),
        extension_profile=0xBEDE,
        extension=b"\x10\x01\x00\x00",
        padding_bytes=5,
    )
    data = p.serialize()
    assert data[0] == 0x80 | 0x20 | 0x10 | 3
    assert len(data) == 12 + 12 + 4 + 4 + 3 + 5
    assert data[-1] == 5 and data[-5:-1] == b"\x00" * 4
    assert RtpPacket.parse(data) == p


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "short"),
        (b"\x80\x00" + b"\x00" * 9, "short"),
        (b"\x40\x00" + b"\x00" * 10, "version"),
        (b"\x83\x00" + b"\x00" * 10 + b"\x00" * 8, "csrc"),
        (b"\x90\x00" + b"\x00" * 10 + b"\xbe\xde", "extension header"),
        (b"\x90\x00" + b"\x00" * 10 + b"\xbe\xde\x00\x02" + b"\x00" * 4, "extension length"),
        (b"\xa0\x00" + b"\x00" * 10 + b"\x00", "padding zero"),
        (b"\xa0\x00" + b"\x00" * 10 + b"ab\x09", "padding too long"),
        (b"\x80\xc8" + b"\x00" * 10, "rtcp sender report"),
    ],
)
def test_parse_rejects_invalid(data: bytes, why: str) -> None:
    with pytest.raises(RtpError):
        RtpPacket.parse(data)


def test_serialize_rejects_out_of_range_fields() -> None:
    with pytest.raises(RtpError):
        RtpPacket(128, 0, 0, 0).serialize()
    with pytest.raises(RtpError):
        RtpPacket(0, 70000, 0, 0).serialize()
    with pytest.raises(RtpError):
        RtpPacket(0, 0, 0, 0, csrc=tuple(range(16))).serialize()
    with pytest.raises(RtpError):
        RtpPacket(0, 0, 0, 0, extension_profile=1, extension=b"abc").serialize()


def test_is_rtcp_demultiplexing() -> None:
    assert is_rtcp(bytes.fromhex("80c8000c"))  # SR
    assert is_rtcp(bytes.fromhex("81c9"))  # RR
    assert not is_rtcp(pkt(1))
    assert not is_rtcp(b"\x80")


def test_seq_delta_wraps() -> None:
    assert seq_delta(0, 65535) == 1
    assert seq_delta(65535, 0) == -1
    assert seq_delta(10, 5) == 5
    assert seq_delta(5, 10) == -5
    assert seq_delta(0x8000, 0) == -0x8000


def test_sipp_captures_parse_and_round_trip() -> None:
    captures = load_captures()
    assert len(captures) == 13
    for name, packets in captures.items():
        for _, data in packets:
            p = RtpPacket.parse(data)
            assert p.serialize() == data
            if name.startswith("dtmf"):
                assert p.payload_type == 101 and len(p.payload) == 4
            else:
                assert p.payload_type == 8 and len(p.payload) == 240  # 30 ms of A-law


def test_fixture_matches_the_pcaps_sip_tester_ships() -> None:
    """The fixture is a faithful copy; cross-checked where sip-tester is installed (the SIP
    interop tests install it). The fixture alone carries the other tests."""
    if not SIPP_DIR.is_dir():
        pytest.skip("sip-tester is not installed")
    for name, packets in load_captures().items():
        real = pcap_udp_payloads(SIPP_DIR / name)
        assert [d for _, d in packets] == [d for _, d in real[: len(packets)]]


# -- sender ----------------------------------------------------------------------------------


def test_sender_keeps_one_ssrc_and_continuous_numbers_across_items_and_silence() -> None:
    s = RtpSender(
        payload_type=0, ssrc=0xCAFE, initial_sequence=65534, initial_timestamp=2**32 - 160
    )
    out = [RtpPacket.parse(s.audio(b"\x01" * 160)) for _ in range(3)]
    s.skip()  # 20 ms of silence not sent
    s.skip()
    out += [RtpPacket.parse(s.audio(b"\x02" * 160)) for _ in range(2)]
    out.append(RtpPacket.parse(s.audio(b"\x03" * 160, talkspurt_start=True)))  # next item
    assert {p.ssrc for p in out} == {0xCAFE}
    assert [p.sequence for p in out] == [65534, 65535, 0, 1, 2, 3]
    assert [p.timestamp for p in out] == [2**32 - 160, 0, 160, 640, 800, 960]
    assert [p.marker for p in out] == [True, False, False, True, False, True]
    assert s.packets_sent == 6 and s.payload_bytes_sent == 960


def test_sender_sends_silence_packets_without_marker() -> None:
    s = RtpSender(payload_type=8, ssrc=1, initial_sequence=0, initial_timestamp=0)
    first = RtpPacket.parse(s.audio(b"\xd5" * 160))
    second = RtpPacket.parse(s.audio(b"\xd5" * 160))
    assert first.marker and not second.marker and second.payload_type == 8


def test_sender_puts_its_header_extension_on_every_packet() -> None:
    """A browser leg's MID (RFC 8843 §15.2) as an RFC 8285 one-byte element, whole words."""
    ext = bytes.fromhex("bede0001") + bytes.fromhex("10300000")
    s = RtpSender(
        payload_type=111, event_payload_type=101, ssrc=3, initial_sequence=0, extension=ext
    )
    packets = [RtpPacket.parse(s.audio(b"opus")), RtpPacket.parse(s.audio(b"opus"))]
    packets.append(RtpPacket.parse(s.event(b"\x05\x0a\x00\x00", timestamp=0, marker=True)))
    assert all((p.extension_profile, p.extension) == (0xBEDE, ext[4:]) for p in packets)
    assert [p.payload for p in packets[:2]] == [b"opus", b"opus"]
    assert s.payload_bytes_sent == 12  # the payloads only
    for bad in (b"\xbe\xde", bytes(6)):
        with pytest.raises(ValueError):
            RtpSender(payload_type=0, extension=bad)


def test_sender_events_share_the_sequence_space() -> None:
    s = RtpSender(
        payload_type=0, event_payload_type=101, ssrc=7, initial_sequence=10, initial_timestamp=0
    )
    s.audio(b"\xff" * 160)
    e = RtpPacket.parse(s.event(b"\x05\x0a\x00\x00", timestamp=160, marker=True))
    s.skip()
    a = RtpPacket.parse(s.audio(b"\xff" * 160))
    assert (e.payload_type, e.sequence, e.timestamp, e.marker) == (101, 11, 160, True)
    assert (a.sequence, a.timestamp, a.marker) == (12, 320, True)


def test_sender_without_event_type_refuses_events() -> None:
    with pytest.raises(RuntimeError):
        RtpSender(payload_type=0).event(b"\0\0\0\0", timestamp=0, marker=True)


def test_sender_defaults_are_random() -> None:
    a, b = RtpSender(payload_type=0), RtpSender(payload_type=0)
    assert (a.ssrc, a.next_sequence, a.timestamp) != (b.ssrc, b.next_sequence, b.timestamp)


def test_sender_codec_switch_keeps_stream() -> None:
    s = RtpSender(payload_type=0, ssrc=3, initial_sequence=0, initial_timestamp=0)
    s.audio(b"\xff" * 160)
    s.set_payload_type(9)
    p = RtpPacket.parse(s.audio(b"\x00" * 160))
    assert (p.payload_type, p.ssrc, p.sequence, p.timestamp) == (9, 3, 1, 160)


# -- receiver --------------------------------------------------------------------------------


def test_receiver_latches_to_first_valid_source() -> None:
    clock = VirtualClock()
    r = RtpReceiver(payload_types={0, 101}, remote_address=("192.0.2.1", 4000))
    assert r.send_address == ("192.0.2.1", 4000)
    assert r.receive(b"garbage", OTHER, clock.now()) is None  # invalid packets never latch
    assert r.receive(pkt(1, pt=96), OTHER, clock.now()) is None  # nor unknown payload types
    assert r.latched_address is None
    arrival = r.receive(pkt(1), PEER, clock.now())
    assert arrival is not None and not arrival.source_changed
    assert r.send_address == PEER
    clock.advance(0.02)
    assert r.receive(pkt(2), OTHER, clock.now()) is None
    assert r.stats.foreign_packets == 1 and r.stats.invalid == 1
    assert r.stats.unknown_payload_type == 1
    assert r.send_address == PEER


def test_receiver_relatches_only_after_silence_of_the_latched_source() -> None:
    clock = VirtualClock()
    r = RtpReceiver(payload_types={0}, relatch_silence_s=1.0)
    r.receive(pkt(1), PEER, clock.now())
    clock.advance(0.9)
    assert r.receive(pkt(2, ssrc=99), OTHER, clock.now()) is None
    clock.advance(0.2)  # PEER silent for 1.1 s now
    arrival = r.receive(pkt(500, ssrc=99), OTHER, clock.now())
    assert arrival is not None and arrival.source_changed
    assert r.send_address == OTHER and r.stats.relatches == 1
    assert r.receive(pkt(3), PEER, clock.now()) is None


def test_receiver_reset_latch_after_reinvite() -> None:
    r = RtpReceiver(payload_types={0})
    r.receive(pkt(1), PEER, 0.0)
    r.reset_latch(("192.0.2.50", 6000))
    assert r.send_address == ("192.0.2.50", 6000)
    assert r.receive(pkt(2), OTHER, 0.01) is not None
    assert r.send_address == OTHER


def test_receiver_counts_rtcp_separately() -> None:
    r = RtpReceiver(payload_types={0})
    assert r.receive(bytes.fromhex("80c80006") + bytes(20), PEER, 0.0) is None
    assert r.stats.rtcp == 1 and r.latched_address is None


def test_receiver_stats_loss_duplicates_reordering_across_wrap() -> None:
    r = RtpReceiver(payload_types={0})
    order = [65533, 65534, 0, 65535, 1, 1, 3, 4, 4]  # 2 lost, 65535 late, dups of 1 and 4
    accepted = [r.receive(pkt(s), PEER, i * 0.02) for i, s in enumerate(order)]
    assert [a.ext_sequence if a else None for a in accepted] == [
        65533,
        65534,
        65536,
        65535,
        65537,
        None,
        65539,
        65540,
        None,
    ]
    st = r.stats
    assert st.duplicates == 2 and st.reordered == 1
    assert st.received == 7 and st.expected == 8 and st.lost == 1


def test_receiver_duplicates_are_told_from_late_packets_across_the_window() -> None:
    r = RtpReceiver(payload_types={0})
    assert r.receive(pkt(1), PEER, 0.0) is not None
    late = r.receive(pkt(65535), PEER, 0.0)  # before the first packet: extended to -1
    assert late is not None and late.ext_sequence == -1
    assert r.receive(pkt(65535), PEER, 0.0) is None  # its copy
    for seq in range(2, 400):
        assert r.receive(pkt(seq), PEER, 0.0) is not None
    assert r.stats.duplicates == 1 and r.stats.reordered == 1
    assert r.receive(pkt(399 - 99), PEER, 0.0) is None  # a copy, 99 behind
    assert r.receive(pkt(399 - 127), PEER, 0.0) is None  # a copy, stale too
    assert r.stats.duplicates == 3 and r.stats.reordered == 1
    assert r.receive(pkt(399 - 200), PEER, 0.0) is None  # beyond the window: stale
    assert r.stats.duplicates == 3 and r.stats.reordered == 2
    assert r.stats.received == 400 and r.stats.lost == 1  # 0 never came


def test_receiver_ssrc_change_restarts_statistics() -> None:
    r = RtpReceiver(payload_types={0})
    for s in range(10, 20):
        r.receive(pkt(s, ssrc=1), PEER, 0.0)
    arrival = r.receive(pkt(5000, ssrc=2), PEER, 0.3)
    assert arrival is not None and arrival.source_changed
    assert r.ssrc == 2 and r.stats.source_changes == 1
    assert r.stats.expected == 1 and r.stats.lost == 0


def test_receiver_large_jump_rebases() -> None:
    r = RtpReceiver(payload_types={0})
    r.receive(pkt(100), PEER, 0.0)
    r.receive(pkt(101), PEER, 0.02)
    r.receive(pkt(20000), PEER, 0.04)  # a restart, not 19898 lost packets
    assert r.stats.lost == 0


def test_interarrival_jitter_matches_rfc3550_formula() -> None:
    j = InterarrivalJitter(8000)
    # Packets every 160 units; arrivals 20 ms apart except one 10 ms late.
    arrivals = [0.0, 0.020, 0.050, 0.060, 0.080]
    for i, t in enumerate(arrivals):
        j.update(i * 160, t)
    expected = 0.0
    for d in (0, 80, 80, 0):
        expected += (d - expected) / 16
    assert j.jitter_units == int(expected)
    assert j.jitter_s == pytest.approx(expected / 8000)


def test_parse_accepts_memoryview_like_bytes() -> None:
    data = struct.pack("!BBHII", 0x80, 0, 1, 2, 3) + b"x"
    assert RtpPacket.parse(bytes(bytearray(data))).payload == b"x"
