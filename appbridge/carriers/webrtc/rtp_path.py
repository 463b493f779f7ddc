"""A browser call's RTP on the project's own RTP code; aiortc keeps ICE and DTLS-SRTP.

aiortc's sender and receiver run every packet through several steps in Python (its RTP parser
and serializer, jitter buffer, NACK generator, a decoder thread, a task per decoded frame),
which made a browser call cost about four SIP calls in CPU (docs/PERFORMANCE.md, "Browser calls
(WebRTC)"; docs/ARCHITECTURE.md). So once the peer connection is up, the leg carries the audio
itself, with the code a SIP leg uses (``carriers/sip/rtp.py``, ``jitter.py``, ``srtp.py``), and
aiortc keeps what it does well: ICE (RFC 8445, through aioice), the DTLS handshake that keys
SRTP (RFC 5764 §4.2), the data channel, and the SDP.

How: aiortc starts a transceiver's media by calling ``RTCRtpSender.send`` and
``RTCRtpReceiver.receive`` once DTLS is connected. :func:`take_over` replaces those two methods on
the call's own transceiver, so aiortc's RTP loops never start, and hands the leg a
:class:`MediaPath` instead: the negotiated parameters, the SRTP sessions the handshake keyed and
an :class:`IceRoute`. The route sees every datagram of the ICE sockets before aioice does;
those whose first byte is 128-191 are RTP or RTCP (RFC 7983 §7) and go to the leg, everything
else (STUN for consent, RFC 7675; DTLS for the data channel) goes on to aioice as before.
Packets go out on the nominated candidate pair. SRTP authenticates every packet the leg takes,
so a datagram from a stranger is dropped there and counted.

This module and ``host_addresses.py`` are the only places that touch aiortc's and aioice's
internals (``RTCDtlsTransport._rx_srtp``/``_tx_srtp``, ``Connection._protocols``/``_nominated``),
which is why pyproject.toml pins their minor versions.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiortc import RTCRtpTransceiver
from aiortc.rtcrtpparameters import RTCRtpParameters

from appbridge.carriers.sip.srtp import SrtpStreams

log = logging.getLogger(__name__)

#: The header extension that ties RTP to its m= section in a bundle (RFC 8843 §15.2).
MID_URI: Final = "urn:ietf:params:rtp-hdrext:sdes:mid"
#: RFC 8285 §4.2: the profile of one-byte header extension elements.
ONE_BYTE_PROFILE: Final = 0xBEDE
_ICE_RTP_COMPONENT: Final = 1  # RTP and RTCP share component 1 (RFC 5761, rtcp-mux)


def mid_extension(extension_id: int, mid: str) -> bytes:
    """The MID as an RTP header extension, its 4-byte header included (RFC 8285 §4.2: one-byte
    elements; ids 1-14, 1-16 bytes of data; zero padding to a 32-bit word)."""
    value = mid.encode()
    if not 1 <= extension_id <= 14 or not 1 <= len(value) <= 16:
        raise ValueError("a one-byte header extension has id 1-14 and 1-16 bytes")
    element = bytes(((extension_id << 4) | (len(value) - 1),)) + value
    element += bytes(-len(element) % 4)
    return ONE_BYTE_PROFILE.to_bytes(2, "big") + (len(element) // 4).to_bytes(2, "big") + element


class IceRoute:
    """aioice's side of the media (module doc): RTP and RTCP in before aioice, out on the
    nominated pair."""

    def __init__(self, connection: Any, deliver: Callable[[bytes], None]) -> None:
        self._connection = connection
        self._protocols: list[Any] = []
        for protocol in connection._protocols:
            protocol.datagram_received = _intercepting(protocol.datagram_received, deliver)
            self._protocols.append(protocol)

    def send(self, data: bytes) -> bool:
        """One datagram to the browser; False when there is no pair to send on (yet, or any
        more)."""
        pair = self._connection._nominated.get(_ICE_RTP_COMPONENT)
        if pair is None:
            return False
        transport = pair.protocol.transport
        if transport is None or transport.is_closing():
            return False
        transport.sendto(data, pair.remote_addr)
        return True

    def release(self) -> None:
        """Give the sockets back to aioice alone (the call is over)."""
        for protocol in self._protocols:
            protocol.__dict__.pop("datagram_received", None)
        self._protocols.clear()


def _intercepting(
    original: Callable[[bytes, Any], None], deliver: Callable[[bytes], None]
) -> Callable[[bytes, Any], None]:
    def datagram_received(data: bytes, addr: Any) -> None:
        if data and 127 < data[0] < 192:  # RTP or RTCP (RFC 7983 §7)
            deliver(data)
        else:
            original(data, addr)

    return datagram_received


@dataclass(eq=False)
class MediaPath:
    """What the leg needs to carry a browser call's RTP (module doc)."""

    codec: str  # aiortc's name: "opus", "PCMU", "PCMA"
    payload_type: int
    ssrc: int
    cname: str
    mid: str | None
    #: The MID header extension every packet carries, or b"" when it was not negotiated.
    extension: bytes
    #: False when the browser only sends (our answer is recvonly): nothing goes out.
    sending: bool
    srtp: SrtpStreams
    route: IceRoute | None = None


def take_over(
    transceiver: RTCRtpTransceiver,
    connected: Callable[[MediaPath], Callable[[bytes], None]],
    *,
    label: str,
) -> None:
    """From when DTLS is connected, ``transceiver``'s RTP is the leg's (module doc).
    ``connected`` is given the path once and returns the leg's datagram handler."""
    path: list[MediaPath] = []

    def start(parameters: RTCRtpParameters, *, sending: bool) -> None:
        if path:
            path[0].sending = path[0].sending or sending
            return
        dtls = transceiver.receiver.transport
        media = _path(parameters, dtls, sending=sending, label=label)
        path.append(media)
        deliver = connected(media)
        media.route = IceRoute(dtls.transport._connection, deliver)

    async def send(parameters: RTCRtpParameters) -> None:
        start(parameters, sending=True)

    async def receive(parameters: RTCRtpParameters) -> None:
        start(parameters, sending=False)

    # Instance attributes shadow the methods aiortc's peer connection calls.
    transceiver.sender.send = send  # type: ignore[method-assign]
    transceiver.receiver.receive = receive  # type: ignore[method-assign]


def give_back(transceiver: RTCRtpTransceiver) -> None:
    """The call is over: the transceiver has aiortc's own methods again. The closures of
    :func:`take_over` hold the leg, and aiortc's objects refer to one another in cycles, which
    would keep the leg alive until the collector's next deep pass (media/gc_pacer.py)."""
    transceiver.sender.__dict__.pop("send", None)
    transceiver.receiver.__dict__.pop("receive", None)


def _path(parameters: RTCRtpParameters, dtls: Any, *, sending: bool, label: str) -> MediaPath:
    codec = parameters.codecs[0]
    assert codec.payloadType is not None
    mid = parameters.muxId or None
    extension = b""
    for ext in parameters.headerExtensions:
        if ext.uri == MID_URI and mid is not None:
            extension = mid_extension(ext.id, mid)
    rtcp = parameters.rtcp
    ssrc = rtcp.ssrc if sending and rtcp.ssrc is not None else secrets.randbits(32)
    cname = rtcp.cname if sending and rtcp.cname else uuid.uuid4().hex
    return MediaPath(
        codec=codec.mimeType.split("/")[-1],
        payload_type=codec.payloadType,
        ssrc=ssrc,
        cname=cname,
        mid=mid,
        extension=extension,
        sending=sending,
        srtp=SrtpStreams.over(dtls._rx_srtp, dtls._tx_srtp, label=label),
    )
