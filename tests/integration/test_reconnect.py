"""Reconnecting app links (docs/protocol-session-v1.md, "Reconnecting"), end to end.

The gateway runs in-process and the caller is the fake Twilio carrier or sipp; the app is the
plain FakeApp (its frames by hand), or a real SDK app process that is killed with SIGKILL and
started again on the same port with its state in a JSON file. Waits poll for a condition with a
bound; none asserts how fast something happened.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.testing.fake_app import FakeApp, FakeSession
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.integration.conftest import API_TOKEN, SECRET, Env, gateway_env

REPO = Path(__file__).resolve().parents[2]
SENTENCE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
SORRY = "Sorry, the assistant is unavailable. Goodbye."


def with_fallback(app: FakeApp) -> list[dict[str, Any]]:
    return [
        {
            "ref": "main",
            "url": app.url,
            "signing_secret": SECRET,
            "fallback": {"message": SORRY},
        }
    ]


async def connect(env: Env) -> tuple[FakeTwilioCall, FakeSession, dict[str, Any]]:
    call = await env.twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
    assert call.webhook_status == 200, call.twiml
    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    return call, session, start


async def heard_grows(call: FakeTwilioCall, by_bytes: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    before = len(call.heard_ulaw())
    await call.wait_until(lambda: len(call.heard_ulaw()) >= before + by_bytes, timeout=timeout)


# --- the plain FakeApp path ------------------------------------------------------------------


async def test_a_lost_link_is_redialled_and_taken_back_with_events_lost() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, start = await connect(env)
        assert "reconnect" not in start  # absent on every normal start
        await first.set_reconnect(True)
        await first.send({"type": "speak", "id": "long", "text": SENTENCE})
        await first.wait_for("output.started", timeout=10)
        env.app.refuse = True  # the first attempts fail: events pile up meanwhile
        await first.close()
        await call.send_dtmf("5")  # an event for the app while it is away
        await asyncio.sleep(0.3)
        env.app.refuse = False
        second = await env.app.next_session(timeout=10)
        again = await second.wait_for("session.start", timeout=5)
        assert again["sessionRef"] == start["sessionRef"]
        assert again["callRef"] == start["callRef"]
        info = again["reconnect"]
        assert info["attempt"] >= 2 and info["downMs"] >= 300
        await heard_grows(call, 4000)  # the caller keeps hearing what was queued
        await second.set_reconnect(True)
        lost = await second.wait_for("events.lost", timeout=5)
        assert lost["count"] >= 1  # at least the keypress
        assert not second.of_type("dtmf")  # dropped, never delivered late
        await second.send({"type": "speak", "id": "after", "text": "We are back."})
        await second.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "after", 15)
        await call.send_dtmf("7")
        dtmf = await second.wait_for("dtmf", timeout=5)
        assert dtmf["digit"] == "7"


async def test_an_app_that_answers_otherwise_sends_the_call_to_its_fallback() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.close()
        second = await env.app.next_session(timeout=10)
        assert (await second.wait_for("session.start", timeout=5))["reconnect"]["attempt"] == 1
        await second.send({"type": "speak", "text": "I do not know this session."})
        await call.wait_closed(timeout=20)
        assert len(call.heard_ulaw()) > 8000  # the fallback message was spoken
        assert not second.of_type("events.lost")


async def test_reconnect_false_and_the_last_word_turn_reconnecting_off() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.set_reconnect(False)
        await first.close()
        await call.wait_closed(timeout=10)

        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.send({"type": "handoff", "app": "nowhere", "id": "h"})  # refused, but said
        await first.wait_for("error", timeout=5)
        await first.set_reconnect(True)  # too late: off for the rest of the session
        await first.close()
        await call.wait_closed(timeout=10)
        with pytest.raises(TimeoutError):
            await env.app.next_session(timeout=1)


async def test_an_api_hangup_between_links_ends_the_call_at_once() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        env.app.refuse = True
        await first.close()
        auth = {"Authorization": f"Bearer {API_TOKEN}"}
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            r = await client.delete(f"/v1/calls/{call.call_sid}", headers=auth)
            assert r.status_code == 200
        await call.wait_closed(timeout=5)
        env.app.refuse = False
        with pytest.raises(TimeoutError):
            await env.app.next_session(timeout=1)
