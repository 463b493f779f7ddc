"""The call console's API against a real gateway and a real (fake) app and Twilio stream:
the live list, a call's timeline of messages, audio, levels and state, the hang-up, the ended
list; and the guard when the gateway listens beyond loopback (docs/operations.md, "The console
and the softphone")."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.integration.conftest import API_TOKEN, SECRET, Env, gateway_env


async def _poll(check: Any, within_s: float = 5.0) -> Any:
    """``check()``'s first truthy answer, asked every 50 ms for at most ``within_s``."""
    async with asyncio.timeout(within_s):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)


async def test_console_lists_a_call_and_its_timeline(env: Env) -> None:
    call = await env.twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
    session = await env.app.next_session(timeout=5)
    await session.wait_for("session.start", timeout=5)
    await session.send({"type": "speak", "id": "s1", "text": "Hello there, caller."})
    await session.wait_for("output.done", timeout=10)
    async with httpx.AsyncClient(base_url=env.base_url) as http:
        listing = (await http.get("/v1/console/calls")).json()
        assert len(listing["live"]) == 1
        row = listing["live"][0]
        call_ref = row["callRef"]
        assert row["carrier"] == "twilio" and row["from"] == "+15550001111"
        assert row["to"] == "+15550002222" and row["state"] == "active"
        assert row["app"] == "main" and row["startedAt"].endswith("Z")

        async def audio_seen() -> Any:
            page = (await http.get(f"/v1/console/calls/{call_ref}/timeline")).json()
            kinds = {(e["kind"], e["dir"]) for e in page["entries"]}
            want = {("audio", "caller_in"), ("audio", "to_app"), ("audio", "caller_out")}
            return page if want <= kinds and ("level", None) in kinds else None

        page = await _poll(audio_seen)
        assert page["live"] is True and page["callRef"] == call_ref
        messages = [e for e in page["entries"] if e["kind"] == "message"]
        start = next(e for e in messages if e["type"] == "session.start")
        assert start["dir"] == "to_app" and start["data"]["callRef"] == call_ref
        speak = next(e for e in messages if e["type"] == "speak")
        assert speak["dir"] == "from_app" and speak["data"]["text"] == "Hello there, caller."
        states = [e["type"] for e in page["entries"] if e["kind"] == "state"]
        assert states[:1] == ["dialing"] and "active" in states
        levels = [e["data"] for e in page["entries"] if e["kind"] == "level"]
        assert all(set(level) == {"in_dbfs", "out_dbfs"} for level in levels)
        # The speech played to the caller shows; the fake carrier's silence stays at the floor.
        assert max(level["out_dbfs"] for level in levels) > -40
        assert max(level["in_dbfs"] for level in levels) == -100
        seqs = [e["seq"] for e in page["entries"]]
        assert seqs == sorted(seqs) and page["next"] == seqs[-1]
        later = (await http.get(f"/v1/console/calls/{call_ref}/timeline?after={seqs[-1]}")).json()
        assert all(e["seq"] > seqs[-1] for e in later["entries"])

        hung = await http.post(f"/v1/console/calls/{call_ref}/hangup")
        assert hung.status_code == 204
        await session.wait_for("session.end", timeout=5)
        await call.wait_closed(timeout=5)

        async def ended() -> Any:
            listing = (await http.get("/v1/console/calls")).json()
            return listing if listing["ended"] else None

        listing = await _poll(ended)
        assert listing["live"] == []
        row = listing["ended"][0]
        assert row["callRef"] == call_ref and row["reason"] == "app_hangup"
        assert row["endedAt"].endswith("Z") and row["state"] == "ended"
        page = (await http.get(f"/v1/console/calls/{call_ref}/timeline")).json()
        assert page["live"] is False
        assert page["entries"][-1]["kind"] == "state" and page["entries"][-1]["type"] == "ended"
        assert SECRET not in str(page)
        missing = await http.get("/v1/console/calls/nope/timeline")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        again = await http.post(f"/v1/console/calls/{call_ref}/hangup")
        assert again.status_code == 404


async def test_console_and_pages_are_guarded_beyond_loopback() -> None:
    async with (
        gateway_env(server_extra={"host": "0.0.0.0"}) as env,
        httpx.AsyncClient(base_url=env.base_url) as http,
    ):
        refused = await http.get("/v1/console/calls")
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        page = await http.get("/console")
        assert page.status_code == 401 and "<form" in page.text
        assert 'method="post"' in page.text and API_TOKEN not in page.text
        bearer = {"Authorization": f"Bearer {API_TOKEN}"}
        assert (await http.get("/v1/console/calls", headers=bearer)).status_code == 200
        wrong = await http.post("/login", data={"token": "nope", "next": "/console"})
        assert wrong.status_code == 401 and "<form" in wrong.text
        login = await http.post("/login", data={"token": API_TOKEN, "next": "/console"})
        assert login.status_code == 303 and login.headers["location"] == "/console"
        cookie = login.headers["set-cookie"]
        assert "appbridge_session=" in cookie and API_TOKEN not in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert (await http.get("/v1/console/calls")).status_code == 200
        out = await http.post("/logout")
        assert out.status_code == 303
        http.cookies.clear()
        assert (await http.get("/v1/console/calls")).status_code == 401
