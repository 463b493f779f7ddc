"""Browser calls over WebRTC, end to end: the real gateway in-process on loopback, a real
aiortc peer connection as the browser (appbridge/testing/webrtc_browser.py), the fake app.

Both sides offer only 127.0.0.1 as their host candidate (``[webrtc] host_addresses``), so all
media stays on loopback. Every wait polls a condition with a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from appbridge.testing.audio import dominant_freq, goertzel_power, tone_pcm16
from appbridge.testing.fake_app import FakeSession
from appbridge.testing.webrtc_browser import HEARD_RATE_HZ, BrowserPeer
from tests.integration.conftest import API_TOKEN, Env, gateway_env

NUMBER = "+15551230000"
OTHER_NUMBER = "+15551230001"
WEBRTC = {"host_addresses": ["127.0.0.1"]}


def _numbers() -> list[dict[str, str]]:
    return [{"number": NUMBER, "app": "main"}, {"number": OTHER_NUMBER, "app": "main"}]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with gateway_env(webrtc=WEBRTC, numbers=_numbers()) as env:
        yield env


async def _browser_call(
    env: Env, *, codec: str = "opus", tone_hz: float | None = None, **kw: Any
) -> tuple[BrowserPeer, FakeSession, dict[str, Any]]:
    peer = BrowserPeer(env.base_url, token=API_TOKEN, codec=codec, tone_hz=tone_hz)
    resp = await peer.call(**({"to": NUMBER} | kw))
    assert resp.status_code == 201, resp.text
    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    await peer.wait_channel_open()
    return peer, session, start


async def _wait(condition: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - aiortc's state raises no event to wait on
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("codec", ["opus", "PCMU"])
async def test_a_browser_call_carries_audio_both_ways(env: Env, codec: str) -> None:
    peer, session, start = await _browser_call(env, codec=codec, tone_hz=440)
    try:
        assert start["callRef"] == peer.call_ref
        assert (start["from"], start["to"], start["direction"]) == ("browser", NUMBER, "inbound")
        assert codec.lower() in peer.answer["sdp"].lower()  # type: ignore[index]
        rate = start["audio"]["rate"]
        # The browser's tone reaches the app as the caller's audio.
        await session.wait_until(lambda: len(session.audio) >= 40, timeout=10)
        heard_by_app = session.inbound_audio()[-rate:]  # the last 0.5 s
        assert abs(dominant_freq(heard_by_app, rate) - 440) < 25
        # The app's audio reaches the browser.
        await session.send_binary(tone_pcm16(1000, 1500, rate))
        await _wait(lambda: goertzel_power(bytes(peer.heard[-6400:]), HEARD_RATE_HZ, 1000) > 1e5)
        assert abs(dominant_freq(bytes(peer.heard[-6400:]), HEARD_RATE_HZ) - 1000) < 25
        # Only the configured host address is offered (``[webrtc] host_addresses``).
        candidates = [
            line
            for line in peer.answer["sdp"].splitlines()
            if line.startswith("a=candidate")  # type: ignore[index]
        ]
        assert candidates and all(" 127.0.0.1 " in line for line in candidates)
        headers = {"authorization": f"Bearer {API_TOKEN}"}
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            listed = (await client.get("/v1/calls", headers=headers)).json()["calls"]
            one = (await client.get(f"/v1/calls/{peer.call_ref}", headers=headers)).json()
        assert [c["callRef"] for c in listed] == [peer.call_ref]
        assert (one["carrier"], one["from"], one["state"]) == ("webrtc", "browser", "active")
    finally:
        await peer.close()


async def test_dtmf_and_hangup_over_the_data_channel(env: Env) -> None:
    peer, session, _ = await _browser_call(env)
    try:
        peer.send({"type": "dtmf", "digit": "5"})
        peer.send({"type": "dtmf", "digit": "x"})  # refused with a warning, nothing else
        peer.send({"type": "dtmf", "digit": "#"})
        first = await session.wait_for("dtmf", timeout=5)
        await session.wait_until(lambda: len(session.of_type("dtmf")) == 2, timeout=5)
        assert first["digit"] == "5"
        assert [m["digit"] for m in session.of_type("dtmf")] == ["5", "#"]
        peer.send({"type": "hangup"})
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        await _wait(lambda: peer.ended() is not None, 5)
        assert peer.ended() == {"type": "ended", "reason": "caller_hangup"}
    finally:
        await peer.close()


async def test_closing_the_peer_connection_ends_the_call(env: Env) -> None:
    peer, session, _ = await _browser_call(env, codec="PCMU")
    await peer.close()
    end = await session.wait_for("session.end", timeout=10)
    assert end["reason"] == "caller_hangup"
    await _wait(lambda: env.gw.registry.get(peer.call_ref or "") is None, 5)
    assert env.gw.metrics.calls_ended.get("caller_hangup") == 1


async def test_the_app_hanging_up_tells_the_browser(env: Env) -> None:
    peer, session, _ = await _browser_call(env)
    try:
        await session.send({"type": "hangup", "id": "bye"})
        await _wait(lambda: peer.ended() is not None, 5)
        assert peer.ended() == {"type": "ended", "reason": "app_hangup"}
        await _wait(lambda: peer.pc.connectionState == "closed", 10)
    finally:
        await peer.close()


async def test_hold_and_a_refused_transfer(env: Env) -> None:
    peer, session, _ = await _browser_call(env, tone_hz=440)
    try:
        await session.wait_until(lambda: len(session.audio) > 10, timeout=5)
        await session.send({"type": "hold", "id": "h"})
        await asyncio.sleep(0.3)
        frames_at_hold = len(session.audio)
        await session.send({"type": "speak", "id": "s", "text": "no"})
        err = await session.wait_for("error", timeout=5)
        assert (err["code"], err["relatesTo"]) == ("on_hold", "s")
        await asyncio.sleep(0.5)
        assert len(session.audio) <= frames_at_hold + 1  # no caller audio while held
        await session.send({"type": "resume", "id": "r"})
        await session.wait_until(lambda: len(session.audio) > frames_at_hold + 10, timeout=5)
        for mode in ("cold", "warm", "refer"):
            await session.send(
                {"type": "transfer", "id": f"t-{mode}", "to": "+15557654321", "mode": mode}
            )
            err = await session.wait_for(lambda m, i=f"t-{mode}": m.get("relatesTo") == i, 10)
            assert err["code"] == "feature_not_supported", err
        assert not session.closed
    finally:
        await peer.close()


async def test_the_directory_and_calls_by_app(env: Env) -> None:
    headers = {"authorization": f"Bearer {API_TOKEN}"}
    async with httpx.AsyncClient(base_url=env.base_url) as client:
        resp = await client.get("/v1/webrtc/directory", headers=headers)
        assert resp.status_code == 200
        assert resp.json() == {
            "numbers": [
                {"number": NUMBER, "app": "main"},
                {"number": OTHER_NUMBER, "app": "main"},
            ],
            "apps": ["main"],
            "iceServers": [],
        }
    peer, _, start = await _browser_call(env, to=None, app="main")
    try:
        assert start["to"] == NUMBER  # the app's first number
        calls = env.gw.registry.describe(peer.call_ref or "")
        assert calls is not None and calls["carrier"] == "webrtc"
    finally:
        await peer.close()


async def _post(env: Env, body: bytes | dict[str, Any], token: str = API_TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=env.base_url, timeout=20) as client:
        if isinstance(body, dict):
            return await client.post("/v1/webrtc/calls", json=body, headers=headers)
        return await client.post("/v1/webrtc/calls", content=body, headers=headers)


async def test_bad_requests_cost_nothing(env: Env) -> None:
    peer = BrowserPeer(env.base_url)
    offer = await peer.offer()
    await peer.close()
    cases: list[tuple[bytes | dict[str, Any], int, str]] = [
        (b"not json", 400, "bad_request"),
        ({"type": "offer", "sdp": offer}, 400, "bad_request"),  # neither to nor app
        ({"type": "answer", "sdp": offer, "to": NUMBER}, 400, "bad_request"),
        ({"type": "offer", "sdp": "v=0\r\ngarbage\r\n", "to": NUMBER}, 400, "bad_request"),
        ({"type": "offer", "sdp": "\x00" * 100, "to": NUMBER}, 400, "bad_request"),
        ({"type": "offer", "sdp": offer, "app": "nope"}, 404, "not_found"),
        (b"{" + b" " * (70 * 1024) + b"}", 413, "too_large"),
    ]
    for body, status, code in cases:
        resp = await _post(env, body)
        assert (resp.status_code, resp.json()["error"]) == (status, code), (body, resp.text)
    assert len(env.gw.registry) == 0
    assert env.gw.metrics.calls_ended == {}
    assert env.app.sessions == []  # no app was dialled


async def test_admission_refusal_is_503(env: Env) -> None:
    rejected = env.gw.registry.total_rejected
    peer = BrowserPeer(env.base_url, token=API_TOKEN)
    try:
        env.gw.draining = True
        resp = await peer.call(to=NUMBER)
        assert (resp.status_code, resp.json()["error"]) == (503, "unavailable")
        assert env.gw.registry.total_rejected == rejected + 1
    finally:
        env.gw.draining = False
        await peer.close()


async def test_a_number_no_app_answers_is_404() -> None:
    numbers = [{"number": NUMBER, "app": "main"}]
    async with gateway_env(webrtc=WEBRTC, numbers=numbers) as env:
        peer = BrowserPeer(env.base_url, token=API_TOKEN)
        try:
            resp = await peer.call(to="+15550009999")
            assert (resp.status_code, resp.json()["error"]) == (404, "not_found")
        finally:
            await peer.close()


async def test_an_unreachable_app_is_502() -> None:
    async with gateway_env(webrtc=WEBRTC, numbers=_numbers()) as env:
        await env.app.stop()
        peer = BrowserPeer(env.base_url, token=API_TOKEN)
        try:
            resp = await peer.call(to=NUMBER)
            assert (resp.status_code, resp.json()["error"]) == (502, "app_unreachable")
            assert env.gw.metrics.calls_ended.get("error") == 1
            assert len(env.gw.registry) == 0
        finally:
            await peer.close()


async def test_beyond_loopback_the_routes_need_a_token() -> None:
    """The pages' rule (docs/operations.md, "The console and the softphone"): a gateway that
    listens beyond loopback takes a token of ``[api] tokens`` (or the login's cookie)."""
    async with gateway_env(
        webrtc=WEBRTC, numbers=_numbers(), server_extra={"host": "0.0.0.0"}
    ) as env:
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            refused = await client.get("/v1/webrtc/directory")
            assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
            headers = {"authorization": f"Bearer {API_TOKEN}"}
            assert (await client.get("/v1/webrtc/directory", headers=headers)).status_code == 200
        peer = BrowserPeer(env.base_url)
        offer = await peer.offer()
        await peer.close()
        wrong = await _post(env, {"type": "offer", "sdp": offer, "to": NUMBER}, "x")
        assert wrong.status_code == 401
        assert len(env.gw.registry) == 0 and not env.app.sessions


async def test_offers_being_worked_on_are_bounded() -> None:
    """While one offer waits for its app (refused, retried through the dial window), a second
    beyond ``max_pending_offers`` is refused at once; the first then ends as 502."""
    webrtc = {**WEBRTC, "max_pending_offers": 1}
    async with gateway_env(webrtc=webrtc, numbers=_numbers()) as env:
        env.app.refuse = True
        first = BrowserPeer(env.base_url, token=API_TOKEN)
        second = BrowserPeer(env.base_url, token=API_TOKEN)
        try:
            pending = asyncio.ensure_future(first.call(to=NUMBER))
            await _wait(lambda: len(env.gw.registry) == 1, 5)
            resp = await second.call(to=NUMBER)
            assert (resp.status_code, resp.json()["error"]) == (503, "unavailable")
            assert "too many" in resp.json()["message"]
            assert (await pending).status_code == 502
        finally:
            await first.close()
            await second.close()


async def _hang(*_args: Any) -> Any:
    await asyncio.Event().wait()


async def test_sdp_work_past_its_deadline_is_503_and_holds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDP work of one offer has ``SDP_TIMEOUT_S`` (docs/webrtc.md, "Limits"): an offer
    that takes longer to apply dials no app; an answer that takes longer ends its call before it
    is answered, so the app's socket closes before ``session.start``. Neither holds a place of
    ``max_pending_offers``: a third offer is answered."""
    from appbridge.carriers.webrtc import signalling

    monkeypatch.setattr(signalling, "SDP_TIMEOUT_S", 0.3)
    webrtc = {**WEBRTC, "max_pending_offers": 1}
    async with gateway_env(webrtc=webrtc, numbers=_numbers()) as env:
        peers = [BrowserPeer(env.base_url, token=API_TOKEN) for _ in range(3)]
        try:
            with monkeypatch.context() as patch:
                patch.setattr(signalling.WebRtcCalls, "_apply_offer", _hang)
                resp = await peers[0].call(to=NUMBER)
            assert (resp.status_code, resp.json()["error"]) == (503, "unavailable")
            assert "too long to apply" in resp.json()["message"]
            assert env.app.sessions == [] and len(env.gw.registry) == 0
            with monkeypatch.context() as patch:
                patch.setattr(signalling.WebRtcCalls, "_answer", _hang)
                resp = await peers[1].call(to=NUMBER)
            assert (resp.status_code, resp.json()["error"]) == (503, "unavailable")
            assert "answer took too long" in resp.json()["message"]
            session = await env.app.next_session(timeout=5)
            # The call was never answered, so the app's socket closes before any session.start.
            await _wait(lambda: session.closed, 5)
            assert session.messages == []
            await _wait(lambda: len(env.gw.registry) == 0, 5)
            assert env.gw.metrics.calls_ended.get("error") == 1
            assert (await peers[2].call(to=NUMBER)).status_code == 201
        finally:
            for peer in peers:
                await peer.close()
