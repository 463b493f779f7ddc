"""Twilio-placed calls: the :class:`DialProgress` core in virtual time, and ``dial_party``'s
outcomes (answered, busy, timeout, cancel) with Twilio's REST API mocked at the HTTP layer."""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.twilio.leg import TwilioLeg
from appbridge.carriers.twilio_outbound import (
    DIAL_TOKEN_PARAM,
    REFUSED,
    DialProgress,
    TwilioOutbound,
    claim_outbound_stream,
    outbound_for,
)
from appbridge.clock import VirtualClock
from appbridge.config import parse_config
from appbridge.gateway import Gateway
from appbridge.protocol.twilio_streams import TwilioStartInfo

ACCOUNT = "AC" + "2" * 32
PARTY_SID = "CA" + "b" * 32
INBOUND_SID = "CA" + "a" * 32
PARTY = "+15550002222"
CALLER_ID = "+15550001111"


# -- the core ---------------------------------------------------------------------------------


def test_progress_moves_forward_only_and_ignores_stale_callbacks() -> None:
    p = DialProgress(started_s=100.0, timeout_s=30.0)
    assert p.deadline_s == 130.0
    assert p.on_status("initiated", 0) == "none"
    assert p.on_status("ringing", 1) == "ringing" and p.phase == "ringing"
    assert p.on_status("in-progress", 3) == "answered" and p.deadline_s is None
    assert p.on_status("ringing", 2) == "none" and p.phase == "answered"  # overtaken
    assert p.on_status("in-progress", 3) == "none"  # a duplicate
    assert p.on_stream() is True
    assert p.on_stream() is False  # a second stream for one dial
    assert p.on_status("completed", 4) == "remote_hangup" and p.phase == "ended"
    assert p.outcome is None


@pytest.mark.parametrize("status", ["busy", "no-answer", "failed", "canceled"])
def test_final_status_before_answer_is_the_outcome(status: str) -> None:
    p = DialProgress(started_s=0.0, timeout_s=30.0)
    p.on_status("ringing")
    assert p.on_status(status) == "outcome"
    assert (p.outcome, p.twilio_status, p.phase) == (status, status, "ended")
    assert p.on_stream() is False  # a stream after the end is refused
    assert p.give_up("canceled") is None  # nothing left to end at Twilio


def test_deadline_in_virtual_time_then_late_answer() -> None:
    clock = VirtualClock()
    p = DialProgress(started_s=clock.now(), timeout_s=30.0)
    clock.advance(29.999)
    assert not p.deadline_passed(clock.now())
    clock.advance(0.001)
    assert p.deadline_passed(clock.now())
    assert p.give_up("no-answer") == "canceled"
    assert (p.outcome, p.twilio_status) == ("no-answer", None)
    assert p.on_status("in-progress") == "late_answer"  # the answer crossed our cancel
    assert p.on_status("no-answer") == "none"  # the outcome stays ours


def test_give_up_after_answer_completes() -> None:
    p = DialProgress(started_s=0.0, timeout_s=30.0)
    assert p.on_stream() is True and p.phase == "answered"
    assert p.give_up("canceled") == "completed"
    assert p.outcome is None


# -- dial_party, with Twilio's REST API mocked ----------------------------------------------------


@dataclass
class FakeApi:
    """Twilio's REST API at the HTTP layer: Calls create (201) and call updates (200)."""

    requests: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    create_status: int = 201

    def handler(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode(), keep_blank_values=True)
        self.requests.append((request.url.path, form))
        assert request.headers["authorization"].startswith("Basic ")
        if request.url.path.endswith("/Calls.json"):
            if self.create_status != 201:
                body = {"code": 21211, "message": "Invalid 'To' Phone Number", "status": 400}
                return httpx.Response(self.create_status, json=body)
            return httpx.Response(201, json={"sid": PARTY_SID, "status": "queued"})
        return httpx.Response(200, json={"sid": PARTY_SID, "status": "canceled"})

    def updates(self) -> list[str]:
        return [form["Status"][0] for path, form in self.requests if "Status" in form]


@dataclass
class Rig:
    gw: Gateway
    api: FakeApi
    outbound: TwilioOutbound
    leg: TwilioLeg
    clock: VirtualClock
    sent: list[dict[str, Any]]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    config = parse_config(
        {
            "server": {"host": "127.0.0.1", "port": 8080, "public_url": "https://gw.example/pfx"},
            "carriers": {
                "twilio": {
                    "account_sid": ACCOUNT,
                    "auth_token": "tok",
                    "api_base": "https://api.twilio.test",
                }
            },
            "apps": [{"ref": "main", "url": "ws://127.0.0.1:9/app", "signing_secret": "s"}],
            "numbers": [{"number": "*", "app": "main"}],
        },
        {},
    )
    api = FakeApi()
    clock = VirtualClock()
    gw = Gateway(
        config, clock=clock, http=httpx.AsyncClient(transport=httpx.MockTransport(api.handler))
    )
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    outbound = outbound_for(gw)
    leg = TwilioLeg(send, "MZ" + "1" * 32, INBOUND_SID, gw.twilio_rest, outbound=outbound)
    try:
        yield Rig(gw, api, outbound, leg, clock, sent)
    finally:
        await gw.http.aclose()


async def _until(condition: Any) -> None:
    """Let the loop run (no real time passes) until ``condition()`` holds."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def _start_dial(rig: Rig, timeout_s: float = 30.0) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(
        rig.leg.dial_party(PARTY, caller_id=CALLER_ID, headers=None, timeout_s=timeout_s)
    )
    await _until(lambda: rig.outbound.dial_for_sid(PARTY_SID) is not None)
    return task


def _created(rig: Rig) -> dict[str, list[str]]:
    creates = [form for path, form in rig.api.requests if path.endswith("/Calls.json")]
    assert len(creates) == 1
    return creates[0]


def _start_info(token: str, call_sid: str = PARTY_SID) -> TwilioStartInfo:
    return TwilioStartInfo(
        account_sid=ACCOUNT,
        stream_sid="MZ" + "9" * 32,
        call_sid=call_sid,
        custom_parameters={DIAL_TOKEN_PARAM: token},
    )


async def _noop_send(message: dict[str, Any]) -> None:
    return None


async def test_answered_party_resolves_with_its_stream_leg(rig: Rig) -> None:
    task = await _start_dial(rig)
    form = _created(rig)
    assert (form["To"], form["From"], form["Timeout"]) == ([PARTY], [CALLER_ID], ["30"])
    assert form["StatusCallbackEvent"] == ["initiated", "ringing", "answered", "completed"]
    assert form["StatusCallback"][0].startswith("https://gw.example/pfx/twilio/status?dial=")
    stream = ET.fromstring(form["Twiml"][0]).find("Connect/Stream")
    assert stream is not None and stream.get("url") == "wss://gw.example/pfx/twilio/stream"
    params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    token = params[DIAL_TOKEN_PARAM]
    assert token and len(token) >= 32
    d = rig.outbound.dial_for_sid(PARTY_SID)
    assert d is not None
    assert rig.outbound.on_status(d.dial_id, {"CallSid": PARTY_SID, "CallStatus": "ringing"})
    # Another call's sid on this dial's callback changes nothing.
    assert not rig.outbound.on_status(d.dial_id, {"CallSid": INBOUND_SID, "CallStatus": "busy"})
    await asyncio.sleep(0)
    assert not task.done()
    # A stream with a made-up token is refused; the right one resolves the dial.
    assert claim_outbound_stream(rig.gw, _start_info("guess"), _noop_send) is REFUSED
    claimed = claim_outbound_stream(rig.gw, _start_info(token), _noop_send)
    assert isinstance(claimed, TwilioLeg)
    party = await task
    assert party is claimed and party.call_sid == PARTY_SID
    assert party.native_cold_transfer is True
    assert rig.api.updates() == []
    # A second stream for the same dial is refused.
    assert claim_outbound_stream(rig.gw, _start_info(token), _noop_send) is REFUSED


async def test_busy_party_is_transfer_failed(rig: Rig) -> None:
    task = await _start_dial(rig)
    d = rig.outbound.dial_for_sid(PARTY_SID)
    assert d is not None
    rig.outbound.on_status(d.dial_id, {"CallSid": PARTY_SID, "CallStatus": "busy"})
    with pytest.raises(TransferError) as info:
        await task
    assert info.value.code == "transfer_failed" and "busy" in str(info.value)
    assert rig.api.updates() == []  # Twilio ended it; nothing to cancel


async def test_no_answer_within_timeout_cancels_and_fails(rig: Rig) -> None:
    task = await _start_dial(rig, timeout_s=20.0)
    d = rig.outbound.dial_for_sid(PARTY_SID)
    assert d is not None and d.timer is not None
    rig.clock.advance(19.0)
    rig.outbound._on_deadline(d)  # the timer fired early against the injected clock: re-armed
    assert not task.done() and d.timer is not None
    rig.clock.advance(1.0)
    rig.outbound._on_deadline(d)
    with pytest.raises(TransferError) as info:
        await task
    assert info.value.code == "transfer_failed" and "no answer" in str(info.value)
    await _until(lambda: rig.api.updates() == ["canceled"])
    # The answer that crosses our cancel gets its stream refused and the call completed.
    token = d.token
    assert claim_outbound_stream(rig.gw, _start_info(token), _noop_send) is REFUSED
    await _until(lambda: rig.api.updates() == ["canceled", "completed"])


async def test_cancelled_dial_cancels_the_twilio_call(rig: Rig) -> None:
    task = await _start_dial(rig)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: rig.api.updates() == ["canceled"])
    assert rig.api.requests[-1][0].endswith(f"/Calls/{PARTY_SID}.json")


async def test_twilio_refusing_the_call_is_transfer_failed(rig: Rig) -> None:
    rig.api.create_status = 400
    with pytest.raises(TransferError) as info:
        await rig.leg.dial_party(PARTY, caller_id=CALLER_ID, headers=None, timeout_s=30)
    assert info.value.code == "transfer_failed" and "21211" in str(info.value)


async def test_refer_and_bad_targets(rig: Rig) -> None:
    with pytest.raises(TransferError) as info:
        await rig.leg.refer("sip:bob@trunk.example", None)
    assert info.value.code == "feature_not_supported" and "REFER" in str(info.value)
    for target in ("sip:bob@trunk.example", "12345"):
        with pytest.raises(TransferError) as info:
            await rig.leg.dial_party(target, caller_id=CALLER_ID, headers=None, timeout_s=30)
        assert info.value.code == "transfer_failed"
    assert rig.api.requests == []


async def test_stream_of_a_dialed_sid_without_token_is_refused(rig: Rig) -> None:
    task = await _start_dial(rig)
    info = TwilioStartInfo(account_sid=ACCOUNT, stream_sid="MZ" + "8" * 32, call_sid=PARTY_SID)
    assert claim_outbound_stream(rig.gw, info, _noop_send) is REFUSED
    # An unrelated inbound stream is not this module's business.
    other = TwilioStartInfo(account_sid=ACCOUNT, stream_sid="MZ" + "7" * 32, call_sid=INBOUND_SID)
    assert claim_outbound_stream(rig.gw, other, _noop_send) is None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
