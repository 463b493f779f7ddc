"""RFC 3515 REFER from the gateway: the sans-I/O machine, the Refer-To value, and the whole
exchange (REFER, 202, NOTIFYs, our BYE) through ``SipCallSignalling`` in virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.dialog import Dialog
from appbridge.carriers.sip.headers import NameAddr, SipUri
from appbridge.carriers.sip.message import Request, make_response, parse_message
from appbridge.carriers.sip.party import SipCallSignalling
from appbridge.carriers.sip.refer import (
    NOTIFY_WAIT_S,
    ReferMachine,
    refer_to,
    safe_headers,
    sipfrag_status,
)
from tests.unit.sip.test_party_dial import OTHER, PEER, TRUNK, FakeTransport, make_uac

GW_CONTACT = NameAddr(SipUri.parse("sip:appbridge@127.0.0.1:5060"))
INVITE = (
    b"INVITE sip:+15550002222@127.0.0.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bKinv1;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b"From: <sip:+15551230001@127.0.0.1>;tag=ann1\r\n"
    b"To: <sip:+15550002222@127.0.0.1>\r\n"
    b"Call-ID: refer-1@127.0.0.1\r\n"
    b"CSeq: 10 INVITE\r\n"
    b"Contact: <sip:ann@127.0.0.1:5099>\r\n"
    b"Content-Length: 0\r\n\r\n"
)


def notify(m: ReferMachine, body: bytes, now: float = 0.0, **kw: Any) -> int:
    args: dict[str, Any] = {
        "event": "refer",
        "subscription_state": "active;expires=60",
        "content_type": "message/sipfrag;version=2.0",
    }
    args.update(kw)
    return m.on_notify(body=body, now=now, **args)


# -- the machine ----------------------------------------------------------------------------
def test_202_then_trying_then_200_succeeds() -> None:
    m = ReferMachine(sent_at=0.0)
    m.on_response(202, 0.1)
    assert m.accepted and m.outcome is None and m.next_deadline() == 0.1 + NOTIFY_WAIT_S
    assert notify(m, b"SIP/2.0 100 Trying\r\n") == 200
    assert m.outcome is None
    assert notify(m, b"SIP/2.0 200 OK\r\n", subscription_state="terminated;reason=noresource")
    assert m.outcome is not None and m.outcome.success
    assert m.progress == [100, 200] and m.next_deadline() is None


@pytest.mark.parametrize("status", [486, 503, 603])
def test_a_failing_sipfrag_fails(status: int) -> None:
    m = ReferMachine(sent_at=0.0)
    m.on_response(202, 0.0)
    notify(m, f"SIP/2.0 {status} Nope\r\n".encode())
    assert m.outcome is not None and not m.outcome.success and str(status) in m.outcome.message


def test_rejected_refer_and_timer_f_fail() -> None:
    m = ReferMachine(sent_at=0.0)
    m.on_response(100, 0.0)
    assert m.outcome is None
    m.on_response(403, 0.0)
    assert m.outcome is not None and "403" in m.outcome.message
    m2 = ReferMachine(sent_at=0.0)
    m2.on_timeout()
    assert m2.outcome is not None and not m2.outcome.success


def test_no_final_notify_within_30_s_fails() -> None:
    m = ReferMachine(sent_at=0.0)
    m.on_response(202, 1.0)
    notify(m, b"SIP/2.0 180 Ringing\r\n", now=5.0)
    m.on_timer(30.9)
    assert m.outcome is None
    m.on_timer(31.0)
    assert m.outcome is not None and "30 s" in m.outcome.message


def test_terminated_without_success_bad_event_and_early_notify() -> None:
    m = ReferMachine(sent_at=0.0)
    assert notify(m, b"SIP/2.0 100 Trying\r\n", now=2.0) == 200  # overtook the 202
    assert m.accepted and m.next_deadline() == 2.0 + NOTIFY_WAIT_S
    assert notify(m, b"SIP/2.0 100 Trying\r\n", event="dialog") == 489
    notify(m, b"", subscription_state="terminated")
    assert m.outcome is not None and not m.outcome.success


def test_sipfrag_and_refer_to_values() -> None:
    assert sipfrag_status(b"SIP/2.0 200 OK\r\nContact: <sip:x@y>\r\n") == 200
    assert sipfrag_status(b"garbage") is None
    assert refer_to("+15550009999", "sip.trunk.example", None) == (
        "<sip:+15550009999@sip.trunk.example>"
    )
    assert refer_to("sip:bob@198.51.100.9:5070", None, None) == "<sip:bob@198.51.100.9:5070>"
    # The trunk's own port and transport, so the referee reaches the trunk where it listens.
    assert refer_to("+15550009999", "10.0.0.7", None, port=5070, transport="tcp") == (
        "<sip:+15550009999@10.0.0.7:5070;transport=tcp>"
    )
    value = refer_to("sip:bob@h", None, {"X-Case": "a b&c", "Via": "x", "X-Bad": "1\r\n2"})
    assert value == "<sip:bob@h?X-Case=a%20b%26c>"
    SipUri.parse(value[1:-1])  # still a valid URI (RFC 3261 §19.1.1)
    with pytest.raises(TransferError):
        refer_to("+15550009999", None, None)
    with pytest.raises(TransferError):
        refer_to("tel:+1555", "h", None)
    assert safe_headers({"X-A": "1", "content-length": "9", "i": "compact call-id"}) == [
        ("X-A", "1")
    ]


# -- the exchange -------------------------------------------------------------------------------
def dialog() -> Dialog:
    m = parse_message(INVITE)
    assert isinstance(m, Request)
    return Dialog.from_uas(m, "gw1", GW_CONTACT, local_seq=100)


def incoming_notify(d: Dialog, seq: int, frag: str, state: str = "active") -> Request:
    lines = [
        "NOTIFY sip:appbridge@127.0.0.1:5060 SIP/2.0",
        f"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bKn{seq}",
        "From: <sip:+15551230001@127.0.0.1>;tag=ann1",
        f"To: <sip:+15550002222@127.0.0.1>;tag={d.local_tag}",
        f"Call-ID: {d.call_id}",
        f"CSeq: {seq} NOTIFY",
        "Event: refer",
        f"Subscription-State: {state}",
        "Content-Type: message/sipfrag;version=2.0",
        f"Content-Length: {len(frag)}",
    ]
    m = parse_message(("\r\n".join(lines) + "\r\n\r\n" + frag).encode())
    assert isinstance(m, Request)
    return m


class Call:
    def __init__(self, low: int, trunk: Any = OTHER) -> None:
        self.uac, self.transport, self.clock = make_uac(low)
        self.dialog = dialog()
        self.byes = 0
        self.signalling = SipCallSignalling(
            uac=self.uac,
            trunks=(TRUNK, OTHER),
            trunk=trunk,
            label="call CA1",
            dialog=lambda: self.dialog,
            send=lambda r: self.transport.send_request(r, PEER),
            end_call=self.end_call,
            referred_by=f"<{GW_CONTACT.uri}>",
        )

    def end_call(self) -> None:
        self.byes += 1

    async def sent_refer(self, task: asyncio.Task[None]) -> Request:
        for _ in range(100):
            if self.transport.sent:
                break
            await asyncio.sleep(0)
        assert not task.done()
        return self.transport.last("REFER")

    def feed(self, message: Any) -> None:
        assert self.uac.on_message(message, PEER, self.clock.now())


def statuses(transport: FakeTransport) -> list[int]:
    return [s for r, s in transport.responses if r.method == "NOTIFY"]


async def test_refer_success_sends_bye_and_returns() -> None:
    call = Call(46200)
    task = asyncio.create_task(call.signalling.refer("+15550009999", {"X-Case": "7"}))
    refer = await call.sent_refer(task)
    assert refer.headers.get("Refer-To") == "<sip:+15550009999@198.51.100.9?X-Case=7>"
    assert refer.headers.get("Referred-By") == "<sip:appbridge@127.0.0.1:5060>"
    assert refer.call_id == call.dialog.call_id and refer.cseq.seq == 101
    assert refer.to.tag == "ann1" and refer.from_.tag == "gw1"
    call.feed(make_response(refer, 202))
    call.feed(incoming_notify(call.dialog, 11, "SIP/2.0 100 Trying\r\n"))
    await asyncio.sleep(0)
    assert not task.done() and call.byes == 0
    call.feed(
        incoming_notify(call.dialog, 12, "SIP/2.0 200 OK\r\n", "terminated;reason=noresource")
    )
    await asyncio.wait_for(task, 5)
    assert call.byes == 1 and statuses(call.transport) == [200, 200]
    assert not call.uac.refers.active


async def test_refer_failure_keeps_the_call_up() -> None:
    call = Call(46220)
    task = asyncio.create_task(call.signalling.refer("sip:bob@198.51.100.9", None))
    refer = await call.sent_refer(task)
    assert refer.headers.get("Refer-To") == "<sip:bob@198.51.100.9>"
    call.feed(make_response(refer, 202))
    call.feed(incoming_notify(call.dialog, 11, "SIP/2.0 503 Service Unavailable\r\n"))
    with pytest.raises(TransferError) as info:
        await task
    assert info.value.code == "transfer_failed" and "503" in str(info.value)
    assert call.byes == 0 and statuses(call.transport) == [200]


async def test_refer_rejected_and_timer_f() -> None:
    call = Call(46240)
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    refer = await call.sent_refer(task)
    call.feed(make_response(refer, 405))
    with pytest.raises(TransferError, match="405"):
        await task
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    await asyncio.sleep(0)
    assert call.uac.on_timeout(call.transport.last("REFER"), call.clock.now())
    with pytest.raises(TransferError, match="408"):
        await task
    assert call.byes == 0


async def test_no_final_notify_in_virtual_time() -> None:
    call = Call(46260)
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    refer = await call.sent_refer(task)
    call.feed(make_response(refer, 202))
    assert call.uac.next_deadline() == call.clock.now() + NOTIFY_WAIT_S
    call.clock.advance(29.0)
    call.uac.on_timer(call.clock.now())
    await asyncio.sleep(0)
    assert not task.done()
    call.clock.advance(1.0)
    call.uac.on_timer(call.clock.now())
    with pytest.raises(TransferError, match="30 s"):
        await task
    assert call.byes == 0 and call.uac.next_deadline() is None


async def test_out_of_order_notify_is_refused_and_second_refer_is_refused() -> None:
    call = Call(46280)
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    refer = await call.sent_refer(task)
    with pytest.raises(TransferError, match="already in progress"):
        await call.signalling.refer("+15550009999", None)
    call.feed(make_response(refer, 202))
    call.feed(incoming_notify(call.dialog, 15, "SIP/2.0 100 Trying\r\n"))
    call.feed(incoming_notify(call.dialog, 14, "SIP/2.0 200 OK\r\n"))
    assert statuses(call.transport) == [200, 500]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not call.uac.refers.active


async def test_e164_refer_uses_the_first_trunk_without_an_own_trunk() -> None:
    call = Call(46300, trunk=None)
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    refer = await call.sent_refer(task)
    assert refer.headers.get("Refer-To") == f"<sip:+15550009999@{TRUNK.host}:{TRUNK.port}>"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_remote_bye_during_the_refer_fails_it_at_once() -> None:
    call = Call(46320)
    task = asyncio.create_task(call.signalling.refer("+15550009999", None))
    refer = await call.sent_refer(task)
    call.feed(make_response(refer, 202))
    call.uac.refers.abort(call.dialog.call_id, "the call ended during the REFER")
    with pytest.raises(TransferError, match="call ended"):
        await task
    assert call.byes == 0
