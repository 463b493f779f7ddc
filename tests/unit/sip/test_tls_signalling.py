"""SIP over TLS: the names the gateway gives itself (Via, Contact, sips:), what it reads from peers
(Record-Route, Via ``alias``, ``received``/``rport``), how a TLS peer is told apart, and the
TLS listener and client on real loopback sockets (docs/sip.md, "TLS and SRTP trunks";
RFC 3261 §26, RFC 5630, RFC 5923, RFC 3581)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from appbridge.carriers.sip.contact import contact_for, transport_params, via_for
from appbridge.carriers.sip.dialog import Dialog
from appbridge.carriers.sip.headers import NameAddr, SipUri, Via
from appbridge.carriers.sip.message import Request, Response, apply_received, parse_message
from appbridge.carriers.sip.tls import describe_tls_error
from appbridge.carriers.sip.transaction import TransactionLayer
from appbridge.carriers.sip.transport import Peer, SipTransport, is_stream, via_transport
from appbridge.clock import VirtualClock
from appbridge.config.model import TlsFiles
from tests.tls_support import make_ca

INVITE_TLS = (
    b"INVITE sips:+15550002222@gw.example:5061 SIP/2.0\r\n"
    b"Via: SIP/2.0/TLS 198.51.100.7:5061;branch=z9hG4bKtls1;rport;alias\r\n"
    b"Max-Forwards: 70\r\n"
    b"From: <sips:+15551230001@trunk.example>;tag=ann1\r\n"
    b"To: <sips:+15550002222@gw.example>\r\n"
    b"Call-ID: tls-1@198.51.100.7\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"Contact: <sips:ann@198.51.100.7:5061>\r\n"
    b"Record-Route: <sip:edge.example:5061;transport=tls;lr>\r\n"
    b"Content-Length: 0\r\n\r\n"
)


def _invite() -> Request:
    message = parse_message(INVITE_TLS, datagram=False)
    assert isinstance(message, Request)
    return message


# -- names we build ------------------------------------------------------------------------


def test_contact_per_transport() -> None:
    assert str(contact_for("192.0.2.10", "udp", 5060)) == "<sip:appbridge@192.0.2.10:5060>"
    assert str(contact_for("192.0.2.10", "tcp", 5060)) == (
        "<sip:appbridge@192.0.2.10:5060;transport=tcp>"
    )
    assert str(contact_for("192.0.2.10", "tls", 5061)) == (
        "<sip:appbridge@192.0.2.10:5061;transport=tls>"
    )
    assert transport_params("udp") == ()


def test_the_answer_to_a_sips_request_over_tls_has_a_sips_contact() -> None:
    request = _invite()
    assert (
        str(contact_for("192.0.2.10", "tls", 5061, request)) == "<sips:appbridge@192.0.2.10:5061>"
    )
    # Not over TLS, a sips: request gets no sips: Contact (it could not be honoured).
    assert str(contact_for("192.0.2.10", "tcp", 5060, request)).startswith("<sip:")


def test_via_over_tls_asks_for_rport_and_offers_the_connection() -> None:
    via = Via.parse(via_for("tls", "192.0.2.10", 5061, branch="z9hG4bKx"))
    assert (via.transport, via.host, via.port, via.branch) == (
        "TLS",
        "192.0.2.10",
        5061,
        "z9hG4bKx",
    )
    assert via.rport == "" and via.has_param("alias")
    tcp = Via.parse(via_for("tcp", "192.0.2.10", 5060))
    assert tcp.transport == "TCP" and not tcp.has_param("alias")
    assert not Via.parse(via_for("udp", "192.0.2.10", 5060)).has_param("alias")


# -- names we read -------------------------------------------------------------------------


def test_sips_uris_and_tls_record_routes_parse() -> None:
    request = _invite()
    assert request.uri.scheme == "sips" and request.uri.is_sip and request.uri.port == 5061
    assert str(request.uri) == "sips:+15550002222@gw.example:5061"
    route = request.record_routes[0].uri
    assert route.param("transport") == "tls" and route.has_param("lr") and route.port == 5061
    via = request.top_via
    assert via.transport == "TLS" and via.has_param("alias")


def test_a_dialog_over_tls_keeps_tls_and_its_route() -> None:
    request = _invite()
    contact = contact_for("192.0.2.10", "tls", 5061, request)
    dialog = Dialog.from_uas(request, "gw1", contact, transport=via_transport(("tls", 3)))
    assert dialog.secure and dialog.transport == "TLS"
    assert dialog.next_hop() == SipUri.parse("sip:edge.example:5061;transport=tls;lr")
    bye = dialog.create_request("BYE")
    assert bye.top_via.transport == "TLS" and bye.top_via.sent_by == "192.0.2.10:5061"
    assert bye.routes[0].uri.param("transport") == "tls"
    assert bye.uri.scheme == "sips"


def test_received_and_rport_are_stamped_on_a_tls_via() -> None:
    request = _invite()
    apply_received(request, "203.0.113.9", 40123)
    via = request.top_via
    assert via.received == "203.0.113.9" and via.rport == "40123" and via.has_param("alias")


def test_a_tls_peer_is_a_stream() -> None:
    assert is_stream(("tls", 1)) and is_stream(("tcp", 1)) and not is_stream(("udp", "h", 1))
    assert [via_transport(p) for p in (("udp", "h", 1), ("tcp", 1), ("tls", 1))] == [
        "UDP",
        "TCP",
        "TLS",
    ]


def test_describe_tls_error() -> None:
    exc = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify")
    exc.verify_message = "Hostname mismatch, certificate is not valid for 'x'."
    assert describe_tls_error(exc) == (
        "certificate verify failed: hostname mismatch, certificate is not valid for 'x'"
    )
    plain = ssl.SSLError(1, "wrong version")
    plain.reason = "WRONG_VERSION_NUMBER"
    assert describe_tls_error(plain) == "wrong version number"
    assert describe_tls_error(TimeoutError()) == "no TLS handshake in time"


# -- the listener and the client on loopback ---------------------------------------------------


class _User:
    def __init__(self) -> None:
        self.messages: list[tuple[Request | Response, Peer]] = []
        self.arrived = asyncio.Event()

    def on_message(self, message: Request | Response, peer: Peer, now: float) -> None:
        self.messages.append((message, peer))
        self.arrived.set()

    def on_timeout(self, request: Request, now: float) -> None:
        pass

    def next_deadline(self) -> float | None:
        return None

    def on_timer(self, now: float) -> None:
        pass


OPTIONS = (
    "OPTIONS sip:gw@127.0.0.1 SIP/2.0\r\n"
    "Via: SIP/2.0/TLS 127.0.0.1:5999;branch=z9hG4bK-{n};rport\r\n"
    "From: <sip:probe@127.0.0.1>;tag=p1\r\nTo: <sip:gw@127.0.0.1>\r\n"
    "Call-ID: unit-{n}@127.0.0.1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
    "Content-Length: 0\r\n\r\n"
)


@pytest.mark.timeout(30)
async def test_tls_listener_and_client_over_loopback(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    leaf = ca.leaf("gw", dns=("localhost",), ips=("127.0.0.1",))
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(ca.cert_file))
    transport = SipTransport(
        ("tls:127.0.0.1:0",), VirtualClock(start=0.0), TransactionLayer(), files
    )
    user = _User()
    transport.user = user
    await transport.start()
    try:
        port = transport.tls_addresses[0][1]
        assert transport.local_port("tls") == port and transport.local_host == "127.0.0.1"
        # Our own client: the certificate is checked against ca_file and the name localhost.
        peer = await transport.connect_tls("127.0.0.1", port, "localhost")
        assert peer[0] == "tls" and transport.tcp_sent_by_port(peer) == port
        assert await transport.connect_tls("127.0.0.1", port, "localhost") == peer  # reused
        transport.send_to(OPTIONS.format(n=1).encode(), peer)
        await asyncio.wait_for(user.arrived.wait(), 5)
        message, inbound_peer = user.messages[0]
        assert isinstance(message, Request) and message.method == "OPTIONS"
        assert inbound_peer[0] == "tls" and inbound_peer != peer  # the listener's side
        assert message.top_via.received == "127.0.0.1" and message.top_via.rport not in ("", None)
        # A name the certificate does not carry is refused by OpenSSL.
        with pytest.raises(ssl.SSLCertVerificationError):
            await transport.connect_tls("127.0.0.1", port, "other.example")
    finally:
        await transport.stop()


async def test_a_tls_listener_without_certificates_cannot_open() -> None:
    from appbridge.net.listen import ListenError

    transport = SipTransport(("tls:127.0.0.1:0",), VirtualClock(start=0.0), TransactionLayer())
    with pytest.raises(ListenError):
        await transport.start()
    await transport.stop()


def test_name_addr_of_a_sips_contact_round_trips() -> None:
    addr = NameAddr.parse("<sips:ann@198.51.100.7:5061>")
    assert addr.uri.scheme == "sips" and str(addr) == "<sips:ann@198.51.100.7:5061>"


@pytest.mark.timeout(30)
async def test_an_inbound_tcp_alias_is_reused_for_our_requests() -> None:
    """RFC 5923 §5 on TCP: a client's ``alias`` makes its connection the way to its sent-by
    address; without ``alias`` the gateway would have to connect there itself."""
    transport = SipTransport(("tcp:127.0.0.1:0",), VirtualClock(start=0.0), TransactionLayer())
    user = _User()
    transport.user = user
    await transport.start()
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    try:
        port = transport.tcp_addresses[0][1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        options = OPTIONS.format(n=2).replace("TLS 127.0.0.1:5999", f"TCP 127.0.0.1:{dead_port}")
        writer.write(options.replace(";rport", ";rport;alias").encode())
        await asyncio.wait_for(user.arrived.wait(), 5)
        inbound_peer = user.messages[0][1]
        assert inbound_peer[0] == "tcp"
        assert await transport.connect_tcp("127.0.0.1", dead_port) == inbound_peer
        writer.close()
        # Once that connection is gone, so is the alias: a real connect is tried (and refused).
        for _ in range(100):
            if transport._outbound == {}:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(OSError):
            await transport.connect_tcp("127.0.0.1", dead_port)
    finally:
        await transport.stop()
