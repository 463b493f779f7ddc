"""The transfer party leg (``party.dial_party`` over ``uac.SipUac``) in virtual time.

A fake transport records what the UAC sends; responses are fed in as the trunk would send them;
time moves only through ``VirtualClock`` and ``SipUac.on_timer``. RTP ports are real loopback
sockets (``open_rtp``).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.headers import SipUri
from appbridge.carriers.sip.leg import RtpPortPool, SipLeg
from appbridge.carriers.sip.message import Request, Response, make_response
from appbridge.carriers.sip.offer_answer import SdpNegotiator
from appbridge.carriers.sip.party import SipCallSignalling, dial_party, route_target
from appbridge.carriers.sip.sdp import SessionDescription
from appbridge.carriers.sip.transaction import Timers
from appbridge.carriers.sip.transport import SDP_TYPE, Peer, SipTransport
from appbridge.carriers.sip.uac import SipUac
from appbridge.clock import VirtualClock
from appbridge.config import SipConfig, SipTrunk
from appbridge.media.media_clock import MediaClock

TRUNK = SipTrunk(name="main", host="127.0.0.1", port=5099)
OTHER = SipTrunk(name="other", host="198.51.100.9", port=5060, allow=("198.51.100.0/24",))
CALLEE = "+15550003333"
PEER: Peer = ("udp", "127.0.0.1", 5099)


class FakeLayer:
    timers = Timers()


class FakeTransport:
    """What ``SipUac`` uses of ``SipTransport``; sends are recorded."""

    local_host = "127.0.0.1"

    def __init__(self) -> None:
        self.layer = FakeLayer()
        self.sent: list[tuple[Request, Peer]] = []
        self.responses: list[tuple[Request, int]] = []
        self.connects: list[tuple[str, int]] = []
        self.refuse_tcp = False

    def local_port(self, kind: str) -> int:
        return 5060

    def send_request(self, request: Request, peer: Peer) -> None:
        self.sent.append((request, peer))

    def respond(self, request: Request, peer: Peer, status: int, *args: Any, **kw: Any) -> None:
        self.responses.append((request, status))

    def rearm(self) -> None:
        pass

    async def connect_tcp(self, host: str, port: int, timeout_s: float = 5.0) -> Peer:
        self.connects.append((host, port))
        if self.refuse_tcp:
            raise ConnectionRefusedError("refused")
        return ("tcp", 7)

    def tcp_sent_by_port(self, peer: Peer) -> int:
        return 5062

    def methods(self) -> list[str]:
        return [r.method for r, _ in self.sent]

    def last(self, method: str) -> Request:
        return [r for r, _ in self.sent if r.method == method][-1]


class Events:
    def __init__(self) -> None:
        self.hangups = 0

    def on_carrier_audio(self, payload: bytes) -> None:
        pass

    def on_carrier_dtmf(self, digit: str) -> None:
        pass

    def on_carrier_hangup(self) -> None:
        self.hangups += 1


def make_uac(low: int) -> tuple[SipUac, FakeTransport, VirtualClock]:
    clock = VirtualClock()
    transport = FakeTransport()
    cfg = SipConfig(
        listen=("udp:127.0.0.1:5060",),
        rtp_ports=(low, low + 19),
        public_address=None,
        trunks=(TRUNK, OTHER),
    )
    uac = SipUac(
        clock,
        cast(SipTransport, transport),
        cfg,
        RtpPortPool(low, low + 19),
        after_slice=MediaClock(clock=clock).call_after_slice,
    )
    return uac, transport, clock


async def until(predicate: Any) -> None:
    """Let the loop run until ``predicate`` holds: binding the RTP socket resolves its local
    address in the loop's executor, so this yields to real I/O (bounded), not to a timer."""
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.001 if _ > 100 else 0)
    raise AssertionError("condition never met")


def start(uac: SipUac, transport: FakeTransport, **kw: Any) -> asyncio.Task[SipLeg]:
    args: dict[str, Any] = {"caller_id": "+15550001111", "headers": None, "timeout_s": 30.0}
    args.update(kw)
    return asyncio.create_task(dial_party(uac, TRUNK, CALLEE, label="party", **args))


def respond(uac: SipUac, request: Request, status: int, **kw: Any) -> None:
    uac.on_message(make_response(request, status, to_tag="callee1", **kw), PEER, 0.0)


def answer_sdp(invite: Request) -> bytes:
    callee = SdpNegotiator(local_address="127.0.0.1", rtp_port=40000, public_address=None)
    answer, _ = callee.create_answer(SessionDescription.parse(invite.body))
    return answer.serialize()


def ok(invite: Request) -> Response:
    return make_response(
        invite,
        200,
        to_tag="callee1",
        headers=[("Contact", "<sip:callee@127.0.0.1:5099>")],
        body=answer_sdp(invite),
        content_type=SDP_TYPE,
    )


async def test_invite_carries_target_caller_id_and_only_safe_headers() -> None:
    uac, transport, _ = make_uac(46000)
    headers = {
        "X-Case": "42",
        "Via": "SIP/2.0/UDP evil",
        "Content-Type": "text/plain",
        "X-Split": "a\r\nInjected: yes",
        "Bad Name": "x",
    }
    task = start(uac, transport, headers=headers)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    assert invite.uri.user == CALLEE and invite.uri.host == TRUNK.host
    assert invite.from_.uri.user == "+15550001111"
    assert invite.headers.get("X-Case") == "42"
    assert len(invite.headers.get_all("Via")) == 1
    assert invite.headers.get("Content-Type") == SDP_TYPE
    assert invite.headers.get("X-Split") is None and invite.headers.get("Injected") is None
    assert b"Injected" not in invite.serialize()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_busy_raises_transfer_failed_with_the_status_and_frees_the_port() -> None:
    uac, transport, _ = make_uac(46020)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    respond(uac, invite, 180)
    respond(uac, invite, 486)
    with pytest.raises(TransferError) as info:
        await task
    assert info.value.code == "transfer_failed"
    assert "busy" in str(info.value) and "486" in str(info.value)
    d = uac.dials[invite.call_id]
    assert d.released and d.rtp.transport is not None and d.rtp.transport.is_closing()
    assert "CANCEL" not in transport.methods()


async def test_no_answer_in_virtual_time_cancels_and_fails() -> None:
    uac, transport, clock = make_uac(46040)
    task = start(uac, transport, timeout_s=20.0)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    respond(uac, invite, 180)
    clock.advance(19.9)
    uac.on_timer(clock.now())
    assert not task.done() and "CANCEL" not in transport.methods()
    assert uac.next_deadline() == pytest.approx(clock.now() + 0.1)
    clock.advance(0.1)
    uac.on_timer(clock.now())
    with pytest.raises(TransferError, match="did not answer in time"):
        await task
    cancel = transport.last("CANCEL")
    assert cancel.cseq.seq == invite.cseq.seq and cancel.top_via.branch == invite.top_via.branch
    # The 487 to our CANCEL changes nothing; the entry is forgotten after 64*T1.
    respond(uac, invite, 487)
    clock.advance(32.0)
    uac.on_timer(clock.now())
    assert invite.call_id not in uac.dials


async def test_cancelled_task_cancels_after_the_first_provisional_response() -> None:
    uac, transport, _ = make_uac(46060)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "CANCEL" not in transport.methods()  # RFC 3261 §9.1: not before a 1xx
    d = uac.dials[invite.call_id]
    assert d.released
    respond(uac, invite, 183)
    assert transport.methods().count("CANCEL") == 1


async def test_2xx_crossing_the_cancel_is_acked_and_ended_with_bye() -> None:
    uac, transport, _ = make_uac(46080)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    respond(uac, invite, 180)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.methods() == ["INVITE", "CANCEL"]
    uac.on_message(ok(invite), PEER, 0.0)
    assert transport.methods() == ["INVITE", "CANCEL", "ACK", "BYE"]
    bye = transport.last("BYE")
    assert bye.to.tag == "callee1" and bye.call_id == invite.call_id
    # A retransmitted 2xx is ACKed again, no second BYE.
    uac.on_message(ok(invite), PEER, 0.0)
    assert transport.methods().count("BYE") == 1


async def test_answer_returns_a_live_leg_whose_hangup_sends_bye() -> None:
    uac, transport, _ = make_uac(46100)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    respond(uac, invite, 180)
    uac.on_message(ok(invite), PEER, 0.0)
    leg = await task
    assert isinstance(leg, SipLeg) and leg.signalling is None
    assert leg.receiver.send_address == ("127.0.0.1", 40000)
    assert transport.methods() == ["INVITE", "ACK"]
    d = uac.dials[invite.call_id]
    assert not d.released  # the leg's media stays until it ends
    await leg.hangup()
    await leg.hangup()
    assert transport.methods() == ["INVITE", "ACK", "BYE"]
    assert d.released


async def test_remote_bye_on_a_party_leg_reaches_the_engine() -> None:
    uac, transport, _ = make_uac(46120)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    invite = transport.last("INVITE")
    uac.on_message(ok(invite), PEER, 0.0)
    leg = await task
    events = Events()
    leg.attach(events)
    bye = Request(
        "BYE",
        SipUri.parse("sip:appbridge@127.0.0.1:5060"),
        make_response(invite, 200, to_tag="callee1").headers.copy(),
    )
    bye.headers.set("From", str(make_response(invite, 200, to_tag="callee1").to))
    bye.headers.set("To", str(invite.from_))
    bye.headers.set("CSeq", "5 BYE")
    uac.on_message(bye, PEER, 0.0)
    assert events.hangups == 1 and leg.closed
    assert (bye, 200) in transport.responses
    assert uac.dials[invite.call_id].released
    await leg.hangup()
    assert "BYE" not in transport.methods()


async def test_timer_b_and_refused_credentials_fail() -> None:
    uac, transport, _ = make_uac(46140)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    uac.on_timeout(transport.last("INVITE"), 0.0)
    with pytest.raises(TransferError, match="408"):
        await task
    task = start(uac, transport)
    await until(lambda: len(transport.sent) == 2)
    respond(
        uac,
        transport.last("INVITE"),
        407,
        headers=[("Proxy-Authenticate", 'Digest realm="x", nonce="n1"')],
    )
    with pytest.raises(TransferError, match="407"):
        await task  # the trunk has no credentials to offer


async def test_tcp_trunk_connects_and_a_refused_connection_fails() -> None:
    uac, transport, _ = make_uac(46160)
    tcp = SipTrunk(name="tcp", host="127.0.0.1", port=5098, transport="tcp")
    task = asyncio.create_task(
        dial_party(uac, tcp, CALLEE, caller_id="", headers=None, timeout_s=5, label="p")
    )
    await until(lambda: transport.sent)
    invite, peer = transport.sent[0]
    assert peer == ("tcp", 7) and transport.connects == [("127.0.0.1", 5098)]
    assert invite.top_via.transport == "TCP" and invite.top_via.sent_by == "127.0.0.1:5062"
    assert invite.contacts[0].uri.param("transport") == "tcp"
    assert invite.from_.uri.user == "appbridge"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    transport.refuse_tcp = True
    with pytest.raises(TransferError, match="TCP"):
        await dial_party(uac, tcp, CALLEE, caller_id="", headers=None, timeout_s=5, label="p")


def test_route_target_picks_the_trunk() -> None:
    trunks = (TRUNK, OTHER)
    assert route_target(trunks, OTHER, "+15550009999") == (OTHER, "+15550009999")
    assert route_target(trunks, None, "+15550009999") == (TRUNK, "+15550009999")
    assert route_target(trunks, TRUNK, "sip:alice@198.51.100.9") == (OTHER, "alice")
    for bad in ("sip:alice@203.0.113.1", "sip:198.51.100.9", "tel:+1555", "nonsense"):
        with pytest.raises(TransferError):
            route_target(trunks, TRUNK, bad)
    with pytest.raises(TransferError):
        route_target((), None, "+15550009999")


async def test_signalling_dials_through_the_calls_trunk() -> None:
    uac, transport, _ = make_uac(46180)
    sig = SipCallSignalling(
        uac=uac,
        trunks=(TRUNK, OTHER),
        trunk=OTHER,
        label="call CA1",
        dialog=lambda: None,
        send=lambda r: None,
        end_call=lambda: None,
        referred_by="<sip:appbridge@127.0.0.1:5060>",
    )
    task = asyncio.create_task(
        sig.dial_party("+15550004444", caller_id="+1555", headers=None, timeout_s=5)
    )
    await until(lambda: transport.sent)
    invite, peer = transport.sent[0]
    assert peer == ("udp", OTHER.host, OTHER.port) and invite.uri.host == OTHER.host
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(TransferError, match="no SIP dialog"):
        await sig.refer("+15550004444", None)


async def test_remote_hangup_goes_to_whoever_is_attached() -> None:
    uac, transport, _ = make_uac(46200)
    task = start(uac, transport)
    await until(lambda: transport.sent)
    uac.on_message(ok(transport.last("INVITE")), PEER, 0.0)
    leg = await task
    calls: list[str] = []
    leg.remote_hangup(lambda: calls.append("call"))
    leg.remote_hangup(lambda: calls.append("again"))
    assert calls == ["call"] and leg.closed  # not attached yet: the fallback (the Call)
    events = Events()
    leg.attach(events)  # attached later: told at once
    assert events.hangups == 1
    await leg.hangup()
    assert "BYE" not in transport.methods()  # the dialog is already over
    for d in list(uac.dials.values()):
        uac.release(d)  # the UAC's BYE handling does this; here the leg was told directly
