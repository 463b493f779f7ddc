"""The hand-over of a browser call's RTP (appbridge/carriers/webrtc/rtp_path.py): the MID
header extension's bytes, and which datagrams of the ICE sockets go to the leg. The whole path
with aiortc and aioice is tests/integration/test_webrtc.py and the Chromium tests."""

from __future__ import annotations

from typing import Any

import pytest

from appbridge.carriers.webrtc.rtp_path import IceRoute, mid_extension


def test_mid_extension_is_one_byte_elements_in_whole_words() -> None:
    """RFC 8285 §4.2: 0xBEDE, the length in words, id and length-1 in one byte, zero padding."""
    assert mid_extension(1, "0") == bytes.fromhex("bede0001") + bytes.fromhex("10300000")
    assert mid_extension(3, "audio") == bytes.fromhex("bede0002") + b"\x34audio\x00\x00"
    for ext_id, mid in ((0, "0"), (15, "0"), (1, ""), (1, "x" * 17)):
        with pytest.raises(ValueError):
            mid_extension(ext_id, mid)


class Protocol:
    """aioice's per-socket protocol as the route sees it."""

    def __init__(self) -> None:
        self.to_aioice: list[bytes] = []
        self.transport = Transport()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.to_aioice.append(data)


class Transport:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append((data, addr))


class Pair:
    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.remote_addr = ("127.0.0.1", 40000)


class Connection:
    def __init__(self) -> None:
        self._protocols = [Protocol(), Protocol()]
        self._nominated: dict[int, Pair] = {}


def test_rtp_and_rtcp_go_to_the_leg_and_the_rest_to_aioice() -> None:
    """RFC 7983 §7: 0-3 STUN, 20-63 DTLS, 128-191 RTP and RTCP."""
    conn = Connection()
    leg: list[bytes] = []
    route = IceRoute(conn, leg.append)
    stun, dtls, rtp, rtcp = b"\x00\x01rest", b"\x16\xfe\xfd", b"\x80\x6frtp", b"\x81\xc8rtcp"
    for protocol in conn._protocols:
        for data in (stun, dtls, rtp, rtcp, b""):
            protocol.datagram_received(data, ("127.0.0.1", 1))
    assert leg == [rtp, rtcp] * 2
    assert all(p.to_aioice == [stun, dtls, b""] for p in conn._protocols)
    route.release()
    conn._protocols[0].datagram_received(rtp, ("127.0.0.1", 1))
    assert conn._protocols[0].to_aioice[-1] == rtp and len(leg) == 4


def test_packets_leave_on_the_nominated_pair_only() -> None:
    conn = Connection()
    route = IceRoute(conn, lambda data: None)
    assert route.send(b"x") is False  # not nominated yet
    conn._nominated[1] = Pair(conn._protocols[1])
    assert route.send(b"y") is True
    assert conn._protocols[1].transport.sent == [(b"y", ("127.0.0.1", 40000))]
    conn._protocols[1].transport.closing = True
    assert route.send(b"z") is False
