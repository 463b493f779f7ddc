"""RFC 3261 §17 transactions in virtual time: exact retransmission instants and timeouts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from appbridge.carriers.sip.message import Request, Response, make_response, parse_message
from appbridge.carriers.sip.transaction import (
    Deliver,
    Effect,
    InviteClientTransaction,
    InviteServerTransaction,
    NonInviteClientTransaction,
    NonInviteServerTransaction,
    Send,
    State,
    Terminated,
    Timeout,
    TransactionLayer,
    TransportError,
    make_ack,
    make_cancel,
    server_key,
)
from appbridge.clock import VirtualClock

PEER = ("udp", "192.0.2.20", 5060)
START = 1000.0


def request(method: str = "INVITE", branch: str = "z9hG4bKt1", seq: int = 1) -> Request:
    data = (
        f"{method} sip:bob@192.0.2.20 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.10:5060;branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:alice@192.0.2.10>;tag=a1\r\n"
        "To: <sip:bob@192.0.2.20>\r\n"
        "Call-ID: txn-test@192.0.2.10\r\n"
        f"CSeq: {seq} {method}\r\n"
        "Contact: <sip:alice@192.0.2.10:5060>\r\n"
        "Route: <sip:proxy.example;lr>\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    m = parse_message(data)
    assert isinstance(m, Request)
    return m


def reply(req: Request, status: int) -> Response:
    return make_response(req, status, to_tag="b2" if status > 100 else None)


def run(txn: object, clock: VirtualClock, until: float) -> list[tuple[float, list[Effect]]]:
    """Step virtual time from deadline to deadline up to ``until`` (relative to START)."""
    out: list[tuple[float, list[Effect]]] = []
    while True:
        deadline = txn.next_deadline()  # type: ignore[attr-defined]
        if deadline is None or deadline > START + until:
            return out
        clock.advance(deadline - clock.now())
        out.append((round(clock.now() - START, 6), txn.on_timer(clock.now())))  # type: ignore[attr-defined]


def sends(timeline: Sequence[tuple[float, list[Effect]]]) -> list[float]:
    return [t for t, effects in timeline for e in effects if isinstance(e, Send)]


def kinds(effects: Sequence[Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=START)


# --- INVITE client (§17.1.1) -----------------------------------------------------------------


def test_invite_client_udp_retransmits_at_doubling_intervals_then_times_out(
    clock: VirtualClock,
) -> None:
    txn = InviteClientTransaction(request(), reliable=False, peer=PEER)
    first = txn.start(clock.now())
    assert first == [Send(txn.request.serialize(), PEER)]
    timeline = run(txn, clock, 64.0)
    # Timer A: T1, then doubling without cap; Timer B = 64*T1 = 32 s.
    assert sends(timeline) == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    last_t, last = timeline[-1]
    assert last_t == 32.0 and kinds(last) == ["Timeout", "Terminated"]
    assert isinstance(last[0], Timeout) and last[0].timer == "B"
    assert txn.terminated and txn.next_deadline() is None


def test_invite_client_tcp_never_retransmits(clock: VirtualClock) -> None:
    txn = InviteClientTransaction(request(), reliable=True, peer=PEER)
    txn.start(clock.now())
    timeline = run(txn, clock, 64.0)
    assert sends(timeline) == []
    assert [(t, kinds(e)) for t, e in timeline] == [(32.0, ["Timeout", "Terminated"])]


def test_invite_client_provisional_stops_retransmission(clock: VirtualClock) -> None:
    txn = InviteClientTransaction(request(), reliable=False, peer=PEER)
    txn.start(clock.now())
    clock.advance(0.7)
    txn.on_timer(clock.now())  # one retransmission at 0.5
    ringing = reply(txn.request, 180)
    assert txn.on_response(ringing, clock.now()) == [Deliver(ringing, PEER)]
    assert txn.state is State.PROCEEDING and txn.next_deadline() is None
    assert txn.on_response(ringing, clock.now()) == [Deliver(ringing, PEER)]


@pytest.mark.parametrize(("reliable", "wait_s"), [(False, 32.0), (True, None)])
def test_invite_client_non_2xx_final_acks_and_absorbs(
    clock: VirtualClock, reliable: bool, wait_s: float | None
) -> None:
    txn = InviteClientTransaction(request(), reliable=reliable, peer=PEER)
    txn.start(clock.now())
    clock.advance(2.0)
    busy = reply(txn.request, 486)
    effects = txn.on_response(busy, clock.now())
    assert isinstance(effects[0], Send) and effects[1] == Deliver(busy, PEER)
    ack = parse_message(effects[0].data)
    assert isinstance(ack, Request) and ack.method == "ACK"
    assert ack.cseq.seq == 1 and ack.cseq.method == "ACK"
    assert ack.top_via.branch == "z9hG4bKt1" and ack.to.tag == "b2"
    assert [r.uri.host for r in ack.routes] == ["proxy.example"]
    if wait_s is None:
        assert kinds(effects[2:]) == ["Terminated"] and txn.terminated
        return
    assert txn.state is State.COMPLETED
    # A retransmitted final gets the same ACK again and is not delivered twice.
    assert txn.on_response(busy, clock.now() + 1) == [Send(effects[0].data, PEER)]
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(2.0 + wait_s, ["Terminated"])]


def test_invite_client_accepted_passes_every_2xx_then_ends_after_timer_m(
    clock: VirtualClock,
) -> None:
    txn = InviteClientTransaction(request(), reliable=False, peer=PEER)
    txn.start(clock.now())
    clock.advance(1.0)
    ok = reply(txn.request, 200)
    assert txn.on_response(ok, clock.now()) == [Deliver(ok, PEER)]
    assert txn.state is State.ACCEPTED
    assert txn.on_response(ok, clock.now()) == [Deliver(ok, PEER)]  # RFC 6026 §8.4
    assert txn.on_response(reply(txn.request, 500), clock.now()) == []
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(33.0, ["Terminated"])]


def test_late_timer_call_keeps_exact_schedule(clock: VirtualClock) -> None:
    txn = InviteClientTransaction(request(), reliable=False, peer=PEER)
    txn.start(clock.now())
    clock.advance(2.0)  # the shell was late: A was due at 0.5 and 1.5
    assert kinds(txn.on_timer(clock.now())) == ["Send", "Send"]
    assert txn.next_deadline() == START + 3.5


def test_transport_error_ends_the_transaction(clock: VirtualClock) -> None:
    txn = InviteClientTransaction(request(), reliable=True, peer=PEER)
    txn.start(clock.now())
    effects = txn.on_transport_error(clock.now())
    assert effects == [TransportError(txn.request), Terminated(txn.key, "transport error")]
    assert txn.on_transport_error(clock.now()) == []


# --- non-INVITE client (§17.1.2) -------------------------------------------------------------


def test_non_invite_client_udp_caps_at_t2_then_times_out(clock: VirtualClock) -> None:
    txn = NonInviteClientTransaction(request("BYE", seq=2), reliable=False, peer=PEER)
    txn.start(clock.now())
    timeline = run(txn, clock, 64.0)
    assert sends(timeline) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timeline[-1][0] == 32.0 and kinds(timeline[-1][1]) == ["Timeout", "Terminated"]


def test_non_invite_client_proceeding_retransmits_every_t2(clock: VirtualClock) -> None:
    txn = NonInviteClientTransaction(request("OPTIONS"), reliable=False, peer=PEER)
    txn.start(clock.now())
    clock.advance(0.6)
    txn.on_timer(clock.now())  # 0.5; next E at 1.5
    clock.advance(0.1)
    txn.on_response(reply(txn.request, 100), clock.now())
    timeline = run(txn, clock, 20.0)
    assert sends(timeline) == [1.5, 5.5, 9.5, 13.5, 17.5]


@pytest.mark.parametrize(("reliable", "end"), [(False, 8.0), (True, 3.0)])
def test_non_invite_client_completed_waits_timer_k(
    clock: VirtualClock, reliable: bool, end: float
) -> None:
    txn = NonInviteClientTransaction(request("INFO"), reliable=reliable, peer=PEER)
    txn.start(clock.now())
    clock.advance(3.0)
    ok = reply(txn.request, 200)
    effects = txn.on_response(ok, clock.now())
    assert effects[0] == Deliver(ok, PEER)
    if reliable:
        assert kinds(effects) == ["Deliver", "Terminated"]
        return
    assert txn.on_response(ok, clock.now()) == []  # absorbed in Completed
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(end, ["Terminated"])]


# --- INVITE server (§17.2.1) -----------------------------------------------------------------


def test_invite_server_resends_provisional_on_retransmitted_invite(clock: VirtualClock) -> None:
    req = request()
    txn = InviteServerTransaction(req, reliable=False, peer=PEER)
    assert txn.on_request(req, clock.now()) == []  # nothing sent yet
    trying = reply(req, 100)
    assert txn.send_response(trying, clock.now()) == [Send(trying.serialize(), PEER)]
    ringing = reply(req, 180)
    txn.send_response(ringing, clock.now())
    assert txn.on_request(req, clock.now()) == [Send(ringing.serialize(), PEER)]
    assert txn.next_deadline() is None  # no timers while proceeding


def test_invite_server_udp_resends_final_until_timer_h(clock: VirtualClock) -> None:
    req = request()
    txn = InviteServerTransaction(req, reliable=False, peer=PEER)
    busy = reply(req, 486)
    txn.send_response(busy, clock.now())
    timeline = run(txn, clock, 64.0)
    # Timer G: T1 doubling up to T2; Timer H: 64*T1.
    assert sends(timeline) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timeline[-1][0] == 32.0
    assert kinds(timeline[-1][1]) == ["Timeout", "Terminated"]
    last = timeline[-1][1][0]
    assert isinstance(last, Timeout) and last.timer == "H"


@pytest.mark.parametrize(("reliable", "wait_s"), [(False, 5.0), (True, None)])
def test_invite_server_ack_confirms_then_timer_i(
    clock: VirtualClock, reliable: bool, wait_s: float | None
) -> None:
    req = request()
    txn = InviteServerTransaction(req, reliable=reliable, peer=PEER)
    busy = reply(req, 486)
    txn.send_response(busy, clock.now())
    if not reliable:
        assert sends(run(txn, clock, 2.0)) == [0.5, 1.5]
    clock.advance(START + 2.0 - clock.now())
    if not reliable:
        assert txn.on_request(req, clock.now()) == [Send(busy.serialize(), PEER)]
    ack = make_ack(req, busy)
    effects = txn.on_request(ack, clock.now())
    if wait_s is None:
        assert kinds(effects) == ["Terminated"]
        return
    assert effects == [] and txn.state is State.CONFIRMED
    assert txn.on_request(ack, clock.now()) == []  # absorbed
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(2.0 + wait_s, ["Terminated"])]


def test_invite_server_accepted_absorbs_invites_and_passes_acks(clock: VirtualClock) -> None:
    req = request()
    txn = InviteServerTransaction(req, reliable=False, peer=PEER)
    ok = reply(req, 200)
    assert txn.send_response(ok, clock.now()) == [Send(ok.serialize(), PEER)]
    assert txn.state is State.ACCEPTED
    assert txn.on_request(req, clock.now()) == []
    ack = make_ack(req, ok)
    assert txn.on_request(ack, clock.now()) == [Deliver(ack, PEER)]
    assert txn.send_response(ok, clock.now()) == [Send(ok.serialize(), PEER)]
    assert txn.send_response(reply(req, 486), clock.now()) == []
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(32.0, ["Terminated"])]


# --- non-INVITE server (§17.2.2) -------------------------------------------------------------


@pytest.mark.parametrize(("reliable", "end"), [(False, 33.0), (True, None)])
def test_non_invite_server(clock: VirtualClock, reliable: bool, end: float | None) -> None:
    req = request("BYE", seq=5)
    txn = NonInviteServerTransaction(req, reliable=reliable, peer=PEER)
    assert txn.on_request(req, clock.now()) == []  # trying: absorbed
    trying = reply(req, 100)
    txn.send_response(trying, clock.now())
    assert txn.on_request(req, clock.now()) == [Send(trying.serialize(), PEER)]
    clock.advance(1.0)
    ok = reply(req, 200)
    effects = txn.send_response(ok, clock.now())
    assert effects[0] == Send(ok.serialize(), PEER)
    if end is None:
        assert kinds(effects) == ["Send", "Terminated"]
        return
    assert txn.on_request(req, clock.now()) == [Send(ok.serialize(), PEER)]
    assert txn.send_response(reply(req, 500), clock.now()) == []
    timeline = run(txn, clock, 60.0)
    assert [(t, kinds(e)) for t, e in timeline] == [(end, ["Terminated"])]


# --- building ACK and CANCEL -----------------------------------------------------------------


def test_make_cancel_targets_the_invite_branch() -> None:
    req = request()
    cancel = make_cancel(req)
    assert cancel.method == "CANCEL" and str(cancel.uri) == str(req.uri)
    assert cancel.top_via.branch == req.top_via.branch
    assert (cancel.cseq.seq, cancel.cseq.method) == (1, "CANCEL")
    assert cancel.to.tag is None and cancel.from_.tag == "a1"
    assert [r.uri.host for r in cancel.routes] == ["proxy.example"]
    assert server_key(cancel)[:-1] == server_key(req)[:-1]


# --- the matching layer (§17.1.3, §17.2.3) ---------------------------------------------------


def test_layer_creates_matches_and_reaps_server_transactions(clock: VirtualClock) -> None:
    layer = TransactionLayer()
    req = request()
    assert layer.receive(req, peer=PEER, reliable=False, now=clock.now()) == [Deliver(req, PEER)]
    assert len(layer) == 1
    # A retransmission matches and is absorbed (nothing sent yet).
    assert layer.receive(req, peer=PEER, reliable=False, now=clock.now()) == []
    assert kinds(layer.send_response(reply(req, 180), clock.now())) == ["Send"]
    again = layer.receive(req, peer=PEER, reliable=False, now=clock.now())
    assert kinds(again) == ["Send"]
    # A different branch is a different transaction.
    other = request(branch="z9hG4bKother")
    assert kinds(layer.receive(other, peer=PEER, reliable=False, now=clock.now())) == ["Deliver"]
    assert len(layer) == 2
    # CANCEL: its own transaction, and it finds the INVITE it cancels.
    cancel = make_cancel(req)
    layer.receive(cancel, peer=PEER, reliable=False, now=clock.now())
    target = layer.invite_for_cancel(cancel)
    assert target is not None and target.request is req
    assert kinds(layer.send_response(reply(cancel, 200), clock.now())) == ["Send"]
    terminated = layer.send_response(reply(req, 487), clock.now())
    assert kinds(terminated) == ["Send"]
    ack = make_ack(req, reply(req, 487))
    assert layer.receive(ack, peer=PEER, reliable=False, now=clock.now()) == []
    # Everything ends in virtual time; the layer forgets what ended.
    while (deadline := layer.next_deadline()) is not None:
        clock.advance(deadline - clock.now())
        layer.on_timer(clock.now())
    assert len(layer) == 1  # the other INVITE, still proceeding, has no timer
    with pytest.raises(LookupError):
        layer.send_response(reply(req, 200), clock.now())


def test_layer_client_side_and_strays(clock: VirtualClock) -> None:
    layer = TransactionLayer()
    req = request()
    assert kinds(layer.send_request(req, peer=PEER, reliable=False, now=clock.now())) == ["Send"]
    assert layer.client(req) is not None
    ok = reply(req, 200)
    assert layer.receive(ok, peer=PEER, reliable=False, now=clock.now()) == [Deliver(ok, PEER)]
    ack = make_ack(req, ok)
    assert layer.send_request(ack, peer=PEER, reliable=False, now=clock.now()) == [
        Send(ack.serialize(), PEER)
    ]
    stray = reply(request(branch="z9hG4bKgone"), 200)
    assert layer.receive(stray, peer=PEER, reliable=False, now=clock.now()) == [
        Deliver(stray, PEER)
    ]
    lone_ack = make_ack(request(branch="z9hG4bKnew"), ok)
    assert layer.receive(lone_ack, peer=PEER, reliable=False, now=clock.now()) == [
        Deliver(lone_ack, PEER)
    ]
    bye = request("BYE", seq=2)
    layer.send_request(bye, peer=PEER, reliable=True, now=clock.now())
    effects = layer.transport_error(PEER, clock.now())
    assert sorted(kinds(effects)) == [
        "Terminated",
        "Terminated",
        "TransportError",
        "TransportError",
    ]
    assert len(layer) == 0


def test_layer_matches_rfc2543_requests_without_magic_cookie(clock: VirtualClock) -> None:
    layer = TransactionLayer()
    old = request(branch="oldstyle")
    assert server_key(old)[0] == "server-2543"
    layer.receive(old, peer=PEER, reliable=False, now=clock.now())
    layer.send_response(reply(old, 180), clock.now())
    assert kinds(layer.receive(old, peer=PEER, reliable=False, now=clock.now())) == ["Send"]


def test_layer_timer_drives_all_transactions(clock: VirtualClock) -> None:
    layer = TransactionLayer()
    layer.send_request(request(), peer=PEER, reliable=False, now=clock.now())
    options = request("OPTIONS", branch="z9hG4bKo")
    layer.send_request(options, peer=PEER, reliable=False, now=clock.now() + 0.2)
    assert layer.next_deadline() == START + 0.5
    clock.advance(0.7)
    assert kinds(layer.on_timer(clock.now())) == ["Send", "Send"]
    clock.advance(40.0)
    effects = layer.on_timer(clock.now())
    assert kinds(effects).count("Timeout") == 2 and len(layer) == 0
