"""The registration shell (carriers/sip/register_client.py) over a recording transport and a
virtual clock: what it sends, which trunk an INVITE belongs to, and what ``GET /v1/trunks``
shows (docs/sip.md, "Registering with a trunk")."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from appbridge.carriers.sip.message import Request, make_response, parse_message
from appbridge.carriers.sip.register_client import SipRegistrations, describe_without_service
from appbridge.carriers.sip.transport import Peer
from appbridge.clock import VirtualClock
from appbridge.config import SipConfig, SipTrunk

REGISTRAR = SipTrunk(
    name="carrier",
    host="198.51.100.20",
    username="gw-user",
    password="do-not-show",
    register=True,
    register_expires_s=600,
)
PLAIN = SipTrunk(name="plain", host="198.51.100.30")


class RecordingTransport:
    """The two things the shell asks of ``SipTransport`` for a UDP trunk."""

    local_host = "192.0.2.5"

    def __init__(self) -> None:
        self.requests: list[tuple[Request, Peer]] = []

    def local_port(self, transport: str) -> int:
        return 5062

    def send_request(self, request: Request, peer: Peer) -> None:
        self.requests.append((request, peer))


def config(public_address: str | None = "203.0.113.7") -> SipConfig:
    return SipConfig(
        listen=("udp:0.0.0.0:5062",),
        rtp_ports=(40000, 40100),
        public_address=public_address,
        trunks=(PLAIN, REGISTRAR),
    )


async def started(
    wait_s: float = 0.05,
) -> tuple[SipRegistrations, RecordingTransport, VirtualClock]:
    clock = VirtualClock()
    transport = RecordingTransport()
    regs = SipRegistrations(
        clock,
        transport,  # type: ignore[arg-type]
        config(),
        rand=lambda: 1.0,
        unregister_wait_s=wait_s,
    )
    await regs.start()
    await asyncio.sleep(0)  # the send task
    return regs, transport, clock


def invite(uri: str, source: str, to: str = "sip:+15550001111@203.0.113.7") -> Request:
    text = (
        f"INVITE {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {source}:5060;branch=z9hG4bKinv1\r\n"
        "From: <sip:+15557654321@example.net>;tag=f1\r\n"
        f"To: <{to}>\r\n"
        "Call-ID: inv-1\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    message = parse_message(text.encode())
    assert isinstance(message, Request)
    return message


async def test_start_sends_the_first_register_to_the_trunk_with_our_public_contact() -> None:
    regs, transport, _ = await started()
    try:
        [(request, peer)] = transport.requests
        assert peer == ("udp", "198.51.100.20", 5060)
        assert str(request.uri) == "sip:198.51.100.20"
        assert re.fullmatch(
            r"sip:gw-user-[0-9a-f]{16}@203\.0\.113\.7:5062", str(request.contacts[0].uri)
        )
        assert request.headers.get("Expires") == "600"
        assert request.top_via.sent_by == "203.0.113.7:5062"
    finally:
        await regs.stop()


async def test_a_200_registers_and_the_api_shows_it_without_the_password() -> None:
    regs, transport, clock = await started()
    try:
        request, peer = transport.requests[0]
        assert regs.on_message(make_response(request, 200), peer, clock.now())
        trunks = regs.describe()
        assert [t["name"] for t in trunks] == ["plain", "carrier"]
        assert trunks[0]["registration"] == {"state": "disabled"}
        registration: dict[str, Any] = trunks[1]["registration"]
        assert registration["state"] == "registered"
        assert registration["contact"] == str(request.contacts[0].uri)
        assert registration["expiresAt"] == "2023-11-14T22:23:20Z"  # wall start + 600 s
        assert "do-not-show" not in repr(trunks)
        assert regs.counts() == {
            "unregistered": 0,
            "registering": 0,
            "registered": 1,
            "failed": 0,
        }
    finally:
        await regs.stop()


async def test_a_failure_shows_last_error_and_next_attempt() -> None:
    regs, transport, clock = await started()
    try:
        request, peer = transport.requests[0]
        regs.on_message(make_response(request, 403), peer, clock.now())
        registration = regs.describe()[1]["registration"]
        assert registration["state"] == "failed"
        assert registration["lastError"] == "403 Forbidden"
        assert registration["nextAttemptAt"] == "2023-11-14T22:13:25Z"  # 5 s later
        assert regs.on_timeout(request, clock.now())  # ours, even late
    finally:
        await regs.stop()


async def test_invites_on_the_registration_belong_to_the_trunk() -> None:
    regs, transport, clock = await started()
    try:
        request, peer = transport.requests[0]
        regs.on_message(make_response(request, 200), peer, clock.now())
        # Request-URI = our Contact, from anywhere: the trunk, called number from To.
        contact = str(request.contacts[0].uri)
        guessed = invite("sip:gw-user@203.0.113.7:5062", "192.0.2.99")  # the bare username
        assert regs.trunk_for_invite(guessed, ("udp", "192.0.2.99", 5060)) is None
        by_contact = invite(contact, "192.0.2.99")
        assert regs.trunk_for_invite(by_contact, ("udp", "192.0.2.99", 5060)) == (
            REGISTRAR,
            True,
        )
        # From the registrar's address, another Request-URI user: the trunk, number as usual.
        from_registrar = invite("sip:+15550001111@203.0.113.7", "198.51.100.20")
        assert regs.trunk_for_invite(from_registrar, ("udp", "198.51.100.20", 5060)) == (
            REGISTRAR,
            False,
        )
        stranger = invite("sip:+15550001111@203.0.113.7", "192.0.2.99")
        assert regs.trunk_for_invite(stranger, ("udp", "192.0.2.99", 5060)) is None
        # Responses that are not ours are left to the call flows.
        foreign = make_response(stranger, 200)
        assert not regs.on_message(foreign, ("udp", "192.0.2.99", 5060), clock.now())
    finally:
        await regs.stop()


async def test_stop_unregisters_and_never_waits_more_than_its_bound() -> None:
    regs, transport, clock = await started(wait_s=2.0)
    request, peer = transport.requests[0]
    regs.on_message(make_response(request, 200), peer, clock.now())
    loop = asyncio.get_running_loop()
    began = loop.time()
    await regs.stop()  # nobody answers the unregister
    assert 1.9 < loop.time() - began < 2.5
    unregister, _ = transport.requests[-1]
    assert unregister.headers.get("Expires") == "0"


def test_trunks_without_a_running_service() -> None:
    trunks = describe_without_service(config())
    assert [t["registration"]["state"] for t in trunks] == ["disabled", "unregistered"]
    assert trunks[1]["register"] is True and trunks[1]["transport"] == "udp"


class RefusingTransport(RecordingTransport):
    """A TCP trunk whose connection is refused, then accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True
        self.connects = 0

    async def connect_tcp(self, host: str, port: int, timeout_s: float = 5.0) -> Peer:
        self.connects += 1
        if self.refuse:
            raise ConnectionRefusedError("connection refused")
        return ("tcp", self.connects)


async def test_a_refused_tcp_connection_fails_and_a_lost_one_re_registers() -> None:
    clock = VirtualClock()
    transport = RefusingTransport()
    trunk = SipTrunk(
        name="tcp",
        host="198.51.100.40",
        transport="tcp",
        username="u",
        password="p",
        register=True,
    )
    cfg = SipConfig(("tcp:0.0.0.0:5062",), (40000, 40100), "203.0.113.7", (trunk,))
    regs = SipRegistrations(
        clock,
        transport,  # type: ignore[arg-type]
        cfg,
        rand=lambda: 1.0,
        unregister_wait_s=0.05,
    )
    try:
        await regs.start()
        await asyncio.sleep(0)
        registration = regs.describe()[0]["registration"]
        assert registration["state"] == "failed"
        assert registration["lastError"] == "transport: connection refused"
        assert re.fullmatch(
            r"sip:u-[0-9a-f]{16}@203\.0\.113\.7:5062;transport=tcp", registration["contact"]
        )
        transport.refuse = False
        core = regs.entries[0].core
        clock.advance(5)
        regs._fire()  # the retry timer
        await asyncio.sleep(0)
        request, peer = transport.requests[-1]
        assert peer == ("tcp", 2) and request.top_via.transport == "TCP"
        regs.on_message(make_response(request, 200), peer, clock.now())
        assert core.state.value == "registered"
        # The keepalive finds a new connection: the flow was lost, register again on it.
        clock.advance(30)
        regs._fire()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        again, again_peer = transport.requests[-1]
        assert again.method == "REGISTER" and again.cseq.seq == request.cseq.seq + 1
        assert again_peer == ("tcp", 4)
    finally:
        await regs.stop()
