"""Browser calls over WebRTC, end to end: the real gateway in-process on loopback, a real
aiortc peer connection as the browser (appbridge/carriers/webrtc/browser.py), the fake app.

Both sides offer only 127.0.0.1 as their host candidate (``[webrtc] host_addresses``), so all
media stays on loopback. Every wait polls a condition with a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from appbridge.carriers.webrtc.browser import HEARD_RATE_HZ, BrowserPeer
from appbridge.testing.audio import dominant_freq, goertzel_power, tone_pcm16
from appbridge.testing.fake_app import FakeSession
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
        listed = env.gw.registry.describe(peer.call_ref or "")
        assert listed is not None and listed["carrier"] == "webrtc"
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
