"""WS /twilio/stream on the WebSocket fast path (appbridge/net/ws_fastpath.py): same
port and behaviour as the ASGI route, other WebSocket routes untouched, and a stream's bad input
or failure ends that stream only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect

from appbridge.carriers.twilio.leg import TwilioLeg
from appbridge.http.uvicorn_server import FASTPATH_ENV
from appbridge.net.ws_fastpath import FastWebSocket
from appbridge.testing.fake_app import FakeSession
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.integration.conftest import Env, gateway_env
from tests.integration.test_session_protocol import connect


async def still_works(session: FakeSession, call: FakeTwilioCall, item: str) -> None:
    """The app's speech reaches this caller as audio, and the caller's audio reaches the app."""
    heard_before = len(call.heard_ulaw())
    await session.send({"type": "speak", "id": item, "text": "Still working."})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == item, timeout=10)
    assert len(call.heard_ulaw()) > heard_before
    assert not session.of_type("session.end")


def _leg(env: Env, call: FakeTwilioCall) -> TwilioLeg:
    live = env.gw.registry.get(call.call_sid)
    assert live is not None and isinstance(live.leg, TwilioLeg)
    return live.leg


@pytest.fixture
async def asgi_env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv(FASTPATH_ENV, "off")
    async with gateway_env() as e:
        yield e


async def test_the_stream_runs_on_the_fast_path_on_the_http_port(env: Env) -> None:
    call, session, start = await connect(env)
    sink = _leg(env, call)._sink
    assert isinstance(sink, FastWebSocket)
    # The socket reads straight into the stream's protocol, past uvicorn and the router.
    assert sink._transport is not None and sink._transport.get_protocol() is sink
    assert start["callRef"] == call.call_sid
    await still_works(session, call, "fast")
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(env.base_url + "/healthz")).status_code == 200
    await call.hangup()
    end = await session.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"


async def test_other_websocket_routes_still_go_through_asgi(env: Env) -> None:
    ws_base = env.base_url.replace("http://", "ws://")
    async with ws_connect(ws_base + "/demo/session", proxy=None) as ws:
        assert ws.response is not None and ws.response.status_code == 101
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with ws_connect(ws_base + "/no/such/route", proxy=None):
            pass
    assert refused.value.response.status_code == 403


async def test_unsigned_upgrade_is_refused_403_on_the_fast_path(env: Env) -> None:
    url = env.base_url.replace("http://", "ws://") + "/twilio/stream"
    before = env.gw.metrics.bad_signatures
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with ws_connect(url, proxy=None, additional_headers={"X-Twilio-Signature": "x"}):
            pass
    assert refused.value.response.status_code == 403
    assert env.gw.metrics.bad_signatures == before + 1


async def test_asgi_route_serves_the_stream_when_the_fast_path_is_off(asgi_env: Env) -> None:
    call, session, _ = await connect(asgi_env)
    assert _leg(asgi_env, call)._sink is None
    await still_works(session, call, "asgi")
    await call.hangup()
    end = await session.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"


async def test_a_vanishing_stream_ends_its_call_and_no_other(env: Env) -> None:
    gone, gone_session, _ = await connect(env)
    kept, kept_session, _ = await connect(env)
    assert gone._ws is not None
    gone._ws.transport.abort()  # no stop, no close frame: the TCP connection just dies
    end = await gone_session.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"
    await still_works(kept_session, kept, "kept")


async def test_oversized_frame_closes_1009_that_stream_only(env: Env) -> None:
    big, big_session, _ = await connect(env)
    other, other_session, _ = await connect(env)
    await big.send_raw("x" * (1024 * 1024 + 1))  # over ws_max_size (1 MiB)
    assert await big.wait_closed(timeout=5) == 1009
    end = await big_session.wait_for("session.end", timeout=5)
    assert end["reason"] == "caller_hangup"
    await still_works(other_session, other, "other")


async def test_bad_utf8_and_binary_frames_are_bad_messages_and_the_call_goes_on(env: Env) -> None:
    call, session, _ = await connect(env)
    before = env.gw.metrics.carrier_bad_messages
    assert call._ws is not None
    # A text frame that is not UTF-8 (sent raw: the client library would refuse to encode it).
    await call._ws.send(b'{"event":"media","media":{"payload":"\xff"}}', text=True)
    await call.send_raw(b"\x00\x01binary")
    await asyncio.sleep(0)
    await still_works(session, call, "after-garbage")
    assert env.gw.metrics.carrier_bad_messages >= before + 2
    assert not call.closed
