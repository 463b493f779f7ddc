"""Outbound calls through Twilio (``POST /v1/calls`` with ``"carrier": "twilio"``;
docs/protocol-twilio.md).

A real gateway on loopback, the fake Twilio REST API (Calls create, status callbacks, the Media
Stream of the answered callee) and a fake app. The callee's behaviour is scripted per called
number (``rest.dialer.callees``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from appbridge.carriers.twilio_outbound import DIAL_TOKEN_PARAM, outbound_for
from appbridge.testing.audio import (
    dominant_freq,
    tone_pcm16,
    ulaw_decode,
    ulaw_encode,
)
from appbridge.testing.fake_twilio import FakeTwilioCall, new_sid, twilio_signature
from appbridge.testing.fake_twilio_outbound import Callee
from tests.integration.conftest import ACCOUNT_SID, API_TOKEN, AUTH_TOKEN, Env

pytestmark = [pytest.mark.timeout(30)]

CALLER = "+15550001111"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _tone_heard(call: FakeTwilioCall, since_bytes: int, freq_hz: float) -> bool:
    heard = call.heard_ulaw()[since_bytes:]
    return len(heard) >= 1600 and abs(dominant_freq(ulaw_decode(heard), 8000) - freq_hz) < 20


async def place(env: Env, to: str, **extra: Any) -> str:
    body = {"app": "main", "to": to, "from": CALLER, "carrier": "twilio", **extra}
    async with httpx.AsyncClient(base_url=env.base_url, headers=AUTH, timeout=10) as http:
        resp = await http.post("/v1/calls", json=body)
    assert resp.status_code == 201, resp.text
    data = resp.json()
    assert data["status"] == "dialing"
    return str(data["callRef"])


async def api(env: Env, method: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.base_url, headers=AUTH, timeout=10) as http:
        return await http.request(method, path)


async def wait_state(env: Env, ref: str, states: set[str], timeout_s: float = 10) -> dict[str, Any]:
    last: dict[str, Any] = {}
    async with asyncio.timeout(timeout_s):
        while True:
            resp = await api(env, "GET", f"/v1/calls/{ref}")
            assert resp.status_code == 200, resp.text
            last = resp.json()
            if last["state"] in states:
                return last
            await asyncio.sleep(0.02)


async def test_answered_call_opens_an_outbound_session_with_audio_both_ways(env: Env) -> None:
    callee = "+15550003333"
    env.rest.dialer.callees[callee] = Callee("answer", after_ms=100)
    ref = await place(env, callee, metadata={"campaign": "spring", "n": 3})
    out = await env.rest.dialer.next_call()
    assert out.call.call_sid == ref  # callRef is the CallSid (docs/protocol-session-v1.md)
    # The create request, as Twilio documents it.
    assert out.param("To") == callee and out.param("From") == CALLER
    assert out.request["StatusCallbackEvent"] == ["initiated", "ringing", "answered", "completed"]
    assert (out.param("StatusCallback") or "").startswith(f"{env.base_url}/twilio/status?dial=")
    assert out.param("Timeout") == "30"
    call = await out.wait_stream()
    assert call.stream_url == env.base_url.replace("http", "ws", 1) + "/twilio/stream"
    assert len(call.params[DIAL_TOKEN_PARAM]) >= 32
    assert (call.params["from"], call.params["to"]) == (CALLER, callee)

    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    assert start["direction"] == "outbound" and start["callRef"] == ref
    assert (start["from"], start["to"]) == (CALLER, callee)
    assert start["metadata"] == {"campaign": "spring", "n": 3}
    # The record went dialing → ringing → answered → active.
    assert [r.status for r in out.callbacks[:3]] == ["initiated", "ringing", "in-progress"]
    assert all(r.http_status == 204 for r in out.callbacks)
    live = await wait_state(env, ref, {"active"})
    assert live["carrier"] == "twilio" and live["sessionRef"] == start["sessionRef"]

    # The callee speaks (400 Hz); the app hears it on the inbound track.
    await call.send_audio_ulaw(ulaw_encode(tone_pcm16(400, 600, 8000)))
    await session.wait_until(lambda: len(session.inbound_audio()) >= 16000, timeout=5)
    assert abs(dominant_freq(session.inbound_audio()[:16000], 16000) - 400) < 20
    # The app speaks (1 kHz, pcm16 16 kHz); the callee hears it.
    await session.send_binary(tone_pcm16(1000, 400, 16000))
    # Whatever silence the leg sent around it, the tone comes to dominate what the callee heard.
    await call.wait_until(lambda: _tone_heard(call, 0, 1000), timeout=5)

    # Hanging up after the answer is the leg's usual REST Status=completed.
    assert (await api(env, "DELETE", f"/v1/calls/{ref}")).status_code == 200
    end = await session.wait_for("session.end", timeout=5)
    assert end["reason"] == "app_hangup"
    await call.wait_closed(timeout=5)
    assert any(r.form.get("Status") == "completed" and ref in r.path for r in env.rest.requests)
    await out.wait_for_status("completed")
    ended = await wait_state(env, ref, {"ended"})
    assert ended["endReason"] == "app_hangup"


async def test_callee_hanging_up_ends_the_session(env: Env) -> None:
    env.rest.dialer.default_callee = Callee("answer", after_ms=20)
    ref = await place(env, "+15550004444")
    out = await env.rest.dialer.next_call()
    call = await out.wait_stream()
    session = await env.app.next_session(timeout=5)
    await session.wait_for("session.start", timeout=5)
    await call.hangup()
    end = await session.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"
    assert (await wait_state(env, ref, {"ended"}))["endReason"] == "caller_hangup"


@pytest.mark.parametrize(
    ("action", "state"), [("busy", "busy"), ("no-answer", "no-answer"), ("failed", "failed")]
)
async def test_unanswered_outcomes_have_no_session(env: Env, action: str, state: str) -> None:
    callee = "+15550005555"
    env.rest.dialer.callees[callee] = Callee(action, after_ms=50)  # type: ignore[arg-type]
    ref = await place(env, callee)
    final = await wait_state(env, ref, {"busy", "no-answer", "failed", "canceled", "ended"})
    assert (final["state"], final["endReason"], final["twilioStatus"]) == (state, state, action)
    assert final["sessionRef"] is None
    assert env.app.sessions == []  # the app is dialed only once the callee answers
    assert (await api(env, "GET", "/v1/calls")).json()["calls"] == []


async def test_no_answer_within_timeout_cancels_the_twilio_call(env: Env) -> None:
    callee = "+15550006666"
    env.rest.dialer.callees[callee] = Callee("ring")
    ref = await place(env, callee, timeout_s=0.5)
    out = await env.rest.dialer.next_call()
    assert out.param("Timeout") == "1"
    final = await wait_state(env, ref, {"no-answer", "failed", "canceled"})
    assert (final["state"], final["endReason"], final["twilioStatus"]) == (
        "no-answer",
        "no-answer",
        None,
    )
    await out.wait_for_status("canceled")
    assert out.status == "canceled"
    assert env.app.sessions == []


async def test_delete_while_ringing_cancels(env: Env) -> None:
    callee = "+15550007777"
    env.rest.dialer.callees[callee] = Callee("ring")
    ref = await place(env, callee)
    out = await env.rest.dialer.next_call()
    await wait_state(env, ref, {"ringing"})
    assert (await api(env, "DELETE", f"/v1/calls/{ref}")).status_code == 200
    await out.wait_for_status("canceled")
    cancels = [r for r in env.rest.requests if r.form.get("Status") == "canceled"]
    assert [r.path.rsplit("/", 1)[-1] for r in cancels] == [f"{ref}.json"]
    final = await wait_state(env, ref, {"canceled"})
    assert final["endReason"] == "canceled"
    assert env.app.sessions == []


async def test_bad_status_callback_signature_changes_nothing(env: Env) -> None:
    callee = "+15550008888"
    env.rest.dialer.callees[callee] = Callee("ring")
    ref = await place(env, callee)
    out = await env.rest.dialer.next_call()
    await wait_state(env, ref, {"ringing"})
    url = out.param("StatusCallback")
    assert url is not None
    form = {"CallSid": ref, "AccountSid": ACCOUNT_SID, "CallStatus": "busy", "SequenceNumber": "9"}
    async with httpx.AsyncClient(timeout=5) as http:
        for signature in ("", twilio_signature("wrong-token", url, form)):
            headers = {"X-Twilio-Signature": signature} if signature else {}
            resp = await http.post(url, data=form, headers=headers)
            assert resp.status_code == 403, resp.text
            assert resp.json()["error"] == "forbidden"
        # Signed, but over another URL (another dial's): refused too.
        other = url.rsplit("=", 1)[0] + "=somethingelse"
        resp = await http.post(
            url,
            data=form,
            headers={"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, other, form)},
        )
        assert resp.status_code == 403
    assert (await api(env, "GET", f"/v1/calls/{ref}")).json()["state"] == "ringing"
    assert env.gw.metrics.bad_signatures >= 3
    # A correctly signed one is taken.
    async with httpx.AsyncClient(timeout=5) as http:
        signed = {"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, url, form)}
        assert (await http.post(url, data=form, headers=signed)).status_code == 204
    final = await wait_state(env, ref, {"busy"})
    assert final["twilioStatus"] == "busy"


async def _open_stream(env: Env, call_sid: str, params: dict[str, str]) -> FakeTwilioCall:
    call = FakeTwilioCall(call_sid=call_sid, account_sid=ACCOUNT_SID, from_=CALLER, to="+1555")
    call.stream_url = env.base_url.replace("http", "ws", 1) + "/twilio/stream"
    call.params = params
    await call._open_stream(env.twilio.dial_url_for(call.stream_url), AUTH_TOKEN)
    return call


async def test_streams_without_a_matching_dial_token_are_refused(env: Env) -> None:
    callee = "+15550009999"
    env.rest.dialer.callees[callee] = Callee("ring")
    ref = await place(env, callee)
    await wait_state(env, ref, {"ringing"})
    # A made-up token, and the dialed CallSid without its token: both closed with 1008.
    for call_sid, params in ((new_sid("CA"), {DIAL_TOKEN_PARAM: "guess"}), (ref, {})):
        stream = await _open_stream(env, call_sid, params)
        try:
            assert await stream.wait_closed(timeout=5) == 1008
        finally:
            await stream.aclose()
    assert (await api(env, "GET", f"/v1/calls/{ref}")).json()["state"] == "ringing"
    assert env.app.sessions == []


async def test_request_checks_for_the_twilio_carrier(env: Env) -> None:
    env.rest.fail_next(400, 21211)
    body = {"app": "main", "to": "+15550001234", "from": CALLER, "carrier": "twilio"}
    async with httpx.AsyncClient(base_url=env.base_url, headers=AUTH, timeout=10) as http:
        resp = await http.post("/v1/calls", json=body)
        assert resp.status_code == 502
        assert resp.json()["error"] == "carrier_error" and "21211" in resp.json()["message"]
        assert (await http.get("/v1/calls")).json()["calls"] == []
    assert len(outbound_for(env.gw)) == 0


async def test_warm_transfer_on_a_twilio_call_dials_a_twilio_party(env: Env) -> None:
    """The engine's warm transfer (calls/transfer.py) through ``TwilioLeg.dial_party``: the party
    is a Twilio call of its own whose stream comes back to the gateway; after
    ``transfer.complete`` the caller and the party hear each other."""
    party_number = "+15550004321"
    env.rest.dialer.callees[party_number] = Callee("answer", after_ms=50)
    caller = await env.twilio.place_call(CALLER, "+15550002222")
    session = await env.app.next_session(timeout=5)
    await session.wait_for("session.start", timeout=5)
    await session.send({"type": "transfer", "id": "w1", "to": party_number, "mode": "warm"})
    out = await env.rest.dialer.next_call()
    assert out.param("From") == "+15550002222"  # the gateway's own side of the call
    party = await out.wait_stream()
    # The consultation: the party's audio reaches the app.
    before = len(session.inbound_audio())
    await party.send_audio_ulaw(ulaw_encode(tone_pcm16(600, 400, 8000)))
    await session.wait_until(lambda: len(session.inbound_audio()) - before >= 9600, timeout=5)
    await session.send({"type": "transfer.complete", "id": "w1"})
    end = await session.wait_for("session.end", timeout=5)
    assert end["reason"] == "transfer"
    # Bridged: the caller's 500 Hz reaches the party.
    heard_before = len(party.heard_ulaw())
    await caller.send_audio_ulaw(ulaw_encode(tone_pcm16(500, 600, 8000)))
    await party.wait_until(lambda: _tone_heard(party, heard_before, 500), timeout=5)
