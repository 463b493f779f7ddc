"""RTCP sender and receiver reports of the browser leg, as plain compound packets.

A WebRTC endpoint must send RTCP (RFC 8834 §4.1, RFC 3550 §6). The browser leg sends its RTP
with the project's own ``RtpSender`` and reads the browser's with ``RtpReceiver``
(appbridge/carriers/sip/rtp.py), keeping aiortc for ICE and DTLS-SRTP only, so
the reports come from here. :class:`RtcpReports` is pure: the leg asks :meth:`RtcpReports.due`
on each media-clock tick, sends what :meth:`RtcpReports.report` returns through SRTCP, and hands
each unprotected incoming compound to :meth:`RtcpReports.received`. Nothing here runs per RTP
packet and nothing awaits, so the timing is tested in virtual time.

What one compound carries (RFC 3550 §6.1):

1. An SR (§6.4.1) when the leg sent RTP since its previous report, else an RR (§6.4.2), with
   one report block about the browser's stream once its SSRC is known (§6.4.1, appendix A.3).
2. An SDES packet (§6.5) with the CNAME item and, when the leg has a ``mid``, the MID item of
   RFC 8843 §15, which tells the browser which m= section the stream belongs to.
3. In the last compound only (:meth:`RtcpReports.bye`), a BYE (§6.6) for the leg's SSRC.

Packets are built and parsed with aiortc's ``aiortc.rtp`` RTCP classes; SRTCP (RFC 3711) is
the caller's job.
"""

from __future__ import annotations

import math
import random
import struct
from typing import TYPE_CHECKING, Final

from aiortc.rtp import (
    RtcpByePacket,
    RtcpPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpSdesPacket,
    RtcpSenderInfo,
    RtcpSourceInfo,
    RtcpSrPacket,
)

if TYPE_CHECKING:
    from appbridge.carriers.sip.rtp import RtpReceiver, RtpSender

__all__ = [
    "INTERVAL_SPREAD",
    "MIN_INTERVAL_S",
    "NTP_EPOCH_OFFSET_S",
    "SDES_CNAME",
    "SDES_MID",
    "RtcpReports",
    "ntp_timestamp",
]

#: The minimum report interval of RFC 3550 §6.2; the first report waits half of it (§6.3.1).
MIN_INTERVAL_S: Final = 5.0
#: Each interval is the minimum times a uniform draw from this range (RFC 3550 §6.3.1), so that
#: the two ends of a call do not report in lockstep.
INTERVAL_SPREAD: Final = (0.5, 1.5)
#: Seconds from the NTP epoch (1900-01-01) to the Unix epoch (RFC 3550 §4, RFC 5905 §6).
NTP_EPOCH_OFFSET_S: Final = 2_208_988_800
#: SDES item types: CNAME (RFC 3550 §6.5.1) and MID (RFC 8843 §15).
SDES_CNAME: Final = 1
SDES_MID: Final = 15
#: Remote senders whose last SR is remembered for LSR/DLSR; a browser leg has one, and the
#: bound keeps a peer that cycles SSRCs from growing the table.
_MAX_REMEMBERED_SENDERS: Final = 4
_U32: Final = 0xFFFF_FFFF
_U64: Final = 0xFFFF_FFFF_FFFF_FFFF
#: The cumulative number of packets lost is a 24-bit signed field (RFC 3550 §6.4.1).
_LOST_MAX: Final = 0x7F_FFFF
_LOST_MIN: Final = -0x80_0000
_SDES_ITEM_MAX: Final = 255
#: What a malformed compound makes aiortc's parser raise.
_PARSE_ERRORS: Final = (ValueError, struct.error, IndexError)


def ntp_timestamp(wallclock: float) -> int:
    """The 64-bit NTP timestamp (32.32 fixed point, RFC 3550 §4) of a Unix time in seconds.

    The seconds wrap at 2**32 (the NTP era rollover of RFC 5905 §6), which is what the 32-bit
    field carries after 2036."""
    seconds = math.floor(wallclock)
    fraction = int((wallclock - seconds) * (1 << 32))
    return ((((seconds + NTP_EPOCH_OFFSET_S) & _U32) << 32) | fraction) & _U64


def _middle32(ntp: int) -> int:
    """The middle 32 bits of an NTP timestamp, the form LSR carries (RFC 3550 §6.4.1)."""
    return (ntp >> 16) & _U32


def _sdes_item(kind: str, value: str) -> bytes:
    data = value.encode()
    if not 0 < len(data) <= _SDES_ITEM_MAX:
        raise ValueError(f"the SDES {kind} must be 1..{_SDES_ITEM_MAX} bytes (RFC 3550 §6.5)")
    return data


class RtcpReports:
    """The RTCP of one browser leg: when to report, what a report says, what the peer sent.

    ``ssrc`` is the leg's sending SSRC (the ``RtpSender``'s), ``cname`` its SDES CNAME (chosen
    by the leg, as RFC 7022 describes) and ``mid`` the media section of the stream, or None when
    the SDP had no ``a=mid``. The SR's RTP timestamp and the report block's jitter are in RTP
    clock units, as ``sender`` and ``receiver`` keep them (RFC 3550 §6.4.1). ``now`` is the
    leg's media clock (seconds, virtual in tests) and ``rng`` the source of the interval
    randomization (a seeded ``random.Random`` in tests).

    Counters: ``reports_sent`` (compounds built, the closing one included),
    ``packets_received`` (incoming compounds that parsed) and ``invalid`` (ones that did not).
    """

    __slots__ = (
        "_expected_prior",
        "_items",
        "_last_sr",
        "_next_at",
        "_packets_prior",
        "_received_prior",
        "_remote_ssrc",
        "_rng",
        "_ssrc",
        "invalid",
        "packets_received",
        "reports_sent",
    )

    def __init__(
        self,
        *,
        ssrc: int,
        cname: str,
        mid: str | None,
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        self._ssrc = ssrc & _U32
        items = [(SDES_CNAME, _sdes_item("CNAME", cname))]
        if mid is not None:
            items.append((SDES_MID, _sdes_item("MID", mid)))
        self._items = items
        self._rng = random.Random() if rng is None else rng
        # The SR/RR choice compares with the count at the previous report (RFC 3550 §6.4).
        self._packets_prior = 0
        # The report block's interval counters (RFC 3550 appendix A.3), per remote SSRC.
        self._remote_ssrc: int | None = None
        self._expected_prior = 0
        self._received_prior = 0
        # Remote SSRC -> (middle 32 bits of its last SR's NTP timestamp, arrival time).
        self._last_sr: dict[int, tuple[int, float]] = {}
        self._next_at = now + self._interval(MIN_INTERVAL_S / 2)
        self.reports_sent = 0
        self.packets_received = 0
        self.invalid = 0

    @property
    def next_report_at(self) -> float:
        """When the next report is due, on the clock of ``now``."""
        return self._next_at

    def _interval(self, minimum_s: float) -> float:
        """A report interval: the minimum spread uniformly over :data:`INTERVAL_SPREAD`
        (RFC 3550 §6.3.1). Two members and audio-rate RTCP stay far below the 5 % bandwidth
        share of §6.2, so the minimum is what sets the interval."""
        low, high = INTERVAL_SPREAD
        return minimum_s * self._rng.uniform(low, high)

    def due(self, now: float) -> bool:
        """Whether the next report is due; a compare only, as it runs on every media tick."""
        return now >= self._next_at

    def report(
        self, now: float, sender: RtpSender, receiver: RtpReceiver, wallclock: float
    ) -> bytes:
        """One compound report (SR or RR, then SDES) and the time of the next one.

        ``wallclock`` is the Unix time of ``now``, for the SR's NTP timestamp (RFC 3550
        §6.4.1); the next report is scheduled one randomized interval after ``now`` (§6.3.1).
        """
        data = b"".join(
            bytes(packet) for packet in self._compound(now, sender, receiver, wallclock)
        )
        self._next_at = now + self._interval(MIN_INTERVAL_S)
        return data

    def bye(self, sender: RtpSender, receiver: RtpReceiver, wallclock: float, now: float) -> bytes:
        """The leg's last compound: a final report and SDES, then a BYE for its SSRC (RFC 3550
        §6.6: the BYE goes last in its compound). Two members need no BYE reconsideration
        (§6.3.7), so it is sent at once."""
        packets = self._compound(now, sender, receiver, wallclock)
        packets.append(RtcpByePacket(sources=[self._ssrc]))
        return b"".join(bytes(packet) for packet in packets)

    def _compound(
        self, now: float, sender: RtpSender, receiver: RtpReceiver, wallclock: float
    ) -> list[RtcpSrPacket | RtcpRrPacket | RtcpSdesPacket | RtcpByePacket]:
        """SR or RR, then SDES (RFC 3550 §6.1); counts the compound as sent."""
        blocks = self._report_blocks(now, receiver)
        head: RtcpSrPacket | RtcpRrPacket
        sent = sender.packets_sent
        if sent > self._packets_prior:
            info = RtcpSenderInfo(
                ntp_timestamp=ntp_timestamp(wallclock),
                rtp_timestamp=sender.timestamp & _U32,
                packet_count=sent & _U32,
                octet_count=sender.payload_bytes_sent & _U32,
            )
            head = RtcpSrPacket(ssrc=self._ssrc, sender_info=info, reports=blocks)
        else:
            head = RtcpRrPacket(ssrc=self._ssrc, reports=blocks)
        self._packets_prior = sent
        self.reports_sent += 1
        sdes = RtcpSdesPacket(chunks=[RtcpSourceInfo(ssrc=self._ssrc, items=list(self._items))])
        return [head, sdes]

    def _report_blocks(self, now: float, receiver: RtpReceiver) -> list[RtcpReceiverInfo]:
        """The report block about the browser's stream (RFC 3550 §6.4.1, appendix A.3), or
        none before its first packet; a new SSRC starts the interval counters again."""
        remote = receiver.ssrc
        if remote is None:
            return []
        if remote != self._remote_ssrc:
            self._remote_ssrc = remote
            self._expected_prior = 0
            self._received_prior = 0
        stats = receiver.stats
        expected, received = stats.expected, stats.received
        expected_interval = expected - self._expected_prior
        lost_interval = expected_interval - (received - self._received_prior)
        self._expected_prior, self._received_prior = expected, received
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = min(255, (lost_interval << 8) // expected_interval)
        lsr = dlsr = 0
        last = self._last_sr.get(remote)
        if last is not None:
            lsr, arrived = last
            dlsr = min(_U32, int(max(0.0, now - arrived) * 65536))
        block = RtcpReceiverInfo(
            ssrc=remote,
            fraction_lost=fraction,
            packets_lost=max(_LOST_MIN, min(_LOST_MAX, stats.lost)),
            highest_sequence=stats.max_ext_seq & _U32,
            jitter=stats.jitter_units & _U32,
            lsr=lsr,
            dlsr=dlsr,
        )
        return [block]

    def received(self, plain: bytes, now: float) -> None:
        """Takes one unprotected incoming compound: each SR's NTP time and arrival ``now`` are
        kept per sender SSRC for the LSR/DLSR of the next report block (RFC 3550 §6.4.1).

        A compound that does not parse (RFC 3550 appendix A.2) is counted in ``invalid`` and
        ignored; packet types not used here (RR, SDES, BYE, feedback) are read and let be."""
        if not plain:
            self.invalid += 1
            return
        try:
            packets = RtcpPacket.parse(plain)
        except _PARSE_ERRORS:
            self.invalid += 1
            return
        self.packets_received += 1
        for packet in packets:
            if isinstance(packet, RtcpSrPacket):
                self._remember_sr(packet, now)

    def _remember_sr(self, packet: RtcpSrPacket, now: float) -> None:
        """Keeps the newest SR of each sender, dropping the least recently heard beyond
        :data:`_MAX_REMEMBERED_SENDERS`."""
        table = self._last_sr
        table.pop(packet.ssrc, None)
        table[packet.ssrc] = (_middle32(packet.sender_info.ntp_timestamp), now)
        if len(table) > _MAX_REMEMBERED_SENDERS:
            del table[next(iter(table))]
