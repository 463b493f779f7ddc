"""RTCP reports of the browser leg (appbridge/carriers/webrtc/rtcp.py), in virtual time.

Real ``RtpSender``/``RtpReceiver`` objects carry the media; every compound is read back with
aiortc's parser and checked field by field (RFC 3550 §6.1, §6.4, §6.5, §6.6, appendix A.3).
"""

from __future__ import annotations

import itertools
import random

import pytest
from aiortc.rtp import (
    RtcpByePacket,
    RtcpPacket,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpSdesPacket,
    RtcpSenderInfo,
    RtcpSourceInfo,
    RtcpSrPacket,
)

from appbridge.carriers.sip.rtp import RtpReceiver, RtpSender
from appbridge.carriers.webrtc.rtcp import (
    INTERVAL_SPREAD,
    MIN_INTERVAL_S,
    NTP_EPOCH_OFFSET_S,
    SDES_CNAME,
    SDES_MID,
    RtcpReports,
    ntp_timestamp,
)

LOCAL_SSRC = 0x1111_2222
REMOTE_SSRC = 0xAAAA_BBBB
SOURCE = ("127.0.0.1", 5000)
FRAME = b"\xff" * 160
WALLCLOCK = 1_796_601_600.25  # 2026-12-07 00:00:00.25 UTC


def _reports(*, mid: str | None = "0", now: float = 0.0, seed: int = 1) -> RtcpReports:
    return RtcpReports(
        ssrc=LOCAL_SSRC,
        cname="appbridge-test",
        mid=mid,
        now=now,
        rng=random.Random(seed),
    )


def _local() -> RtpSender:
    return RtpSender(
        payload_type=0, ssrc=LOCAL_SSRC, initial_sequence=100, initial_timestamp=4_000_000
    )


def _remote(ssrc: int = REMOTE_SSRC, first_seq: int = 1000) -> RtpSender:
    return RtpSender(payload_type=0, ssrc=ssrc, initial_sequence=first_seq, initial_timestamp=0)


def _feed(
    remote: RtpSender,
    receiver: RtpReceiver,
    count: int,
    *,
    drop: frozenset[int] = frozenset(),
    start: float = 0.0,
) -> None:
    """Sends `count` 20 ms packets from `remote`; the ones at the indexes in `drop` are lost."""
    for index in range(count):
        data = remote.audio(FRAME)
        if index not in drop:
            receiver.receive(data, SOURCE, start + index * 0.02)


def _parse(data: bytes) -> list[object]:
    return list(RtcpPacket.parse(data))


def _block(data: bytes) -> RtcpReceiverInfo:
    head = _parse(data)[0]
    assert isinstance(head, RtcpSrPacket | RtcpRrPacket)
    assert len(head.reports) == 1
    return head.reports[0]


def _remote_sr(ntp: int, ssrc: int = REMOTE_SSRC) -> bytes:
    info = RtcpSenderInfo(ntp_timestamp=ntp, rtp_timestamp=1, packet_count=2, octet_count=3)
    sdes = RtcpSdesPacket(chunks=[RtcpSourceInfo(ssrc=ssrc, items=[(1, b"browser")])])
    return bytes(RtcpSrPacket(ssrc=ssrc, sender_info=info)) + bytes(sdes)


def test_rr_with_sdes_before_any_media() -> None:
    reports = _reports()
    packets = _parse(reports.report(3.0, _local(), RtpReceiver(payload_types={0}), WALLCLOCK))
    assert packets == [
        RtcpRrPacket(ssrc=LOCAL_SSRC, reports=[]),
        RtcpSdesPacket(
            chunks=[
                RtcpSourceInfo(ssrc=LOCAL_SSRC, items=[(SDES_CNAME, b"appbridge-test"), (15, b"0")])
            ]
        ),
    ]
    assert reports.reports_sent == 1


def test_sdes_without_mid_has_only_the_cname() -> None:
    reports = _reports(mid=None)
    packets = _parse(reports.report(3.0, _local(), RtpReceiver(payload_types={0}), WALLCLOCK))
    sdes = packets[1]
    assert isinstance(sdes, RtcpSdesPacket)
    assert sdes.chunks == [RtcpSourceInfo(ssrc=LOCAL_SSRC, items=[(1, b"appbridge-test")])]
    assert SDES_MID == 15


def test_sdes_items_longer_than_255_bytes_are_refused() -> None:
    with pytest.raises(ValueError):
        RtcpReports(ssrc=1, cname="x" * 256, mid=None, now=0.0)
    with pytest.raises(ValueError):
        RtcpReports(ssrc=1, cname="c", mid="m" * 256, now=0.0)


def test_sr_when_rtp_was_sent_since_the_previous_report() -> None:
    reports, sender, receiver = _reports(), _local(), RtpReceiver(payload_types={0})
    for _ in range(50):
        sender.audio(FRAME)
    head = _parse(reports.report(3.0, sender, receiver, WALLCLOCK))[0]
    expected_ntp = ((1_796_601_600 + NTP_EPOCH_OFFSET_S) << 32) | 0x4000_0000
    assert head == RtcpSrPacket(
        ssrc=LOCAL_SSRC,
        sender_info=RtcpSenderInfo(
            ntp_timestamp=expected_ntp,
            rtp_timestamp=4_000_000 + 50 * 160,
            packet_count=50,
            octet_count=50 * 160,
        ),
        reports=[],
    )
    # Nothing sent since: an RR. One more packet: an SR again, with the running totals.
    assert isinstance(_parse(reports.report(8.0, sender, receiver, WALLCLOCK + 5))[0], RtcpRrPacket)
    sender.skip()
    sender.audio(b"\x00" * 80, duration_units=80)
    head = _parse(reports.report(13.0, sender, receiver, WALLCLOCK + 10))[0]
    assert isinstance(head, RtcpSrPacket)
    assert head.sender_info.packet_count == 51
    assert head.sender_info.octet_count == 50 * 160 + 80
    assert head.sender_info.rtp_timestamp == 4_000_000 + 51 * 160 + 80
    assert head.sender_info.ntp_timestamp == expected_ntp + (10 << 32)


def test_sender_counts_wrap_at_32_bits() -> None:
    reports, sender = _reports(), _local()
    sender.audio(FRAME)
    sender.packets_sent = (1 << 32) + 7
    sender.payload_bytes_sent = (3 << 32) + 9
    head = _parse(reports.report(3.0, sender, RtpReceiver(payload_types={0}), WALLCLOCK))[0]
    assert isinstance(head, RtcpSrPacket)
    assert (head.sender_info.packet_count, head.sender_info.octet_count) == (7, 9)


def test_ntp_timestamp() -> None:
    assert ntp_timestamp(0.0) == NTP_EPOCH_OFFSET_S << 32
    assert ntp_timestamp(1.5) == ((NTP_EPOCH_OFFSET_S + 1) << 32) | 0x8000_0000
    # The 32-bit seconds roll over into NTP era 1 in February 2036 (RFC 5905 §6).
    assert ntp_timestamp(float((1 << 32) - NTP_EPOCH_OFFSET_S + 3)) == 3 << 32


def test_report_block_for_a_known_loss_pattern() -> None:
    reports, receiver, remote = _reports(), RtpReceiver(payload_types={0}), _remote()
    _feed(remote, receiver, 100, drop=frozenset({10, 20, 30, 40, 50}))
    assert _block(reports.report(3.0, _local(), receiver, WALLCLOCK)) == RtcpReceiverInfo(
        ssrc=REMOTE_SSRC,
        fraction_lost=(5 << 8) // 100,
        packets_lost=5,
        highest_sequence=1099,
        jitter=0,
        lsr=0,
        dlsr=0,
    )
    # The fraction covers the interval since the previous report; the count is cumulative.
    _feed(remote, receiver, 50, drop=frozenset(range(5, 45, 4)), start=2.0)
    block = _block(reports.report(8.0, _local(), receiver, WALLCLOCK + 5))
    assert (block.fraction_lost, block.packets_lost, block.highest_sequence) == (
        (10 << 8) // 50,
        15,
        1149,
    )
    # Nothing expected in the interval: fraction 0, the cumulative count stays.
    block = _block(reports.report(13.0, _local(), receiver, WALLCLOCK + 10))
    assert (block.fraction_lost, block.packets_lost) == (0, 15)
    # No loss in the interval: fraction 0.
    _feed(remote, receiver, 20, start=14.0)
    block = _block(reports.report(18.0, _local(), receiver, WALLCLOCK + 15))
    assert (block.fraction_lost, block.packets_lost, block.highest_sequence) == (0, 15, 1169)


def test_duplicates_do_not_hide_losses() -> None:
    reports, receiver, remote = _reports(), RtpReceiver(payload_types={0}), _remote()
    for index in range(10):
        data = remote.audio(FRAME)
        if index != 3:
            receiver.receive(data, SOURCE, index * 0.02)
            receiver.receive(data, SOURCE, index * 0.02 + 0.001)
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert (block.fraction_lost, block.packets_lost) == ((1 << 8) // 10, 1)


def test_jitter_is_the_receivers_estimate() -> None:
    reports, receiver, remote = _reports(), RtpReceiver(payload_types={0}), _remote()
    for index in range(30):
        receiver.receive(remote.audio(FRAME), SOURCE, index * 0.02 + (0.005 if index % 3 else 0))
    assert receiver.stats.jitter_units > 0
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert block.jitter == receiver.stats.jitter_units


def test_extended_highest_sequence_across_the_16_bit_wrap() -> None:
    reports, receiver, remote = _reports(), RtpReceiver(payload_types={0}), _remote(first_seq=65530)
    _feed(remote, receiver, 20, drop=frozenset({7}))  # 65530..65535, then 0..13
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert block.highest_sequence == (1 << 16) | 13  # one cycle, highest sequence 13
    assert (block.packets_lost, block.fraction_lost) == (1, (1 << 8) // 20)


def test_a_new_remote_ssrc_restarts_the_interval_counters() -> None:
    reports, receiver = _reports(), RtpReceiver(payload_types={0})
    _feed(_remote(), receiver, 100, drop=frozenset(range(10, 20)))
    assert _block(reports.report(3.0, _local(), receiver, WALLCLOCK)).ssrc == REMOTE_SSRC
    _feed(_remote(ssrc=0x5555, first_seq=7), receiver, 50, drop=frozenset({1, 2, 3, 4, 5}), start=3)
    block = _block(reports.report(8.0, _local(), receiver, WALLCLOCK + 5))
    assert block == RtcpReceiverInfo(
        ssrc=0x5555,
        fraction_lost=(5 << 8) // 50,
        packets_lost=5,
        highest_sequence=56,
        jitter=0,
        lsr=0,
        dlsr=0,
    )


def test_lsr_and_dlsr_after_a_received_sr() -> None:
    reports, receiver = _reports(), RtpReceiver(payload_types={0})
    _feed(_remote(), receiver, 10)
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert (block.lsr, block.dlsr) == (0, 0)
    ntp = 0x1234_5678_9ABC_DEF0
    reports.received(_remote_sr(ntp), 10.0)
    reports.received(_remote_sr(0x7777_0000_0000_0000, ssrc=0x9999), 10.5)  # another sender
    assert (reports.packets_received, reports.invalid) == (2, 0)
    block = _block(reports.report(10.75, _local(), receiver, WALLCLOCK + 8))
    assert (block.lsr, block.dlsr) == (0x5678_9ABC, 49152)  # 0.75 s in 1/65536 s
    # A newer SR replaces the older one.
    reports.received(_remote_sr(0x2000_0001_0002_0000), 20.0)
    block = _block(reports.report(22.0, _local(), receiver, WALLCLOCK + 19))
    assert (block.lsr, block.dlsr) == (0x0001_0002, 2 * 65536)


def test_remembered_senders_are_bounded() -> None:
    reports, receiver = _reports(), RtpReceiver(payload_types={0})
    _feed(_remote(), receiver, 10)
    reports.received(_remote_sr(0x1234_5678_9ABC_DEF0), 1.0)
    for other in range(4):
        reports.received(_remote_sr(1 << 48, ssrc=0x100 + other), 2.0)
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert (block.lsr, block.dlsr) == (0, 0)  # the oldest sender was forgotten


def test_bye_closes_the_last_compound() -> None:
    reports, sender, receiver = _reports(), _local(), RtpReceiver(payload_types={0})
    sender.audio(FRAME)
    _feed(_remote(), receiver, 10)
    packets = _parse(reports.bye(sender, receiver, WALLCLOCK, 4.0))
    assert [type(packet) for packet in packets] == [RtcpSrPacket, RtcpSdesPacket, RtcpByePacket]
    assert packets[-1] == RtcpByePacket(sources=[LOCAL_SSRC])
    head = packets[0]
    assert isinstance(head, RtcpSrPacket)
    assert head.reports[0].ssrc == REMOTE_SSRC
    assert reports.reports_sent == 1
    # With nothing sent since the previous report, the closing compound starts with an RR.
    packets = _parse(reports.bye(sender, receiver, WALLCLOCK + 1, 5.0))
    assert [type(packet) for packet in packets] == [RtcpRrPacket, RtcpSdesPacket, RtcpByePacket]


def test_interval_scheduling_in_virtual_time() -> None:
    reference = random.Random(42)
    low, high = INTERVAL_SPREAD
    reports = _reports(now=100.0, seed=42)
    first = 100.0 + MIN_INTERVAL_S / 2 * reference.uniform(low, high)
    assert reports.next_report_at == first
    assert not reports.due(first - 1e-6)
    assert reports.due(first)
    sender, receiver = _local(), RtpReceiver(payload_types={0})
    reports.report(first, sender, receiver, WALLCLOCK)
    second = first + MIN_INTERVAL_S * reference.uniform(low, high)
    assert reports.next_report_at == second
    assert not reports.due(second - 1e-6)


def _schedule(seed: int) -> list[float]:
    """The times of the reports over one minute of 20 ms media ticks."""
    reports = _reports(seed=seed)
    sender, receiver = _local(), RtpReceiver(payload_types={0})
    times: list[float] = []
    for tick in range(60 * 50):
        now = tick * 0.02
        if reports.due(now):
            reports.report(now, sender, receiver, WALLCLOCK + now)
            times.append(now)
    assert reports.reports_sent == len(times)
    return times


def test_reports_on_the_media_tick_stay_within_the_interval_bounds() -> None:
    times = _schedule(7)
    low, high = INTERVAL_SPREAD
    assert MIN_INTERVAL_S / 2 * low <= times[0] <= MIN_INTERVAL_S / 2 * high + 0.02
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(MIN_INTERVAL_S * low <= gap <= MIN_INTERVAL_S * high + 0.02 for gap in gaps)
    assert len({round(gap, 2) for gap in gaps}) > 1  # randomized, not a fixed period
    assert len(times) >= 8
    assert _schedule(7) == times  # the same seed, the same schedule
    assert _schedule(8) != times


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80",
        b"\x80\xc8\x00",
        b"\x40\xc9\x00\x01\x00\x00\x00\x01",  # version 1
        b"\x81\xc8\x00\x06" + bytes(24),  # SR claims a report block it does not carry
        b"\x80\xc9\x00\x05" + bytes(8),  # longer than the datagram
        b"\xa0\xc9\x00\x01\x00\x00\x00\x00",  # padding count 0
        b"\x82\xca\x00\x02" + bytes(8),  # SDES claims two chunks, carries one
        b"\x82\xcb\x00\x01\x00\x00\x00\x01",  # BYE with two sources, one present
        _remote_sr(1 << 40)[:-2],  # a valid SR, then a truncated SDES
    ],
)
def test_malformed_compounds_are_counted_and_ignored(data: bytes) -> None:
    reports, receiver = _reports(), RtpReceiver(payload_types={0})
    _feed(_remote(), receiver, 10)
    reports.received(data, 1.0)
    assert (reports.invalid, reports.packets_received) == (1, 0)
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert (block.lsr, block.dlsr) == (0, 0)


def test_compounds_without_an_sr_are_received_without_effect() -> None:
    reports, receiver = _reports(), RtpReceiver(payload_types={0})
    _feed(_remote(), receiver, 10)
    rr = bytes(RtcpRrPacket(ssrc=REMOTE_SSRC))
    pli = bytes(RtcpPsfbPacket(fmt=1, ssrc=REMOTE_SSRC, media_ssrc=LOCAL_SSRC))
    bye = bytes(RtcpByePacket(sources=[REMOTE_SSRC]))
    for data in (rr, pli, rr + bye):
        reports.received(data, 1.0)
    assert (reports.packets_received, reports.invalid) == (3, 0)
    block = _block(reports.report(3.0, _local(), receiver, WALLCLOCK))
    assert (block.lsr, block.dlsr) == (0, 0)
