"""RTP packets, a sender that keeps one stream continuous, and a receiver that latches.

Theory of operation
-------------------
`RtpPacket.parse` / `RtpPacket.serialize` implement the fixed header of RFC 3550 section 5.1 with
its CSRC list, the header extension of section 5.3.1 and padding, and apply the validity checks
of appendix A.1 that need no state (version 2, lengths that fit, a non-zero padding count that
fits, no RTCP packet types 200..204 in the payload-type byte, RFC 5761 section 4). Anything else
raises `RtpError`, a `ValueError`, and nothing but it.

`RtpSender` owns the outgoing stream of one call leg: ONE SSRC for the whole call, sequence
numbers that go up by one per packet and timestamps that go up by the media duration (RFC 3550
section 5.1), whatever the output queue plays: prompts, app audio, silence, RFC 4733 events.
Silence that is not sent (`skip`) still advances the timestamp, and the next audio packet gets
the marker bit, as RFC 3551 section 4.1 asks for the first packet of a talkspurt.

`RtpReceiver` is the incoming side: it checks the source (symmetric RTP, RFC 4961 and the
latching practice of RFC 7362 section 4), tracks the stream statistics of RFC 3550 appendix A.1
and A.3 (extended highest sequence number, expected, lost, duplicates, reordered) and the
interarrival jitter of section 6.4.1 / appendix A.8.

Latching rules (tested in tests/unit/sip/test_rtp.py):

1. Until a packet is accepted, RTP goes to the address and port of the remote SDP.
2. The first valid RTP packet (parses, carries a negotiated payload type) latches the receiver
   to its source address; from then on RTP is sent there (NAT traversal without STUN).
3. While latched, packets from any other address are dropped and counted (`foreign_packets`),
   so a stray or forged stream cannot take the call over.
4. A new source is accepted (re-latch) only when the latched one has sent nothing valid for
   `relatch_silence_s` (default 1 s): the peer's NAT binding or media server changed.
5. `reset_latch(address)` forgets the latch (a re-INVITE moved the media), and the next valid
   packet latches again.

An SSRC change from the latched source (a peer's media server switched streams, RFC 3550 section
8.2) restarts the sequence statistics and is reported as `source_changed` so that the caller
resets its jitter buffer and decoder.

Sequence numbers are 16-bit and wrap; `seq_delta` gives the signed distance between two of them
(the serial-number arithmetic of RFC 1982 at 16 bits).
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "InterarrivalJitter",
    "RtpArrival",
    "RtpError",
    "RtpPacket",
    "RtpReceiver",
    "RtpSender",
    "RtpStats",
    "is_rtcp",
    "seq_delta",
]

RTP_VERSION: Final = 2
_HEADER: Final = struct.Struct("!BBHII")
_HEADER_BYTES: Final = 12
_EXT_HEADER: Final = struct.Struct("!HH")
_SEQ_MOD: Final = 1 << 16
_TS_MOD: Final = 1 << 32
_MAX_DROPOUT: Final = 3000  # RFC 3550 appendix A.1
_MAX_MISORDER: Final = 100  # RFC 3550 appendix A.1
_DUP_WINDOW: Final = 128  # extended sequence numbers remembered to tell duplicates from late
_DUP_MASK: Final = _DUP_WINDOW - 1
_NEVER: Final = -(1 << 60)  # below any extended sequence number (they start above -_MAX_MISORDER)


class RtpError(ValueError):
    """The bytes are not a valid RTP packet (RFC 3550 section 5.1, appendix A.1)."""


def seq_delta(a: int, b: int) -> int:
    """Signed distance from sequence number `b` to `a` in -32768..32767 (16-bit wrap)."""
    return ((a - b + 0x8000) & 0xFFFF) - 0x8000


def is_rtcp(data: bytes) -> bool:
    """True when a datagram on a multiplexed port is RTCP: packet types 192..223 in the second
    byte (RFC 5761 section 4), which RTP payload types 64..95 with the marker would collide with.
    """
    return len(data) >= 2 and 192 <= data[1] <= 223


@dataclass(slots=True, init=False)
class RtpPacket:
    """One RTP packet (RFC 3550 section 5.1).

    `extension_profile` is None when the X bit is clear; `extension` holds the extension data
    without its 4-byte header (a multiple of 4 bytes). `padding_bytes` counts the padding added
    after the payload including the final count byte (0 for none).

    ``__init__`` is written out (``init=False``), as in :class:`RtpArrival` and
    :class:`~appbridge.carriers.sip.jitter.JitterFrame`: one is made per packet, and the one
    ``dataclasses`` would generate runs interpreted even when this module is compiled
    (appbridge/compiled.py).
    """

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension_profile: int | None = None
    extension: bytes = b""
    padding_bytes: int = 0

    def __init__(
        self,
        payload_type: int,
        sequence: int,
        timestamp: int,
        ssrc: int,
        payload: bytes = b"",
        marker: bool = False,
        csrc: tuple[int, ...] = (),
        extension_profile: int | None = None,
        extension: bytes = b"",
        padding_bytes: int = 0,
    ) -> None:
        self.payload_type = payload_type
        self.sequence = sequence
        self.timestamp = timestamp
        self.ssrc = ssrc
        self.payload = payload
        self.marker = marker
        self.csrc = csrc
        self.extension_profile = extension_profile
        self.extension = extension
        self.padding_bytes = padding_bytes

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        """Parses one datagram; raises `RtpError` for anything that is not valid RTP."""
        n = len(data)
        if n < _HEADER_BYTES:
            raise RtpError(f"{n} bytes is shorter than the 12-byte RTP header")
        b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        if b0 == 0x80 and not 200 <= b1 <= 204:
            # Version 2 with no padding, extension or CSRC: nearly every packet of a call.
            return cls(b1 & 0x7F, seq, ts, ssrc, bytes(data[_HEADER_BYTES:]), b1 > 0x7F)
        if b0 >> 6 != RTP_VERSION:
            raise RtpError(f"RTP version {b0 >> 6}, expected 2")
        if 200 <= b1 <= 204:
            raise RtpError("RTCP packet type in the RTP payload-type byte (RFC 5761)")
        offset = _HEADER_BYTES
        cc = b0 & 0x0F
        csrc: tuple[int, ...] = ()
        if cc:
            end = offset + 4 * cc
            if end > n:
                raise RtpError(f"CSRC count {cc} runs past the end of the packet")
            csrc = struct.unpack_from(f"!{cc}I", data, offset)
            offset = end
        ext_profile: int | None = None
        ext = b""
        if b0 & 0x10:
            if offset + 4 > n:
                raise RtpError("header extension runs past the end of the packet")
            ext_profile, words = _EXT_HEADER.unpack_from(data, offset)
            start = offset + 4
            offset = start + 4 * words
            if offset > n:
                raise RtpError("header extension length runs past the end of the packet")
            ext = bytes(data[start:offset])
        end = n
        padding = 0
        if b0 & 0x20:
            padding = data[-1]
            if padding == 0 or offset + padding > n:
                raise RtpError(f"invalid padding count {padding}")
            end = n - padding
        return cls(
            b1 & 0x7F,
            seq,
            ts,
            ssrc,
            bytes(data[offset:end]),
            bool(b1 & 0x80),
            csrc,
            ext_profile,
            ext,
            padding,
        )

    def serialize(self) -> bytes:
        """The packet's bytes; raises `RtpError` for fields out of range."""
        if not 0 <= self.payload_type <= 127:
            raise RtpError(f"payload type {self.payload_type} is out of range 0..127")
        if len(self.csrc) > 15:
            raise RtpError("at most 15 CSRC identifiers fit (RFC 3550 section 5.1)")
        if not 0 <= self.padding_bytes <= 255:
            raise RtpError("padding is 0..255 bytes")
        b0 = 0x80 | len(self.csrc)
        if self.padding_bytes:
            b0 |= 0x20
        if self.extension_profile is not None:
            b0 |= 0x10
        b1 = self.payload_type | (0x80 if self.marker else 0)
        try:
            head = _HEADER.pack(b0, b1, self.sequence, self.timestamp, self.ssrc)
            parts = [head]
            if self.csrc:
                parts.append(struct.pack(f"!{len(self.csrc)}I", *self.csrc))
            if self.extension_profile is not None:
                if len(self.extension) % 4:
                    raise RtpError("header extension data must be a multiple of 4 bytes")
                parts.append(_EXT_HEADER.pack(self.extension_profile, len(self.extension) // 4))
                parts.append(self.extension)
        except struct.error as exc:
            raise RtpError(str(exc)) from None
        parts.append(self.payload)
        if self.padding_bytes:
            parts.append(bytes(self.padding_bytes - 1) + bytes((self.padding_bytes,)))
        return b"".join(parts)


class InterarrivalJitter:
    """The interarrival jitter estimate of RFC 3550 section 6.4.1 (code in appendix A.8).

    J += (|D| - J) / 16, where D is the change in relative transit time between consecutive
    packets, in timestamp units. `jitter_units` is what an RTCP report carries; `jitter_s` is
    the same in seconds for the jitter buffer's target depth.
    """

    __slots__ = ("_jitter", "_rate_hz", "_transit")

    def __init__(self, clock_rate_hz: int) -> None:
        if clock_rate_hz <= 0:
            raise ValueError("clock rate must be positive")
        self._rate_hz = clock_rate_hz
        self._transit: int | None = None
        self._jitter = 0.0

    def update(self, timestamp: int, arrival_s: float) -> None:
        arrival_units = int(arrival_s * self._rate_hz)
        transit = (arrival_units - timestamp) % _TS_MOD
        if self._transit is not None:
            d = ((transit - self._transit + (_TS_MOD >> 1)) % _TS_MOD) - (_TS_MOD >> 1)
            self._jitter += (abs(d) - self._jitter) / 16.0
        self._transit = transit

    def reset(self) -> None:
        self._transit = None
        self._jitter = 0.0

    @property
    def jitter_units(self) -> int:
        return int(self._jitter)

    @property
    def jitter_s(self) -> float:
        return self._jitter / self._rate_hz


class RtpSender:
    """The outgoing RTP stream of one call leg: one SSRC, continuous sequence and timestamps.

    RFC 3550 section 5.1 asks for random initial sequence number and timestamp, and section 8.1
    for a random SSRC; tests pass them explicitly. Every method returns wire bytes ready to
    send. Call `audio()` for each frame sent and `skip()` for each frame of silence that is not
    sent; `event()` sends an RFC 4733 packet with the event's own timestamp (RFC 4733 section
    2.3.1) on the same sequence space. `extension` is a header extension (RFC 3550 section
    5.3.1, with its 4-byte header) that every packet carries, such as a browser leg's MID
    (RFC 8843 section 15, RFC 8285); it is serialized once, by the caller.
    """

    __slots__ = (
        "_after_gap",
        "_b0",
        "_event_pt",
        "_extension",
        "_frame_units",
        "_payload_type",
        "_seq",
        "_ssrc",
        "_ts",
        "packets_sent",
        "payload_bytes_sent",
    )

    def __init__(
        self,
        *,
        payload_type: int,
        frame_units: int = 160,
        event_payload_type: int | None = None,
        ssrc: int | None = None,
        initial_sequence: int | None = None,
        initial_timestamp: int | None = None,
        extension: bytes = b"",
    ) -> None:
        if not 0 <= payload_type <= 127:
            raise ValueError("payload type is 0..127")
        if len(extension) % 4 or 0 < len(extension) < 4:
            raise ValueError("a header extension is whole 32-bit words, its header included")
        self._extension = extension
        self._b0 = 0x90 if extension else 0x80
        self._payload_type = payload_type
        self._event_pt = event_payload_type
        self._frame_units = frame_units
        self._ssrc = secrets.randbits(32) if ssrc is None else ssrc & 0xFFFFFFFF
        self._seq = secrets.randbits(16) if initial_sequence is None else initial_sequence & 0xFFFF
        self._ts = secrets.randbits(32) if initial_timestamp is None else initial_timestamp
        self._ts &= 0xFFFFFFFF
        self._after_gap = True  # the first packet of a stream starts a talkspurt
        self.packets_sent = 0
        self.payload_bytes_sent = 0

    @property
    def ssrc(self) -> int:
        return self._ssrc

    @property
    def next_sequence(self) -> int:
        return self._seq

    @property
    def timestamp(self) -> int:
        """The RTP timestamp the next audio frame will carry (the media clock of the stream)."""
        return self._ts

    @property
    def payload_type(self) -> int:
        return self._payload_type

    def set_payload_type(self, payload_type: int, frame_units: int | None = None) -> None:
        """Switches codec after a re-INVITE; SSRC, sequence and timestamp carry on."""
        self._payload_type = payload_type
        if frame_units is not None:
            self._frame_units = frame_units

    def set_event_payload_type(self, payload_type: int | None) -> None:
        self._event_pt = payload_type

    def _packet(self, pt: int, marker: bool, ts: int, payload: bytes) -> bytes:
        head = _HEADER.pack(self._b0, pt | 0x80 if marker else pt, self._seq, ts, self._ssrc)
        self._seq = (self._seq + 1) & 0xFFFF
        self.packets_sent += 1
        self.payload_bytes_sent += len(payload)
        return head + self._extension + payload

    def audio(
        self, payload: bytes, *, duration_units: int | None = None, talkspurt_start: bool = False
    ) -> bytes:
        """One audio packet at the current timestamp, which then advances by the frame.

        The marker is set on the first packet, after `skip()`, and when the caller says a
        talkspurt starts (RFC 3551 section 4.1).
        """
        marker = talkspurt_start or self._after_gap
        self._after_gap = False
        data = self._packet(self._payload_type, marker, self._ts, payload)
        units = self._frame_units if duration_units is None else duration_units
        self._ts = (self._ts + units) & 0xFFFFFFFF
        return data

    def skip(self, duration_units: int | None = None) -> None:
        """Advances the timestamp over silence that is not sent (RFC 3550 section 5.1: the
        timestamp runs with the sampling clock, whether or not packets are sent)."""
        units = self._frame_units if duration_units is None else duration_units
        self._ts = (self._ts + units) & 0xFFFFFFFF
        self._after_gap = True

    def event(self, payload: bytes, *, timestamp: int, marker: bool) -> bytes:
        """One RFC 4733 telephone-event packet; the caller keeps the audio clock going with
        `skip()` while the event plays (the event has its own start timestamp)."""
        if self._event_pt is None:
            raise RuntimeError("no telephone-event payload type was negotiated")
        self._after_gap = True  # audio after an event starts a new talkspurt
        return self._packet(self._event_pt, marker, timestamp & 0xFFFFFFFF, payload)


@dataclass(slots=True)
class RtpStats:
    """Receive statistics of RFC 3550 appendix A.3, plus what the gateway counts on top."""

    received: int = 0  # valid packets of the current source, duplicates excluded
    duplicates: int = 0
    reordered: int = 0  # arrived after a higher sequence number (not duplicates)
    invalid: int = 0  # not RTP at all
    rtcp: int = 0  # RTCP multiplexed on the RTP port (RFC 5761), ignored
    unknown_payload_type: int = 0
    foreign_packets: int = 0  # from an address other than the latched one
    relatches: int = 0
    source_changes: int = 0  # SSRC changes
    jitter_units: int = 0
    base_ext_seq: int = 0
    max_ext_seq: int = -1

    @property
    def expected(self) -> int:
        return self.max_ext_seq - self.base_ext_seq + 1 if self.max_ext_seq >= 0 else 0

    @property
    def lost(self) -> int:
        """Expected minus received, clamped at 0 (duplicates never hide losses: they are not
        counted in `received`)."""
        return max(0, self.expected - self.received)


@dataclass(slots=True, init=False)
class RtpArrival:
    """A packet accepted by `RtpReceiver`; `source_changed` asks the caller to reset its
    jitter buffer and decoder (new SSRC or re-latched source). Not frozen, as
    :class:`~appbridge.carriers.sip.jitter.JitterFrame`: one is made per packet."""

    packet: RtpPacket
    ext_sequence: int
    source_changed: bool

    def __init__(self, packet: RtpPacket, ext_sequence: int, source_changed: bool) -> None:
        self.packet = packet
        self.ext_sequence = ext_sequence
        self.source_changed = source_changed


Address = tuple[str, int]


class _SeqState:
    """The highest extended sequence number so far, and the accepted ones near it: ``seen``
    holds, at ``ext & _DUP_MASK``, the last accepted number with those low bits. Every number
    accepted within :data:`_DUP_WINDOW` of the highest is still there (a newer one with the same
    low bits would be a window or more above it), so a packet within that reach is a duplicate
    exactly when its slot holds its own number: a list index and a compare per packet, where a
    deque and a set cost several calls through the interpreter."""

    __slots__ = ("max_ext", "seen")

    def __init__(self) -> None:
        self.max_ext = -1
        self.seen: list[int] = [_NEVER] * _DUP_WINDOW


class RtpReceiver:
    """Validates, latches and counts incoming RTP of one call leg (rules in the module doc)."""

    def __init__(
        self,
        *,
        payload_types: set[int] | frozenset[int],
        clock_rate_hz: int = 8000,
        remote_address: Address | None = None,
        relatch_silence_s: float = 1.0,
    ) -> None:
        self._payload_types = frozenset(payload_types)
        self._sdp_address = remote_address
        self._latched: Address | None = None
        self._relatch_silence_s = relatch_silence_s
        self._last_valid_s = float("-inf")
        self._ssrc: int | None = None
        self._seq = _SeqState()
        self._jitter = InterarrivalJitter(clock_rate_hz)
        self.stats = RtpStats()

    @property
    def latched_address(self) -> Address | None:
        return self._latched

    @property
    def send_address(self) -> Address | None:
        """Where RTP goes: the latched source once there is one, else the SDP address."""
        return self._latched if self._latched is not None else self._sdp_address

    @property
    def ssrc(self) -> int | None:
        return self._ssrc

    def set_payload_types(self, payload_types: set[int] | frozenset[int]) -> None:
        self._payload_types = frozenset(payload_types)

    def reset_latch(self, remote_address: Address | None) -> None:
        """A new SDP moved the peer's media: send there and latch again on the next packet."""
        self._sdp_address = remote_address
        self._latched = None

    def receive(self, data: bytes, source: Address, now: float) -> RtpArrival | None:
        """Returns the accepted packet, or None when it was dropped (and counted)."""
        if len(data) >= 2 and 192 <= data[1] <= 223:  # is_rtcp, inlined (once per packet)
            self.stats.rtcp += 1
            return None
        try:
            packet = RtpPacket.parse(data)
        except RtpError:
            self.stats.invalid += 1
            return None
        if packet.payload_type not in self._payload_types:
            self.stats.unknown_payload_type += 1
            return None
        changed = False
        if self._latched is None:
            self._latched = source
        elif source != self._latched:
            if now - self._last_valid_s < self._relatch_silence_s:
                self.stats.foreign_packets += 1
                return None
            self._latched = source
            self.stats.relatches += 1
            changed = True
        self._last_valid_s = now
        if packet.ssrc != self._ssrc:
            if self._ssrc is not None:
                self.stats.source_changes += 1
                changed = True
            self._restart(packet.ssrc, packet.sequence)
        elif changed:
            self._restart(packet.ssrc, packet.sequence)
        ext = self._account(packet.sequence)
        if ext is None:
            return None
        self._jitter.update(packet.timestamp, now)
        self.stats.jitter_units = self._jitter.jitter_units
        return RtpArrival(packet, ext, changed)

    def _restart(self, ssrc: int, seq: int) -> None:
        """Starts the statistics of a new source (RFC 3550 appendix A.1 init_seq)."""
        self._ssrc = ssrc
        self._seq = _SeqState()
        self._jitter.reset()
        stats = self.stats
        stats.received = 0
        stats.base_ext_seq = seq
        stats.max_ext_seq = -1

    def _account(self, seq: int) -> int | None:
        """Extends `seq` to 32+ bits and counts it; None for a duplicate or a wild jump that
        is treated as a restart of the sequence (RFC 3550 appendix A.1 bad_seq)."""
        state = self._seq
        stats = self.stats
        if state.max_ext < 0:
            ext = seq
            state.max_ext = ext
        else:
            delta = seq_delta(seq, state.max_ext & 0xFFFF)
            ext = state.max_ext + delta
            if delta > 0:
                if delta > _MAX_DROPOUT:
                    # A jump this large is a restarted stream, not loss: rebase the counters.
                    stats.base_ext_seq = seq
                    stats.received = 0
                    state.seen = [_NEVER] * _DUP_WINDOW
                    ext = seq
                state.max_ext = ext
            elif state.seen[ext & _DUP_MASK] == ext:
                stats.duplicates += 1
                return None
            elif -delta > _MAX_MISORDER:
                # Too old to be reordering (RFC 3550 appendix A.1): a stale packet, dropped.
                stats.reordered += 1
                return None
            else:
                stats.reordered += 1
        state.seen[ext & _DUP_MASK] = ext
        stats.received += 1
        stats.max_ext_seq = state.max_ext
        if ext < stats.base_ext_seq:
            stats.base_ext_seq = ext
        return ext
