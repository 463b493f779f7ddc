"""How calls begin and end on Twilio: hang-ups, retries, fallbacks, the REST API."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import socket

import httpx
import pytest
import websockets

from appbridge.config import AppConfig
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio, twilio_signature
from tests.integration.conftest import ACCOUNT_SID, API_TOKEN, SECRET, Env, gateway_env
from tests.integration.test_session_protocol import connect


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def test_app_hangup_ends_the_call_through_twilio_rest(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.send({"type": "hangup", "id": "bye"})
    end = await session.wait_for("session.end", timeout=5)
    assert end == {"type": "session.end", "reason": "app_hangup", "id": "bye"}
    await session.wait_closed(timeout=5)
    await call.wait_closed(timeout=5)
    completed = [r for r in env.rest.requests if r.form.get("Status") == "completed"]
    assert completed and completed[0].auth_ok
    assert completed[0].path.endswith(f"/Calls/{call.call_sid}.json")
    assert env.gw.registry.describe(call.call_sid)["endReason"] == "app_hangup"  # type: ignore[index]


async def test_caller_hangup_sends_session_end(env: Env) -> None:
    call, session, _ = await connect(env)
    await call.hangup()
    end = await session.wait_for("session.end", timeout=5)
    assert end == {"type": "session.end", "reason": "caller_hangup"}
    await session.wait_closed(timeout=5)
    assert not [r for r in env.rest.requests if r.form.get("Status") == "completed"]


async def test_a_stream_that_vanishes_ends_only_its_own_call(env: Env) -> None:
    call1, session1, _ = await connect(env)
    _call2, session2, _ = await connect(env)
    assert call1._ws is not None
    call1._ws.transport.abort()  # no stop, no close frame: the peer just vanishes
    end = await session1.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"
    await session2.send({"type": "speak", "id": "still", "text": "Still here."})
    await session2.wait_for("output.done", timeout=10)
    assert not session2.of_type("session.end")


async def test_the_app_closing_its_socket_hangs_up(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.close()
    await call.wait_closed(timeout=5)
    await asyncio.sleep(0.1)
    assert [r for r in env.rest.requests if r.form.get("Status") == "completed"]
    assert env.gw.registry.get(call.call_sid) is None


async def test_retry_window_connects_an_app_that_comes_up_late(env: Env) -> None:
    env.app.refuse = True

    async def come_back() -> None:
        await asyncio.sleep(1.0)
        await env.app.listen_again()

    task = asyncio.create_task(come_back())
    call, _session, start = await connect(env)
    await task
    assert start["callRef"] == call.call_sid


async def test_unreachable_app_with_a_message_fallback_speaks_then_hangs_up() -> None:
    def apps(app: FakeApp) -> list[dict[str, object]]:
        return [
            {
                "ref": "down",
                "url": f"ws://127.0.0.1:{closed_port()}/x",
                "fallback": {"message": "Sorry, we are closed."},
            }
        ]

    async with gateway_env(apps) as env:
        call = await env.twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
        assert call.webhook_status == 200 and call.has_stream
        await call.wait_closed(timeout=15)
        assert len(call.heard_ulaw()) > 8000  # over a second of speech
        assert [r for r in env.rest.requests if r.form.get("Status") == "completed"]


async def test_unreachable_app_falls_back_to_another_app() -> None:
    def apps(app: FakeApp) -> list[dict[str, object]]:
        return [
            {
                "ref": "down",
                "url": f"ws://127.0.0.1:{closed_port()}/x",
                "fallback": {"app": "overflow"},
            },
            {"ref": "overflow", "url": app.url, "signing_secret": SECRET},
        ]

    async with gateway_env(apps) as env:
        _call, _session, start = await connect(env)
        assert start["appRef"] == "overflow"


async def test_unreachable_app_without_fallback_gets_hangup_twiml() -> None:
    def apps(app: FakeApp) -> list[dict[str, object]]:
        return [{"ref": "down", "url": f"ws://127.0.0.1:{closed_port()}/x"}]

    async with gateway_env(apps) as env:
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        assert call.webhook_status == 200
        assert "Hangup" in call.twiml_verbs and not call.has_stream


async def test_unrouted_number_is_told_and_hung_up() -> None:
    async with gateway_env(numbers=[{"number": "+15559990000", "app": "main"}]) as env:
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        assert call.webhook_status == 200
        assert call.twiml_verbs[:2] == ["Say", "Hangup"]
        routed = await env.twilio.place_call("+15550001111", "+15559990000")
        assert routed.has_stream


async def test_bad_twilio_signatures_are_refused(env: Env) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.post(
            env.base_url + "/twilio/voice",
            data={"CallSid": "CA" + "0" * 32, "From": "+1", "To": "+2"},
            headers={"X-Twilio-Signature": "bm9wZQ=="},
        )
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
    forged = FakeTwilio(env.base_url, account_sid=ACCOUNT_SID, auth_token="wrong-token")
    call = await forged.place_call("+15550001111", "+15550002222")
    assert call.webhook_status == 403 and not call.has_stream
    # The Media Stream upgrade is checked too.
    ws_url = env.base_url.replace("http://", "ws://") + "/twilio/stream"
    for headers in ({}, {"x-twilio-signature": twilio_signature("wrong-token", ws_url)}):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(ws_url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 403
    assert env.gw.metrics.bad_signatures >= 3


async def test_v1_calls_api(env: Env) -> None:
    call, session, _ = await connect(env)
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    async with httpx.AsyncClient(base_url=env.base_url) as client:
        r = await client.get("/v1/calls")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        r = await client.get("/v1/calls", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = await client.get("/v1/calls", headers=auth)
        assert r.status_code == 200
        listed = r.json()["calls"]
        assert [c["callRef"] for c in listed] == [call.call_sid]
        assert set(listed[0]) == {
            "callRef",
            "sessionRef",
            "app",
            "direction",
            "from",
            "to",
            "started",
            "state",
        }
        r = await client.get(f"/v1/calls/{call.call_sid}", headers=auth)
        assert r.json()["state"] == "active"
        r = await client.delete(f"/v1/calls/{call.call_sid}", headers=auth)
        assert r.status_code == 200
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "app_hangup"
        r = await client.get(f"/v1/calls/{call.call_sid}", headers=auth)
        assert r.json()["state"] == "ended" and r.json()["endReason"] == "app_hangup"
        r = await client.delete(f"/v1/calls/{call.call_sid}", headers=auth)
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        r = await client.get("/v1/calls/CAnope", headers=auth)
        assert r.status_code == 404


async def test_health_readiness_metrics_and_json_errors(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.base_url) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert "appbridge_calls_live 0" in metrics
        assert "appbridge_media_tick_lateness_ms_bucket" in metrics
        for name in ("full", "early", "deep"):  # the paced collections (media/gc_pacer.py)
            assert f"\nappbridge_gc_{name}_passes_total " in metrics
        r = await client.get("/nope")
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        r = await client.put("/healthz")
        assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
        env.gw.draining = True
        assert (await client.get("/readyz")).status_code == 503
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        assert "Reject" in call.twiml_verbs
        env.gw.draining = False


async def test_reload_rotates_the_secret_for_new_calls_only(env: Env) -> None:
    _call1, session1, _ = await connect(env)
    new_secret = "rotated-secret"
    app = dataclasses.replace(env.gw.config.apps["main"], signing_secret=new_secret)
    env.gw.reload(dataclasses.replace(env.gw.config, apps={"main": app}))
    env.app.secret = new_secret
    _call2, session2, _ = await connect(env)
    await session1.send({"type": "speak", "id": "old", "text": "Old call goes on."})
    await session1.wait_for("output.done", timeout=10)
    assert session2.headers["x-fonoster-signature"] != session1.headers["x-fonoster-signature"]


async def test_a_rotated_secret_signs_what_a_live_call_dials_next(env: Env) -> None:
    """A rotated secret takes effect immediately (docs/operations.md, "Signals"). A call that began
    under the old secret and then dials (a handoff here; also a fallback, an answered outbound call,
    listeners) signs with the new one, which the app already checks."""
    second = FakeApp(secret=SECRET)
    await second.start()
    try:
        apps = dict(env.gw.config.apps)
        apps["second"] = AppConfig(ref="second", url=second.url, signing_secret=SECRET)
        env.gw.reload(dataclasses.replace(env.gw.config, apps=apps))
        call, first, _ = await connect(env)
        new_secret = "rotated-secret"
        apps["second"] = dataclasses.replace(apps["second"], signing_secret=new_secret)
        env.gw.reload(dataclasses.replace(env.gw.config, apps=apps))
        second.secret = new_secret
        await first.send({"type": "handoff", "id": "ho", "app": "second", "payload": {}})
        await first.wait_for("session.end", timeout=10)
        session2 = await second.next_session(timeout=10)
        await session2.wait_for("session.start", timeout=5)
        ts = session2.headers["x-fonoster-timestamp"]
        expected = hmac.new(new_secret.encode(), f"{ts}.{second.url}".encode(), hashlib.sha256)
        assert session2.headers["x-fonoster-signature"] == expected.hexdigest()
        assert not call.closed
    finally:
        await second.stop()


async def test_calls_are_refused_above_the_cpu_limit() -> None:
    async with gateway_env(server_extra={"max_cpu_percent": 80}) as env:
        assert env.gw._cpu_task is not None
        env.gw._cpu_task.cancel()  # the test feeds the meter itself
        env.gw.cpu = type(env.gw.cpu)()
        env.gw.cpu.sample(0.0, 0.0)
        env.gw.cpu.sample(1.0, 0.95)  # 95 % of a core
        refused = await env.twilio.place_call("+15550001111", "+15550002222")
        assert "Reject" in refused.twiml_verbs and not refused.has_stream
        env.gw.cpu.sample(6.0, 1.2)  # the load fell to 5 %
        env.gw.cpu.sample(7.0, 1.25)
        call, _session, _ = await connect(env)
        assert call.has_stream
        assert env.gw.registry.total_rejected == 1
