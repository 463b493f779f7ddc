"""The Twilio dialect toward apps and the Twilio-compatible REST endpoint (docs/protocol-twilio.md),
on loopback.

The app here is a plain websockets server that reads and writes Twilio Media Stream JSON by
hand, as a Twilio-built app would.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import websockets
from websockets.asyncio.server import ServerConnection, serve

from appbridge.carriers.twilio.leg import LEAD_FRAMES
from appbridge.testing.audio import dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from tests.integration.conftest import ACCOUNT_SID, Env, gateway_env

HTTP_SID = "AC" + "9" * 32
HTTP_TOKEN = "http-token"


class TwilioApp:
    """A Twilio-dialect app: records every frame, can send anything."""

    def __init__(self) -> None:
        self.sessions: asyncio.Queue[TwilioAppSession] = asyncio.Queue()
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/media"

    async def handler(self, ws: ServerConnection) -> None:
        session = TwilioAppSession(ws)
        await self.sessions.put(session)
        await session.read()


class TwilioAppSession:
    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.frames: list[Any] = []
        self.messages: list[dict[str, Any]] = []
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self.reading = asyncio.Event()  # cleared: no frame is read, and TCP pushes back
        self.reading.set()

    async def read(self) -> None:
        try:
            async for frame in self.ws:
                await self.reading.wait()
                self.frames.append(frame)
                if isinstance(frame, str):
                    self.messages.append(json.loads(frame))
                self.changed.set()
        except websockets.ConnectionClosed:
            pass
        self.closed.set()
        self.changed.set()

    async def wait_for(self, event: str, n: int = 1, timeout: float = 10) -> list[dict[str, Any]]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while len(found := [m for m in self.messages if m.get("event") == event]) < n:
                self.changed.clear()
                await self.changed.wait()
        return found

    async def send(self, msg: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(msg if isinstance(msg, str | bytes) else json.dumps(msg))


@asynccontextmanager
async def twilio_env() -> AsyncIterator[tuple[Env, TwilioApp]]:
    app = TwilioApp()
    async with serve(app.handler, "127.0.0.1", 0) as server:
        app.port = server.sockets[0].getsockname()[1]

        def apps(_: Any) -> list[dict[str, Any]]:
            return [{"ref": "tw", "url": app.url, "protocol": "twilio", "workspace_ref": HTTP_SID}]

        async with gateway_env(
            apps, http={"account_sid": HTTP_SID, "auth_token": HTTP_TOKEN}
        ) as env:
            yield env, app


async def test_connected_start_media_dtmf_and_counters() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(800, 400, 8000)))
        await call.send_dtmf("#")
        await session.wait_for("dtmf", timeout=10)
        media = await session.wait_for("media", n=15)
        first, second = session.messages[0], session.messages[1]
        assert first == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        assert second["event"] == "start" and second["sequenceNumber"] == "1"
        start = second["start"]
        assert start["callSid"] == call.call_sid
        assert start["accountSid"] == HTTP_SID
        assert start["tracks"] == ["inbound"]
        assert start["mediaFormat"] == {
            "encoding": "audio/x-mulaw",
            "sampleRate": 8000,
            "channels": 1,
        }
        assert start["customParameters"]["from"] == "+15550001111"
        stream_sid = start["streamSid"]
        assert second["streamSid"] == stream_sid
        seqs = [int(m["sequenceNumber"]) for m in session.messages[1:]]
        assert seqs == list(range(1, len(seqs) + 1))  # every message counts, from start = 1
        chunks = [int(m["media"]["chunk"]) for m in media]
        assert chunks == list(range(1, len(chunks) + 1))
        stamps = [int(m["media"]["timestamp"]) for m in media]
        assert stamps == sorted(stamps)
        assert all(m["media"]["track"] == "inbound" and m["streamSid"] == stream_sid for m in media)
        assert all(len(base64.b64decode(m["media"]["payload"])) == 160 for m in media)
        audio = ulaw_decode(b"".join(base64.b64decode(m["media"]["payload"]) for m in media[2:15]))
        assert abs(dominant_freq(audio, 8000) - 800) < 30
        dtmf = next(m for m in session.messages if m["event"] == "dtmf")
        assert dtmf["dtmf"] == {"track": "inbound_track", "digit": "#"}
        assert all(isinstance(f, str) for f in session.frames)  # never a binary frame


async def test_audio_dropped_for_a_slow_app_takes_no_counter() -> None:
    """The gateway never waits on a slow app: it drops audio frames while the app's socket is
    backed up. A dropped frame is never sent, so it takes no ``sequenceNumber`` and no
    ``chunk`` (they count the messages sent); ``timestamp`` shows the gap."""
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222", pace=False)
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        session.reading.clear()
        sent_frames = 25_000  # 8 minutes of audio, unpaced: a few MB toward the app
        await call.send_audio_ulaw(b"\xff" * (160 * sent_frames))
        await call.drain(timeout=60)
        live = env.gw.registry.get(call.call_sid)
        assert live is not None and live.link is not None
        link = live.link
        async with asyncio.timeout(30):
            while link.audio_dropped_frames == 0:  # noqa: ASYNC110 - a gateway counter
                await asyncio.sleep(0.05)
        session.reading.set()

        def media_count() -> int:
            return sum(1 for m in session.messages if m.get("event") == "media")

        async with asyncio.timeout(60):  # every caller frame reached the app or was dropped
            while media_count() + link.audio_dropped_frames < sent_frames:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        dropped = link.audio_dropped_frames
        assert dropped > 0 and media_count() == sent_frames - dropped
        # Once the app reads again, audio flows again, numbered on from the last frame sent.
        await call.send_audio_ulaw(b"\xff" * (160 * 50))
        media = await session.wait_for("media", n=sent_frames - dropped + 50, timeout=30)
        assert link.audio_dropped_frames == dropped
        seqs = [int(m["sequenceNumber"]) for m in session.messages[1:]]
        assert seqs == list(range(1, len(seqs) + 1))
        assert [int(m["media"]["chunk"]) for m in media] == list(range(1, len(media) + 1))
        stamps = [int(m["media"]["timestamp"]) for m in media]
        assert stamps == sorted(stamps)


async def test_app_media_mark_and_clear() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        sid = session.messages[1]["streamSid"]
        tone = ulaw_encode(tone_pcm16(650, 500, 8000))
        # Pipecat-style: media without track/chunk/timestamp, any length, faster than real time.
        for i in range(0, len(tone), 700):
            await session.send(
                {
                    "event": "media",
                    "streamSid": sid,
                    "media": {"payload": base64.b64encode(tone[i : i + 700]).decode()},
                }
            )
        await session.send({"event": "mark", "streamSid": sid, "mark": {"name": "one"}})
        marks = await session.wait_for("mark", timeout=10)
        assert marks[0]["mark"] == {"name": "one"}
        # The mark comes back once Twilio has played the last frame before it, by the gateway's
        # estimate (the lead, LEAD_FRAMES, has run out: tests/unit/test_heard.py pins that in
        # virtual time). Here, only a loose lower bound: the fake Twilio reads its socket on its
        # own time.
        lead_s = (LEAD_FRAMES + 1) * 0.020
        assert len(call.heard_ulaw()) / 8000 >= 0.5 - lead_s - 0.005
        await call.wait_until(lambda: len(call.heard_ulaw()) >= 4000, timeout=2)
        heard = ulaw_decode(call.heard_ulaw())
        assert 0.5 <= len(heard) / 2 / 8000 <= 0.6
        assert abs(dominant_freq(heard, 8000) - 650) < 30
        # clear flushes and echoes pending marks at once.
        long_tone = ulaw_encode(tone_pcm16(650, 4000, 8000))
        await session.send(
            {
                "event": "media",
                "streamSid": sid,
                "media": {"payload": base64.b64encode(long_tone).decode()},
            }
        )
        await session.send({"event": "mark", "streamSid": sid, "mark": {"name": "two"}})
        await asyncio.sleep(0.3)
        await session.send({"event": "clear", "streamSid": sid})
        marks = await session.wait_for("mark", n=2, timeout=5)
        assert marks[1]["mark"] == {"name": "two"}
        await call.wait_until(lambda: call.clears_received >= 1, timeout=5)
        assert len(call.heard_ulaw()) < 8000 * 1.5


async def test_garbage_from_a_twilio_app_is_logged_and_the_call_goes_on() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        sid = session.messages[1]["streamSid"]
        for bad in (
            "not json",
            b"\x00\x01",
            json.dumps({"event": "media", "media": {"payload": "%%%"}}),
            json.dumps({"event": "whatever"}),
            json.dumps({"noevent": 1}),
        ):
            await session.send(bad)
        await session.send(
            {
                "event": "media",
                "streamSid": sid,
                "media": {"payload": base64.b64encode(b"\x10" * 1600).decode()},
            }
        )
        await session.send({"event": "mark", "streamSid": sid, "mark": {"name": "ok"}})
        await session.wait_for("mark", timeout=10)
        assert env.gw.metrics.app_bad_messages >= 3
        assert not call.closed
        assert all("event" in m for m in session.messages)


async def test_rest_hangup_endpoint() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        url = f"/2010-04-01/Accounts/{HTTP_SID}/Calls/{call.call_sid}.json"
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            r = await client.post(url, data={"Status": "completed"}, auth=(HTTP_SID, "wrong"))
            assert r.status_code == 401 and r.json()["code"] == 20003
            assert r.headers["content-type"] == "application/json"
            other = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/{call.call_sid}.json"
            r = await client.post(other, data={"Status": "completed"}, auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 404 and r.json()["code"] == 20404  # another workspace
            r = await client.post(
                url.replace(call.call_sid, "CA" + "0" * 32),
                data={"Status": "completed"},
                auth=(HTTP_SID, HTTP_TOKEN),
            )
            assert r.status_code == 404 and isinstance(r.json()["code"], int)
            r = await client.post(url, data={"Status": "ringing"}, auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 400 and r.json()["code"] == 20001
            r = await client.post(url, content=b"\xff\xfe", auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 400
            r = await client.get(url, auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 405 and r.json()["status"] == 405
            r = await client.post(url, data={"Status": "completed"}, auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 200
            body = r.json()
            assert body["sid"] == call.call_sid and body["status"] == "completed"
            assert body["account_sid"] == HTTP_SID and body["api_version"] == "2010-04-01"
            assert set(body) >= {
                "to",
                "from",
                "direction",
                "date_created",
                "date_updated",
                "start_time",
                "end_time",
                "duration",
                "uri",
            }
            await asyncio.wait_for(session.closed.wait(), 5)
            assert session.messages[-1]["event"] == "stop"
            assert session.messages[-1]["stop"]["callSid"] == call.call_sid
            r = await client.post(url, data={"Status": "completed"}, auth=(HTTP_SID, HTTP_TOKEN))
            assert r.status_code == 404 and r.json()["code"] == 20404  # already ended
        await call.wait_closed(timeout=5)


async def test_the_app_closing_its_socket_hangs_up() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        await session.ws.close()
        await call.wait_closed(timeout=5)


async def test_caller_hangup_sends_stop() -> None:
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        await call.hangup()
        stops = await session.wait_for("stop", timeout=5)
        assert stops[0]["stop"] == {"accountSid": HTTP_SID, "callSid": call.call_sid}
        await asyncio.wait_for(session.closed.wait(), 5)


async def test_a_twilio_dialect_listener_is_read_only() -> None:
    app, listener = TwilioApp(), TwilioApp()
    async with (
        serve(app.handler, "127.0.0.1", 0) as s1,
        serve(listener.handler, "127.0.0.1", 0) as s2,
    ):
        app.port = s1.sockets[0].getsockname()[1]
        listener.port = s2.sockets[0].getsockname()[1]

        def apps(_: Any) -> list[dict[str, Any]]:
            return [
                {
                    "ref": "tw",
                    "url": app.url,
                    "protocol": "twilio",
                    "workspace_ref": HTTP_SID,
                    "listeners": [{"url": listener.url, "tracks": "both"}],
                }
            ]

        async with gateway_env(apps) as env:
            call = await env.twilio.place_call("+15550001111", "+15550002222")
            session = await asyncio.wait_for(app.sessions.get(), 10)
            lsession = await asyncio.wait_for(listener.sessions.get(), 10)
            await session.wait_for("start")
            sid = session.messages[1]["streamSid"]
            await call.send_audio_ulaw(ulaw_encode(tone_pcm16(800, 300, 8000)))
            await session.send(
                {
                    "event": "media",
                    "streamSid": sid,
                    "media": {"payload": base64.b64encode(b"\x20" * 1600).decode()},
                }
            )
            await lsession.send({"event": "clear", "streamSid": sid})  # read-only: ignored
            media = await lsession.wait_for("media", n=20, timeout=10)
            assert [m["event"] for m in lsession.messages[:2]] == ["connected", "start"]
            assert {m["media"]["track"] for m in media} <= {"inbound", "outbound"}
            await lsession.wait_for("media", n=40, timeout=10)
            tracks = {m["media"]["track"] for m in lsession.messages if m["event"] == "media"}
            assert tracks == {"inbound", "outbound"}
            assert call.clears_received == 0
            assert all(isinstance(f, str) for f in lsession.frames)


async def test_no_vad_turns_or_stt_run_for_a_twilio_dialect_app() -> None:
    """The dialect has no turn or transcript messages (docs/protocol-twilio.md), so the
    gateway hears nothing for it: no VAD, no turn detector, no STT stream (a local STT costs
    several % of a core per call)."""
    async with twilio_env() as (env, app):
        call = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await asyncio.wait_for(app.sessions.get(), 10)
        await session.wait_for("start")
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(800, 1000, 8000)))
        await session.wait_for("media", n=40)
        (live,) = list(env.gw.registry)
        assert live.app.protocol == "twilio"
        assert live.ears is None
        assert not [m for m in session.messages if str(m.get("event", "")).startswith("turn")]
