"""RFC 3261 §12-§13 dialogs: creation, in-dialog requests, CSeq order, 2xx/ACK in virtual time."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from appbridge.carriers.sip.dialog import (
    AckTimeout,
    AnswerRetransmitter,
    Dialog,
    DialogError,
    DialogState,
)
from appbridge.carriers.sip.headers import NameAddr, SipUri
from appbridge.carriers.sip.message import Request, Response, make_response, parse_message
from appbridge.carriers.sip.transaction import Deliver, Effect, Send, TransactionLayer
from appbridge.clock import VirtualClock

START = 1000.0
GW_CONTACT = NameAddr(SipUri.parse("sip:gw@192.0.2.10:5060"))

INVITE = (
    b"INVITE sip:+15550002222@192.0.2.10 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 198.51.100.7:5060;branch=z9hG4bKinv1;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b'From: "Ann" <sip:+15551230001@trunk.example>;tag=ann1\r\n'
    b"To: <sip:+15550002222@192.0.2.10>\r\n"
    b"Call-ID: dlg-1@198.51.100.7\r\n"
    b"CSeq: 10 INVITE\r\n"
    b"Contact: <sip:ann@198.51.100.7:5060>\r\n"
    b"Record-Route: <sip:edge1.example;lr>, <sip:edge2.example;lr>\r\n"
    b"Content-Length: 0\r\n\r\n"
)


def invite() -> Request:
    m = parse_message(INVITE)
    assert isinstance(m, Request)
    return m


def uas_dialog() -> Dialog:
    return Dialog.from_uas(invite(), "gw1", GW_CONTACT, local_seq=100)


def incoming(dialog: Dialog, method: str, seq: int, *extra: str) -> Request:
    lines = [
        f"{method} sip:gw@192.0.2.10:5060 SIP/2.0",
        "Via: SIP/2.0/UDP 198.51.100.7:5060;branch=z9hG4bKin" + str(seq),
        "From: <sip:+15551230001@trunk.example>;tag=ann1",
        f"To: <sip:+15550002222@192.0.2.10>;tag={dialog.local_tag}",
        f"Call-ID: {dialog.call_id}",
        f"CSeq: {seq} {method}",
        *extra,
        "Content-Length: 0",
    ]
    m = parse_message(("\r\n".join(lines) + "\r\n\r\n").encode())
    assert isinstance(m, Request)
    return m


# --- UAS ---------------------------------------------------------------------------------------


def test_uas_dialog_state_from_invite() -> None:
    d = uas_dialog()
    assert d.id == ("dlg-1@198.51.100.7", "gw1", "ann1")
    assert str(d.remote_target) == "sip:ann@198.51.100.7:5060"
    assert [r.uri.host for r in d.route_set] == ["edge1.example", "edge2.example"]
    assert d.remote_seq == 10 and d.local_seq == 100
    assert (d.transport, d.sent_by) == ("UDP", "192.0.2.10:5060")
    assert d.state is DialogState.CONFIRMED and not d.secure
    assert str(d.next_hop()) == "sip:edge1.example;lr"
    random_start = Dialog.from_uas(invite(), "gw2", GW_CONTACT.uri)
    assert 0 < random_start.local_seq < 2**31


def test_uas_bye_is_built_per_12_2_1_1() -> None:
    d = uas_dialog()
    bye = d.create_request("BYE", branch="z9hG4bKbye")
    assert bye.method == "BYE" and str(bye.uri) == "sip:ann@198.51.100.7:5060"
    assert bye.from_.tag == "gw1" and bye.from_.uri.user == "+15550002222"
    assert bye.to.tag == "ann1" and bye.to.display_name == "Ann"
    assert bye.call_id == d.call_id and (bye.cseq.seq, bye.cseq.method) == (101, "BYE")
    assert [str(r) for r in bye.routes] == ["<sip:edge1.example;lr>", "<sip:edge2.example;lr>"]
    via = bye.top_via
    assert (via.transport, via.sent_by, via.branch, via.rport) == (
        "UDP",
        "192.0.2.10:5060",
        "z9hG4bKbye",
        "",
    )
    assert bye.max_forwards == 70 and bye.contacts == []
    # It is a valid message on the wire.
    assert parse_message(bye.serialize()).cseq.seq == 101
    assert d.create_request("INFO").cseq.seq == 102


def test_target_refresh_requests_carry_contact_and_bodies() -> None:
    d = uas_dialog()
    sdp = b"v=0\r\no=- 1 2 IN IP4 192.0.2.10\r\n"
    reinvite = d.create_request("INVITE", body=sdp, content_type="application/sdp")
    assert reinvite.contacts == [GW_CONTACT] and reinvite.body == sdp
    assert reinvite.content_type == "application/sdp"
    refer = d.create_request(
        "REFER",
        headers=[("Refer-To", "<sip:+15550009999@trunk.example>"), ("Referred-By", "<sip:gw@x>")],
    )
    assert refer.headers.get("Refer-To") == "<sip:+15550009999@trunk.example>"
    assert refer.contacts == [GW_CONTACT]
    notify = d.create_request(
        "NOTIFY",
        headers=[("Event", "refer"), ("Subscription-State", "terminated;reason=noresource")],
        body=b"SIP/2.0 200 OK\r\n",
        content_type="message/sipfrag;version=2.0",
    )
    assert notify.headers.get("Event") == "refer" and notify.content_type == "message/sipfrag"
    dtmf = b"Signal=5\r\nDuration=160\r\n"
    info = d.create_request("INFO", body=dtmf, content_type="application/dtmf-relay")
    assert info.contacts == [] and info.body == dtmf
    assert [r.cseq.seq for r in (reinvite, refer, notify, info)] == [101, 102, 103, 104]
    with pytest.raises(ValueError):
        d.create_request("ACK")
    d.terminate()
    with pytest.raises(ValueError):
        d.create_request("BYE")


def test_incoming_requests_check_cseq_order_and_refresh_target() -> None:
    d = uas_dialog()
    assert d.matches(incoming(d, "INFO", 11))
    d.on_request(incoming(d, "INFO", 11))
    assert d.remote_seq == 11
    with pytest.raises(DialogError) as caught:
        d.on_request(incoming(d, "INFO", 9))
    assert caught.value.status == 500
    d.on_request(incoming(d, "ACK", 10))  # ACK carries the INVITE's number: no check
    reinvite = incoming(d, "INVITE", 12, "Contact: <sip:ann@203.0.113.44:5080>")
    d.on_request(reinvite)
    assert str(d.remote_target) == "sip:ann@203.0.113.44:5080"
    assert str(d.create_request("BYE").uri) == "sip:ann@203.0.113.44:5080"
    d.on_request(incoming(d, "BYE", 13))
    assert d.state is DialogState.TERMINATED


def test_matches_rejects_other_dialogs() -> None:
    d = uas_dialog()
    other = incoming(d, "BYE", 11)
    other.headers.set("To", "<sip:+15550002222@192.0.2.10>;tag=someone-else")
    assert not d.matches(other)
    other.headers.set("To", "<sip:+15550002222@192.0.2.10>;tag=gw1")
    other.headers.set("Call-ID", "another@x")
    assert not d.matches(other)


def test_from_uas_requires_contact() -> None:
    bad = invite()
    bad.headers.remove("Contact")
    with pytest.raises(DialogError):
        Dialog.from_uas(bad, "gw1", GW_CONTACT)


# --- UAC ---------------------------------------------------------------------------------------


def uac_pair(status: int = 200) -> tuple[Request, Response, Dialog]:
    req = invite()
    resp = make_response(
        req, status, to_tag="bob9", headers=[("Contact", "<sip:bob@203.0.113.5:5062>")]
    )
    resp.headers.set("Record-Route", "<sip:edge1.example;lr>, <sip:edge2.example;lr>")
    return req, resp, Dialog.from_uac(req, resp)


def test_uac_dialog_reverses_route_set_and_acks_2xx() -> None:
    req, ok, d = uac_pair()
    assert d.id == ("dlg-1@198.51.100.7", "ann1", "bob9") and d.state is DialogState.CONFIRMED
    assert [r.uri.host for r in d.route_set] == ["edge2.example", "edge1.example"]
    assert (d.local_seq, d.remote_seq) == (10, None)
    assert (d.transport, d.sent_by) == ("UDP", "198.51.100.7:5060")
    assert d.matches(ok)
    ack = d.create_ack(10, branch="z9hG4bKack")
    assert ack.method == "ACK" and (ack.cseq.seq, ack.cseq.method) == (10, "ACK")
    assert str(ack.uri) == "sip:bob@203.0.113.5:5062" and ack.top_via.branch == "z9hG4bKack"
    assert ack.top_via.branch != req.top_via.branch
    assert ack.to.tag == "bob9" and ack.from_.tag == "ann1" and ack.contacts == []
    assert d.ack_for(ok) is ack  # a retransmitted 2xx gets the same ACK
    assert d.ack_for(make_response(req, 180, to_tag="bob9")) is None
    bye = d.create_request("BYE")
    assert bye.cseq.seq == 11 and [r.uri.host for r in bye.routes] == [
        "edge2.example",
        "edge1.example",
    ]


def test_early_dialog_is_confirmed_by_2xx_with_recomputed_routes() -> None:
    req, _, d = uac_pair(180)
    assert d.state is DialogState.EARLY
    ok = make_response(req, 200, to_tag="bob9", headers=[("Contact", "<sip:bob@203.0.113.6>")])
    ok.headers.set("Record-Route", "<sip:only.example;lr>")
    d.on_response(ok)
    assert d.state is DialogState.CONFIRMED
    assert [r.uri.host for r in d.route_set] == ["only.example"]
    assert str(d.remote_target) == "sip:bob@203.0.113.6"


def test_responses_481_and_bye_end_the_dialog() -> None:
    _, _, d = uac_pair()
    info = d.create_request("INFO")
    d.on_response(make_response(info, 500))
    assert d.state is DialogState.CONFIRMED
    d.on_response(make_response(info, 481))
    assert d.state is DialogState.TERMINATED
    _, _, d2 = uac_pair()
    bye = d2.create_request("BYE")
    d2.on_response(make_response(bye, 200))
    assert d2.state is DialogState.TERMINATED


def test_response_without_to_tag_makes_no_dialog() -> None:
    req = invite()
    with pytest.raises(DialogError):
        Dialog.from_uac(req, make_response(req, 200))


def test_strict_route_goes_into_the_request_uri() -> None:
    req, ok, _ = uac_pair()
    ok.headers.set("Record-Route", "<sip:strict.example>, <sip:loose.example;lr>")
    d = Dialog.from_uac(req, ok)
    bye = d.create_request("BYE")
    # Reversed, the loose route comes first: the remote target stays the Request-URI.
    assert str(bye.uri) == "sip:bob@203.0.113.5:5062"
    ok.headers.set("Record-Route", "<sip:loose.example;lr>, <sip:strict.example>")
    d2 = Dialog.from_uac(req, ok)
    bye2 = d2.create_request("BYE")
    assert str(bye2.uri) == "sip:strict.example"
    assert [str(r) for r in bye2.routes] == [
        "<sip:loose.example;lr>",
        "<sip:bob@203.0.113.5:5062>",
    ]


# --- UAS 2xx retransmission (§13.3.1.4) ----------------------------------------------------------


def run(r: AnswerRetransmitter, clock: VirtualClock, until: float) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    while (deadline := r.next_deadline()) is not None and deadline <= START + until:
        clock.advance(deadline - clock.now())
        out += [(round(clock.now() - START, 6), type(e).__name__) for e in r.on_timer(clock.now())]
    return out


def test_2xx_retransmits_until_ack_udp() -> None:
    clock = VirtualClock(start=START)
    ok = make_response(invite(), 200, to_tag="gw1")
    r = AnswerRetransmitter(ok, reliable=False, now=clock.now(), peer="p")
    timeline = run(r, clock, 4.0)
    assert timeline == [(0.5, "Send"), (1.5, "Send"), (3.5, "Send")]
    assert not r.on_ack(incoming(uas_dialog(), "ACK", 9))  # not this INVITE's number
    assert r.on_ack(incoming(uas_dialog(), "ACK", 10)) and r.acked and r.done
    assert r.next_deadline() is None and r.on_timer(clock.now() + 100) == []


def test_2xx_without_ack_gives_up_after_64_t1() -> None:
    clock = VirtualClock(start=START)
    ok = make_response(invite(), 200, to_tag="gw1")
    r = AnswerRetransmitter(ok, reliable=False, now=clock.now())
    timeline = run(r, clock, 100.0)
    resent = [t for t, kind in timeline if kind == "Send"]
    assert resent == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timeline[-1] == (32.0, "AckTimeout") and r.done and not r.acked


def test_2xx_over_tcp_is_not_retransmitted_but_still_times_out() -> None:
    clock = VirtualClock(start=START)
    ok = make_response(invite(), 200, to_tag="gw1")
    r = AnswerRetransmitter(ok, reliable=True, now=clock.now())
    assert run(r, clock, 100.0) == [(32.0, "AckTimeout")]
    clock2 = VirtualClock(start=START)
    late = AnswerRetransmitter(ok, reliable=False, now=clock2.now())
    effects = late.on_timer(clock2.now() + 40.0)  # a very late shell: resends, then gives up
    assert isinstance(effects[-1], AckTimeout) and len(effects) == 11


# --- a whole call, both user agents, over a lossy in-memory link -------------------------------


class Link:
    """Delivers what one side sends to the other, through the real parser, dropping on demand."""

    def __init__(self) -> None:
        self.drop_next: set[str] = set()
        self.sent: list[str] = []

    def carry(self, effects: Sequence[object]) -> list[bytes]:
        out = []
        for e in effects:
            if isinstance(e, Send):
                first = e.data.split(b"\r\n", 1)[0].decode()
                self.sent.append(first)
                if first in self.drop_next:
                    self.drop_next.discard(first)
                    continue
                out.append(e.data)
        return out


def delivered(effects: Sequence[Effect]) -> list[Request | Response]:
    return [e.message for e in effects if isinstance(e, Deliver)]


def test_call_flow_with_a_lost_200_and_bye() -> None:
    clock = VirtualClock(start=START)
    alice, gw = TransactionLayer(), TransactionLayer()
    a_peer: Hashable = ("udp", "192.0.2.10", 5060)
    g_peer: Hashable = ("udp", "198.51.100.7", 5060)
    link = Link()

    def to_gw(effects: Sequence[object]) -> list[Request | Response]:
        out: list[Request | Response] = []
        for data in link.carry(effects):
            message = parse_message(data)
            out += delivered(gw.receive(message, peer=g_peer, reliable=False, now=clock.now()))
        return out

    def to_alice(effects: Sequence[object]) -> list[Request | Response]:
        out: list[Request | Response] = []
        for data in link.carry(effects):
            message = parse_message(data)
            out += delivered(alice.receive(message, peer=a_peer, reliable=False, now=clock.now()))
        return out

    inv = invite()
    (got,) = to_gw(alice.send_request(inv, peer=a_peer, reliable=False, now=clock.now()))
    assert isinstance(got, Request) and got.method == "INVITE"
    (trying,) = to_alice(gw.send_response(make_response(got, 100), clock.now()))
    assert isinstance(trying, Response) and trying.status == 100
    uas = Dialog.from_uas(got, "gw1", GW_CONTACT, local_seq=1)
    ok = make_response(got, 200, to_tag="gw1", headers=[("Contact", str(GW_CONTACT))])
    link.drop_next.add("SIP/2.0 200 OK")
    assert to_alice(gw.send_response(ok, clock.now())) == []  # lost on the way
    retx = AnswerRetransmitter(ok, reliable=False, now=clock.now())

    clock.advance(0.5)
    (ok_at_alice,) = to_alice(retx.on_timer(clock.now()))
    assert isinstance(ok_at_alice, Response) and ok_at_alice.status == 200
    uac = Dialog.from_uac(inv, ok_at_alice)
    ack = uac.create_ack(inv.cseq.seq)
    (ack_at_gw,) = to_gw(alice.send_request(ack, peer=a_peer, reliable=False, now=clock.now()))
    assert isinstance(ack_at_gw, Request) and retx.on_ack(ack_at_gw)
    uas.on_request(ack_at_gw)

    clock.advance(5.0)
    bye = uas.create_request("BYE")
    (bye_at_alice,) = to_alice(gw.send_request(bye, peer=g_peer, reliable=False, now=clock.now()))
    assert isinstance(bye_at_alice, Request) and uac.matches(bye_at_alice)
    uac.on_request(bye_at_alice)
    assert uac.state is DialogState.TERMINATED
    (bye_ok,) = to_gw(alice.send_response(make_response(bye_at_alice, 200), clock.now()))
    assert isinstance(bye_ok, Response) and uas.matches(bye_ok)
    uas.on_response(bye_ok)
    assert uas.state is DialogState.TERMINATED

    for layer in (alice, gw):
        while (deadline := layer.next_deadline()) is not None:
            clock.advance(max(0.0, deadline - clock.now()))
            layer.on_timer(clock.now())
    assert len(alice) == len(gw) == 0
    assert link.sent.count("SIP/2.0 200 OK") == 3  # lost 200, its retransmission, BYE's 200
