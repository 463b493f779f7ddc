from __future__ import annotations

from tests.integration.conftest import SECRET, Env


async def test_a_call_reaches_the_app_and_hears_speech(env: Env) -> None:
    call = await env.twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
    assert call.webhook_status == 200, call.twiml
    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    assert start["from"] == "+15550001111"
    assert session.headers["x-fonoster-signature"]
    await session.send({"type": "speak", "id": "s1", "text": "Hello there, caller."})
    done = await session.wait_for("output.done", timeout=10)
    assert done["id"] == "s1"
    assert len(call.heard_ulaw()) > 8000
    await session.send({"type": "hangup", "id": "h1"})
    end = await session.wait_for("session.end", timeout=5)
    assert end == {"type": "session.end", "reason": "app_hangup", "id": "h1"}
    await call.wait_closed(timeout=5)
    assert SECRET
