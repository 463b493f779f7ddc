"""The test peers against tiny loopback servers written here (not against the gateway).

A minimal TwiML webhook + Media Stream server (Starlette on uvicorn) stands in for the gateway's
Twilio routes; a websockets client stands in for the gateway dialing an app. Real-time waits are
bounded and short; assertions hold on a loaded machine (lower bounds and orderings only).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from appbridge.testing import (
    FakeApp,
    FakeTwilio,
    FakeTwilioCall,
    FakeTwilioRest,
    LoopbackServer,
    fonoster_headers,
    fonoster_signature,
    twilio_signature,
)
from appbridge.testing import audio as au

ACCOUNT = "AC" + "a" * 32
TOKEN = "twilio-token"
SID_RE = re.compile(r"^(CA|MZ)[0-9a-f]{32}$")
TONE_ULAW = au.ulaw_encode(au.tone_pcm16(440, 100, 8000))  # 800 bytes, 5 frames


# ---------------------------------------------------------------------- a tiny "gateway"
class StreamPeer:
    """The gateway's side of one Media Stream, driven by the test."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.done = asyncio.Event()
        self.stream_sid = ""

    async def recv(self, timeout: float = 2.0) -> dict[str, Any]:  # noqa: ASYNC109
        msg: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.receive_text(), timeout))
        return msg

    async def recv_event(self, event: str, timeout: float = 2.0) -> dict[str, Any]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.recv(timeout)
                if msg["event"] == event:
                    return msg

    async def handshake(self) -> tuple[dict[str, Any], dict[str, Any]]:
        connected, start = await self.recv(), await self.recv()
        self.stream_sid = start["streamSid"]
        return connected, start

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(msg))

    async def media(self, ulaw: bytes) -> None:
        payload = base64.b64encode(ulaw).decode()
        await self.send(
            {"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}}
        )

    async def mark(self, name: str) -> None:
        await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})


class MiniGateway:
    """POST /twilio/voice answers TwiML; WS /twilio/stream hands each stream to the test."""

    def __init__(self, *, auth_token: str | None, public_url: str | None = None) -> None:
        self.auth_token = auth_token
        self.public_url = public_url
        self.twiml_override: str | None = None
        self.reject_streams = False
        self.webhooks: list[tuple[dict[str, str], dict[str, str]]] = []
        self.stream_headers: list[dict[str, str]] = []
        self.peers: asyncio.Queue[StreamPeer] = asyncio.Queue()
        self._all: list[StreamPeer] = []
        app = Starlette(
            routes=[
                Route("/twilio/voice", self.voice, methods=["POST"]),
                WebSocketRoute("/twilio/stream", self.stream),
            ]
        )
        self.server = LoopbackServer(app, ws="websockets-sansio")

    @property
    def public(self) -> str:
        return self.public_url or self.server.base_url

    async def voice(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))
        self.webhooks.append((dict(request.headers), form))
        if self.auth_token is not None:
            expected = twilio_signature(self.auth_token, self.public + "/twilio/voice", form)
            if request.headers.get("x-twilio-signature") != expected:
                return Response("forbidden", status_code=403)
        if self.twiml_override is not None:
            return Response(self.twiml_override, media_type="text/xml")
        stream_url = self.public.replace("http", "ws", 1) + "/twilio/stream"
        twiml = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
            f'<Stream url="{stream_url}"><Parameter name="from" value="{form["From"]}"/>'
            f'<Parameter name="to" value="{form["To"]}"/></Stream></Connect></Response>'
        )
        return Response(twiml, media_type="text/xml")

    async def stream(self, websocket: WebSocket) -> None:
        self.stream_headers.append(dict(websocket.headers))
        if self.auth_token is not None:
            url = self.public.replace("http", "ws", 1) + "/twilio/stream"
            expected = twilio_signature(self.auth_token, url, {})
            if websocket.headers.get("x-twilio-signature") != expected:
                await websocket.close(code=1008)
                return
        if self.reject_streams:
            await websocket.close(code=1008)
            return
        await websocket.accept()
        peer = StreamPeer(websocket)
        self._all.append(peer)
        self.peers.put_nowait(peer)
        await peer.done.wait()

    async def next_peer(self) -> StreamPeer:
        peer = await asyncio.wait_for(self.peers.get(), 3.0)
        await peer.handshake()
        return peer

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        for peer in self._all:
            peer.done.set()
        await self.server.stop()


@pytest.fixture
async def gateway() -> AsyncIterator[MiniGateway]:
    gw = MiniGateway(auth_token=TOKEN)
    await gw.start()
    yield gw
    await gw.stop()


@pytest.fixture
async def twilio(gateway: MiniGateway) -> AsyncIterator[FakeTwilio]:
    fake = FakeTwilio(gateway.server.base_url, account_sid=ACCOUNT, auth_token=TOKEN)
    yield fake
    await fake.aclose()


def media_payload(msg: dict[str, Any]) -> bytes:
    return base64.b64decode(msg["media"]["payload"])


# ---------------------------------------------------------------------- signature and audio
def test_twilio_signature_matches_reference_vector() -> None:
    params = {
        "CallSid": "CA1234567890ABCDE",
        "Caller": "+14158675309",
        "Digits": "1234",
        "From": "+14158675309",
        "To": "+18005551212",
    }
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    assert twilio_signature("12345", url, params) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert twilio_signature("12345", url, dict(reversed(params.items()))) == (
        "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    )


def test_twilio_signature_sorts_repeated_values() -> None:
    one = twilio_signature("k", "https://x/y", {"A": ["2", "1"], "B": "3"})
    two = twilio_signature("k", "https://x/y", {"B": "3", "A": ["1", "2"]})
    assert one == two
    assert one != twilio_signature("k", "https://x/y", {"A": ["1"], "B": "3"})


def test_fonoster_signature_is_lowercase_hex_hmac_sha256() -> None:
    sig = fonoster_signature("secret", 1700000000, "wss://app.example.com/session")
    assert re.fullmatch(r"[0-9a-f]{64}", sig)
    headers = fonoster_headers("secret", "wss://app.example.com/session", 1700000000)
    assert headers == {"X-Fonoster-Timestamp": "1700000000", "X-Fonoster-Signature": sig}


def test_audio_helpers_find_tones_and_round_trip_ulaw() -> None:
    tone = au.tone_pcm16(440, 200, 8000)
    assert len(tone) == 2 * 1600
    assert abs(au.dominant_freq(tone, 8000) - 440) < 10
    assert au.goertzel_power(tone, 8000, 440) > 100 * au.goertzel_power(tone, 8000, 1000)
    assert 5000 < au.rms_pcm16(tone) < 6000  # 8000 / sqrt(2)
    decoded = au.ulaw_decode(au.ulaw_encode(tone))
    assert abs(au.rms_pcm16(decoded) - au.rms_pcm16(tone)) < 100
    dtmf5 = au.dual_tone(770, 1336, 100, 8000)
    assert au.goertzel_power(dtmf5, 8000, 770) > 50 * au.goertzel_power(dtmf5, 8000, 941)
    assert au.goertzel_power(dtmf5, 8000, 1336) > 50 * au.goertzel_power(dtmf5, 8000, 1209)
    assert au.rms_pcm16(au.silence_pcm16(20, 16000)) == 0.0
    assert au.dominant_freq(au.silence_pcm16(20, 8000), 8000) == 0.0
    assert au.is_silent_ulaw(au.silence_ulaw(20)) and not au.is_silent_ulaw(au.ulaw_encode(tone))


# ---------------------------------------------------------------------- FakeTwilio: opening
async def test_place_call_posts_signed_webhook_and_opens_stream(
    gateway: MiniGateway, twilio: FakeTwilio
) -> None:
    call = await twilio.place_call("+15550001111", "+15550002222", pace=False)
    headers, form = gateway.webhooks[0]
    assert headers["x-twilio-signature"] == twilio_signature(
        TOKEN, gateway.server.base_url + "/twilio/voice", form
    )
    assert SID_RE.match(form["CallSid"]) and form["CallSid"] == call.call_sid
    expected = {
        "AccountSid": ACCOUNT,
        "From": "+15550001111",
        "To": "+15550002222",
        "CallStatus": "ringing",
        "Direction": "inbound",
        "ApiVersion": "2010-04-01",
        "Caller": "+15550001111",
        "Called": "+15550002222",
    }
    assert expected.items() <= form.items()
    assert call.webhook_status == 200 and call.webhook_content_type.startswith("text/xml")
    assert call.twiml_verbs == ["Connect"] and call.has_stream
    assert call.params == {"from": "+15550001111", "to": "+15550002222"}

    peer = await asyncio.wait_for(gateway.peers.get(), 3.0)
    connected, start = await peer.handshake()
    assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    assert start["event"] == "start" and start["sequenceNumber"] == "1"
    assert start["streamSid"] == call.stream_sid and SID_RE.match(start["streamSid"])
    assert start["start"] == {
        "accountSid": ACCOUNT,
        "streamSid": call.stream_sid,
        "callSid": call.call_sid,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"from": "+15550001111", "to": "+15550002222"},
    }
    signed = twilio_signature(
        TOKEN, gateway.server.base_url.replace("http", "ws") + "/twilio/stream", {}
    )
    assert gateway.stream_headers[0]["x-twilio-signature"] == signed


async def test_media_counters_are_exact_strings_and_dtmf_keeps_its_place(
    gateway: MiniGateway, twilio: FakeTwilio
) -> None:
    call = await twilio.place_call("+1", "+2", pace=False)
    peer = await gateway.next_peer()
    audio = bytes(range(200)) * 2  # 400 bytes: two full frames and half of a third
    await call.send_audio_ulaw(audio)
    await call.send_dtmf("5")
    await call.send_audio_ulaw(b"\x10" * 160)
    msgs = [await peer.recv() for _ in range(5)]
    assert [m["event"] for m in msgs] == ["media", "media", "media", "dtmf", "media"]
    assert [m["sequenceNumber"] for m in msgs] == ["2", "3", "4", "5", "6"]
    media = [m for m in msgs if m["event"] == "media"]
    assert [m["media"]["chunk"] for m in media] == ["1", "2", "3", "4"]
    assert [m["media"]["timestamp"] for m in media] == ["0", "20", "40", "60"]
    assert all(m["media"]["track"] == "inbound" for m in media)
    assert all(m["streamSid"] == call.stream_sid for m in msgs)
    payloads = [media_payload(m) for m in media]
    assert all(len(p) == 160 for p in payloads)
    assert b"".join(payloads)[:400] == audio
    assert payloads[2][80:] == b"\xff" * 80  # the partial frame is padded with µ-law silence
    assert payloads[3] == b"\x10" * 160
    assert msgs[3]["dtmf"] == {"track": "inbound_track", "digit": "5"}
    with pytest.raises(ValueError):
        await call.send_dtmf("x")


async def test_paced_media_follows_20ms_deadlines(gateway: MiniGateway, twilio: FakeTwilio) -> None:
    call = await twilio.place_call("+1", "+2", pace=True)
    peer = await gateway.next_peer()
    await call.send_audio_ulaw(b"\x00" * 800)
    t0 = time.monotonic()
    msgs = [await peer.recv() for _ in range(5)]
    span_s = time.monotonic() - t0
    assert span_s >= 0.07  # five frames on 20 ms deadlines span at least four intervals
    stamps = [int(m["media"]["timestamp"]) for m in msgs]
    assert [b - a for a, b in itertools.pairwise(stamps)] == [20, 20, 20, 20]
    await call.send_silence(40)
    more = [await peer.recv() for _ in range(2)]
    assert all(media_payload(m) == b"\xff" * 160 for m in more)
    assert [m["media"]["chunk"] for m in more] == ["6", "7"]


async def test_no_stream_when_twiml_hangs_up(gateway: MiniGateway, twilio: FakeTwilio) -> None:
    gateway.twiml_override = "<Response><Say>Sorry, no app.</Say><Hangup/></Response>"
    call = await twilio.place_call("+1", "+2")
    assert not call.has_stream and call.stream_sid is None
    assert call.twiml_verbs == ["Say", "Hangup"] and "Sorry" in call.twiml
    assert call.status == "completed"
    assert await call.wait_closed(0.1) is None
    await call.hangup()  # nothing to hang up: a no-op


async def test_bad_signature_gets_403_and_no_stream(gateway: MiniGateway) -> None:
    fake = FakeTwilio(gateway.server.base_url, account_sid=ACCOUNT, auth_token="wrong")
    call = await fake.place_call("+1", "+2")
    assert call.webhook_status == 403 and not call.has_stream


async def test_refused_upgrade_is_recorded(gateway: MiniGateway, twilio: FakeTwilio) -> None:
    gateway.reject_streams = True
    call = await twilio.place_call("+1", "+2")
    assert not call.has_stream and call.stream_status == 403 and call.stream_error


async def test_public_url_prefix_is_signed_but_not_dialed() -> None:
    gw = MiniGateway(auth_token=TOKEN, public_url="https://bridge.example.com/pfx")
    await gw.start()
    fake = FakeTwilio(
        gw.server.base_url,
        account_sid=ACCOUNT,
        auth_token=TOKEN,
        public_url="https://bridge.example.com/pfx",
    )
    try:
        assert fake.dial_url_for("wss://bridge.example.com/pfx/twilio/stream") == (
            gw.server.base_url.replace("http", "ws") + "/twilio/stream"
        )
        call = await fake.place_call("+1", "+2")
        assert call.stream_url == "wss://bridge.example.com/pfx/twilio/stream"
        assert call.has_stream  # both signatures matched the public URLs
        await gw.next_peer()
    finally:
        await fake.aclose()
        await gw.stop()


# ---------------------------------------------------------------------- FakeTwilio: playout
async def test_playout_plays_in_order_and_echoes_mark_after_audio(
    gateway: MiniGateway, twilio: FakeTwilio
) -> None:
    call = await twilio.place_call("+1", "+2")
    peer = await gateway.next_peer()
    await peer.media(TONE_ULAW[:400])
    await peer.media(TONE_ULAW[400:])
    await peer.mark("m1")
    echo = await peer.recv_event("mark")
    assert echo["mark"] == {"name": "m1"} and echo["streamSid"] == call.stream_sid
    assert int(echo["sequenceNumber"]) == 2
    assert call.marks_echoed == ["m1"]
    assert call.heard_ulaw() == TONE_ULAW
    audio_frames = [(t, n) for t, _, n in call.heard_frames() if n]
    assert [n for _, n in audio_frames] == [160] * 5
    assert call.marks_echoed_at[0][0] >= audio_frames[-1][0]  # not before its audio played
    # A mark with nothing queued comes back on the next tick.
    await peer.mark("idle")
    assert (await peer.recv_event("mark"))["mark"]["name"] == "idle"
    assert [m["event"] for _, m in call.received] == ["media", "media", "mark", "mark"]
    assert call.protocol_errors == []


async def test_clear_empties_playout_and_echoes_pending_marks(
    gateway: MiniGateway, twilio: FakeTwilio
) -> None:
    call = await twilio.place_call("+1", "+2")
    peer = await gateway.next_peer()
    long_ulaw = au.ulaw_encode(au.tone_pcm16(440, 2000, 8000))
    await peer.media(long_ulaw)
    await peer.mark("end")
    await call.wait_until(lambda: call.first_audio_at() is not None)
    await peer.send({"event": "clear", "streamSid": call.stream_sid})
    echo = await peer.recv_event("mark")
    assert echo["mark"]["name"] == "end"
    await call.wait_until(lambda: call.clears_received == 1)
    clear_at = call.clear_times[0]
    silent_at = call.silence_after(clear_at)
    assert silent_at is not None and clear_at <= silent_at <= clear_at + 0.02
    heard_so_far = call.heard_ulaw()
    assert 0 < len(heard_so_far) < len(long_ulaw) and long_ulaw.startswith(heard_so_far)
    ticks = len(call.heard)
    await call.wait_until(lambda: len(call.heard) >= ticks + 3)
    assert call.heard_ulaw() == heard_so_far  # nothing buffered plays on
    assert call.marks_echoed == ["end"]


async def test_bad_input_from_gateway_is_recorded_not_raised(
    gateway: MiniGateway, twilio: FakeTwilio
) -> None:
    call = await twilio.place_call("+1", "+2")
    peer = await gateway.next_peer()
    sid = call.stream_sid
    await peer.ws.send_text("not json")
    await peer.send({"event": "bogus", "streamSid": sid})
    await peer.send({"event": "media", "streamSid": sid, "media": {"payload": "!!"}})
    await peer.send({"event": "mark", "streamSid": sid, "mark": {}})
    await peer.send({"event": "media", "streamSid": "MZother", "media": {"payload": ""}})
    await peer.ws.send_bytes(b"\x00\x01")
    await peer.mark("ok")
    assert (await peer.recv_event("mark"))["mark"]["name"] == "ok"
    assert len(call.protocol_errors) == 6
    assert not call.closed


# ---------------------------------------------------------------------- FakeTwilio: ending
async def test_hangup_sends_stop_then_closes(gateway: MiniGateway, twilio: FakeTwilio) -> None:
    call = await twilio.place_call("+1", "+2")
    peer = await gateway.next_peer()
    await call.hangup()
    stop = await peer.recv()
    assert stop == {
        "event": "stop",
        "sequenceNumber": "2",
        "stop": {"accountSid": ACCOUNT, "callSid": call.call_sid},
        "streamSid": call.stream_sid,
    }
    with pytest.raises(WebSocketDisconnect):
        await peer.recv()
    assert await call.wait_closed(1.0) == 1000
    assert not call.closed_by_gateway and call.ended_by == "caller"


async def test_gateway_close_is_seen(gateway: MiniGateway, twilio: FakeTwilio) -> None:
    call = await twilio.place_call("+1", "+2")
    peer = await gateway.next_peer()
    await peer.ws.close(code=4001)
    assert await call.wait_closed(2.0) == 4001
    assert call.closed_by_gateway and call.status == "completed"
    with pytest.raises(ConnectionError):
        await call.wait_for("media", 0.5)


# ---------------------------------------------------------------------- FakeTwilioRest
@pytest.fixture
async def rest() -> AsyncIterator[FakeTwilioRest]:
    server = FakeTwilioRest(account_sid=ACCOUNT, auth_token=TOKEN)
    await server.start()
    yield server
    await server.stop()


def call_url(rest: FakeTwilioRest, call_sid: str, account: str = ACCOUNT) -> str:
    return f"{rest.base_url}/2010-04-01/Accounts/{account}/Calls/{call_sid}.json"


async def test_rest_checks_credentials_then_account_and_call(rest: FakeTwilioRest) -> None:
    call = FakeTwilioCall(call_sid="CA" + "1" * 32, account_sid=ACCOUNT, from_="+1", to="+2")
    rest.register(call)
    form = {"Status": "completed"}
    async with httpx.AsyncClient(trust_env=False) as client:
        no_auth = await client.post(call_url(rest, call.call_sid), data=form)
        bad_auth = await client.post(call_url(rest, call.call_sid), data=form, auth=(ACCOUNT, "x"))
        other = await client.post(
            call_url(rest, call.call_sid, "AC" + "b" * 32), data=form, auth=(ACCOUNT, TOKEN)
        )
        unknown = await client.post(
            call_url(rest, "CA" + "9" * 32), data=form, auth=(ACCOUNT, TOKEN)
        )
        no_route = await client.get(rest.base_url + "/nope", auth=(ACCOUNT, TOKEN))
    for response in (no_auth, bad_auth, other, unknown, no_route):
        assert response.headers["content-type"] == "application/json"
    assert no_auth.status_code == bad_auth.status_code == 401
    assert no_auth.json()["code"] == 20003 and no_auth.json()["status"] == 401
    assert other.status_code == unknown.status_code == no_route.status_code == 404
    assert other.json()["code"] == unknown.json()["code"] == 20404
    assert unknown.json()["more_info"] == "https://www.twilio.com/docs/errors/20404"
    assert [r.auth_ok for r in rest.requests[:4]] == [False, False, True, True]
    assert rest.requests[0].form == form and rest.requests[0].status == 401


async def test_rest_completed_returns_call_and_stops_stream(
    gateway: MiniGateway, rest: FakeTwilioRest
) -> None:
    fake = FakeTwilio(gateway.server.base_url, account_sid=ACCOUNT, auth_token=TOKEN, rest=rest)
    call = await fake.place_call("+15550001111", "+15550002222")
    peer = await gateway.next_peer()
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(
            call_url(rest, call.call_sid), data={"Status": "completed"}, auth=(ACCOUNT, TOKEN)
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert body["sid"] == call.call_sid and body["status"] == "completed"
        assert body["account_sid"] == ACCOUNT and body["direction"] == "inbound"
        assert body["from"] == "+15550001111" and body["to"] == "+15550002222"
        assert body["api_version"] == "2010-04-01" and isinstance(body["duration"], str)
        assert body["uri"] == f"/2010-04-01/Accounts/{ACCOUNT}/Calls/{call.call_sid}.json"
        for key in ("date_created", "date_updated", "start_time", "end_time"):
            assert parsedate_to_datetime(body[key]).utcoffset() is not None
        stop = await peer.recv()
        assert stop["event"] == "stop" and stop["stop"]["callSid"] == call.call_sid
        assert await call.wait_closed(2.0) == 1000
        assert call.ended_by == "rest" and not call.closed_by_gateway
        again = await client.post(
            call_url(rest, call.call_sid), data={"Status": "completed"}, auth=(ACCOUNT, TOKEN)
        )
        assert again.status_code == 200 and again.json()["status"] == "completed"
    await fake.aclose()


async def test_rest_dial_twiml_transfers_and_fail_next(
    gateway: MiniGateway, rest: FakeTwilioRest
) -> None:
    fake = FakeTwilio(gateway.server.base_url, account_sid=ACCOUNT, auth_token=TOKEN, rest=rest)
    call = await fake.place_call("+1", "+2")
    peer = await gateway.next_peer()
    twiml = "<Response><Dial>+15550003333</Dial></Response>"
    async with httpx.AsyncClient(trust_env=False) as client:
        rest.fail_next(503, 20503)
        failed = await client.post(call_url(rest, call.call_sid), data={"Twiml": twiml})
        assert failed.status_code == 503 and failed.json()["code"] == 20503
        assert failed.headers["content-type"] == "application/json"
        response = await client.post(
            call_url(rest, call.call_sid), data={"Twiml": twiml}, auth=(ACCOUNT, TOKEN)
        )
    assert response.status_code == 200 and response.json()["status"] == "in-progress"
    assert (await peer.recv())["event"] == "stop"
    await call.wait_closed(2.0)
    assert rest.transfers == [(call.call_sid, twiml)]
    assert call.updates == [{"Twiml": twiml}] and call.ended_by == "transfer"
    await fake.aclose()


# ---------------------------------------------------------------------- FakeApp
@pytest.fixture
async def app() -> AsyncIterator[FakeApp]:
    fake = FakeApp(secret="app-secret")
    await fake.start()
    yield fake
    await fake.stop()


def dial(url: str, headers: dict[str, str] | None = None) -> Any:
    return connect(url, additional_headers=headers or {}, proxy=None, open_timeout=2)


async def test_fake_app_accepts_signed_session_and_records_frames(app: FakeApp) -> None:
    assert app.url == f"ws://127.0.0.1:{app.port}/session"
    async with dial(app.url, fonoster_headers("app-secret", app.url)) as ws:
        session = await app.next_session(2.0)
        assert "x-fonoster-signature" in session.headers and session.path == "/session"
        await ws.send(json.dumps({"type": "session.start", "sessionRef": "s1"}))
        await ws.send(b"\x01abc")
        await ws.send(b"\x02zz")
        await ws.send(b"\x01def")
        await ws.send("{broken")
        start = await session.wait_for("session.start")
        assert start["sessionRef"] == "s1"
        await session.wait_until(lambda: len(session.audio) == 3)
        assert session.audio[1] == b"\x02zz" and session.inbound_audio() == b"abcdef"
        assert session.track_audio(2) == b"zz"
        await session.wait_until(lambda: len(session.protocol_errors) == 1)
        await session.send({"type": "speak", "text": "hi", "id": "a"})
        await session.send_binary(b"\x00\x00")
        assert json.loads(await ws.recv()) == {"type": "speak", "text": "hi", "id": "a"}
        assert await ws.recv() == b"\x00\x00"
        await session.close(1000)
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert await session.wait_closed(1.0) == 1000
    assert session.closed


async def test_fake_app_rejects_bad_signatures(app: FakeApp) -> None:
    now = int(time.time())
    cases = [
        (app.url, fonoster_headers("wrong-secret", app.url), 401),
        (app.url, fonoster_headers("app-secret", app.url, now - 301), 401),
        (app.url, {}, 401),
        (app.url, {"X-Fonoster-Timestamp": "soon", "X-Fonoster-Signature": "00"}, 401),
        (app.url + "x", fonoster_headers("app-secret", app.url + "x"), 404),
    ]
    for url, headers, status in cases:
        with pytest.raises(InvalidStatus) as info:
            async with dial(url, headers):
                pass
        assert info.value.response.status_code == status
    reasons = [r.reason for r in app.rejected_handshakes]
    assert reasons == [
        "signature mismatch",
        "timestamp outside ±300 s",
        "missing signing headers",
        "timestamp is not Unix seconds",
        "no such path",
    ]
    assert app.sessions == []
    # A query string is part of the signed URL.
    url = app.url + "?tenant=7"
    async with dial(url, fonoster_headers("app-secret", url)):
        assert (await app.next_session(2.0)).path == "/session?tenant=7"


async def test_fake_app_refuses_then_listens_again(app: FakeApp) -> None:
    port = app.port
    async with dial(app.url, fonoster_headers("app-secret", app.url)) as early:
        session = await app.next_session(2.0)
        app.refuse = True
        with pytest.raises(OSError):
            async with dial(app.url, fonoster_headers("app-secret", app.url)):
                pass
        await early.send(json.dumps({"type": "still.here"}))  # open sessions carry on
        await session.wait_for("still.here")
        await app.listen_again()
        assert not app.refuse and app.port == port
        async with dial(app.url, fonoster_headers("app-secret", app.url)):
            await app.next_session(2.0)


async def test_fake_app_handler_scripts_a_session() -> None:
    app = FakeApp(secret=None)

    async def talk(session: Any) -> None:
        start = await session.wait_for("session.start")
        await session.send({"type": "speak", "id": start["sessionRef"], "text": "hello"})
        await session.wait_for("output.done")
        await session.send({"type": "hangup"})

    app.handler = talk
    await app.start()
    try:
        async with dial(app.url) as ws:  # no secret: unsigned connections are accepted
            await ws.send(json.dumps({"type": "session.start", "sessionRef": "r1"}))
            assert json.loads(await ws.recv()) == {"type": "speak", "id": "r1", "text": "hello"}
            await ws.send(json.dumps({"type": "output.done", "id": "r1"}))
            assert json.loads(await ws.recv()) == {"type": "hangup"}
    finally:
        await app.stop()
    assert app.handler_errors == []


async def test_fake_app_stop_reading_backs_up_tcp(app: FakeApp) -> None:
    ws: ClientConnection
    async with dial(app.url, fonoster_headers("app-secret", app.url)) as ws:
        session = await app.next_session(2.0)
        app.stop_reading = True
        await ws.send(json.dumps({"type": "late"}))
        with pytest.raises(TimeoutError):
            await session.wait_for("late", 0.1)
        chunk = b"\x01" + bytes(65535)
        blocked = False
        for _ in range(2000):  # up to ~128 MiB; loopback buffers hold far less
            try:
                await asyncio.wait_for(ws.send(chunk), 0.25)
            except TimeoutError:
                blocked = True
                break
        assert blocked, "the sender never felt back-pressure"
        assert session.messages == []
        app.stop_reading = False
        await session.wait_for("late", 5.0)
        await session.wait_until(lambda: len(session.audio) > 0, 5.0)
