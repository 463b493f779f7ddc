"""Bad input from every peer gets a clear answer, loses nothing, and affects no other call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from appbridge.media.wav import write_wav
from appbridge.testing.audio import tone_pcm16, ulaw_encode
from appbridge.testing.fake_twilio import LoopbackServer
from tests.integration.conftest import API_TOKEN, Env, gateway_env
from tests.integration.test_session_protocol import connect

DEEP = "[" * 9000 + "]" * 9000  # 18 KB of nesting


async def still_works(session, item: str = "probe") -> None:  # type: ignore[no-untyped-def]
    await session.send({"type": "speak", "id": item, "text": "Still working."})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == item, timeout=10)


@pytest.fixture
async def media_server() -> AsyncIterator[LoopbackServer]:
    tone22k = write_wav(tone_pcm16(600, 800, 22050), 22050)
    ulaw_wav = _ulaw_wav(ulaw_encode(tone_pcm16(400, 500, 8000)))

    async def serve(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "tone.wav":
            return Response(tone22k, media_type="audio/wav")
        if name == "ulaw.wav":
            return Response(ulaw_wav, media_type="audio/x-wav")
        if name == "raw.ulaw":
            return Response(ulaw_encode(tone_pcm16(500, 300, 8000)), media_type="audio/basic")
        if name == "page.html":
            return Response(b"<html></html>", media_type="text/html")
        if name == "broken.wav":
            return Response(b"RIFF\x00\x00\x00\x00WAVEjunk", media_type="audio/wav")
        if name == "redirect":
            return Response(status_code=302, headers={"Location": "/tone.wav"})
        if name.startswith("minutes-"):  # /minutes-N.wav: N minutes of 8 kHz pcm16 tone
            minutes = float(name.removeprefix("minutes-").removesuffix(".wav"))
            second = tone_pcm16(700, 1000, 8000)
            return Response(write_wav(second * int(minutes * 60), 8000), media_type="audio/wav")
        return Response(b"no", status_code=404)

    server = LoopbackServer(Starlette(routes=[Route("/{name}", serve)]))
    await server.start()
    yield server
    await server.stop()


def _ulaw_wav(ulaw: bytes) -> bytes:
    import struct

    fmt = struct.pack("<HHIIHH", 7, 1, 8000, 8000, 1, 8) + b"\x00\x00"
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(ulaw)) + ulaw
    return b"RIFF" + struct.pack("<I", len(body)) + body


async def test_malformed_messages_get_bad_message_and_the_call_goes_on(env: Env) -> None:
    _, session, _ = await connect(env)
    cases = [
        ("{not json", "unknown"),
        ("[1, 2, 3]", "unknown"),
        (json.dumps({"no": "type"}), "unknown"),
        (json.dumps({"type": "speak", "id": "s1"}), "s1"),  # missing text
        (json.dumps({"type": "speak", "text": 5}), "speak"),  # wrong type, no id
        (json.dumps({"type": "mark", "id": "x" * 129, "name": "n"}), "mark"),  # id too long
        (json.dumps({"type": "play", "id": "p0"}), "p0"),  # missing url
        (json.dumps({"type": "speak", "text": "x" * 70_000}), "speak"),  # text frame over 64 KiB
        # Nested deeper than any decoder goes: a handoff payload of 18 KB, and worse.
        ('{"type":"handoff","id":"h1","app":"demo","payload":' + DEEP + "}", "h1"),
        ('{"payload":' + DEEP + ',"type":"handoff","app":"demo"}', "handoff"),
        (DEEP, "unknown"),
    ]
    for raw, relates_to in cases:
        await session.send_text(raw)
        err = await session.wait_for(
            lambda m, r=relates_to: m["type"] == "error" and m["relatesTo"] == r, timeout=5
        )
        assert err["code"] == "bad_message" and err["fatal"] is False and err["message"]
    await session.send_binary(b"\x00" * (1024 * 1024 + 2))
    err = await session.wait_for("error", timeout=5)
    assert err["code"] == "bad_message" and err["relatesTo"] == "audio"
    await still_works(session)
    assert not session.of_type("session.end")


async def test_garbage_from_twilio_is_logged_and_the_call_goes_on(env: Env) -> None:
    call, session, _ = await connect(env)
    await call.send_raw("this is not json")
    await call.send_raw(b"\x00\x01binary")
    await call.send_raw(
        json.dumps(
            {
                "event": "media",
                "streamSid": call.stream_sid,
                "media": {"payload": "!!!not base64!!!"},
            }
        )
    )
    await call.send_raw(json.dumps({"event": "whatever"}))
    await call.send_raw('{"event":"media","media":' + DEEP + "}")  # nested too deeply to decode
    await still_works(session)
    assert env.gw.metrics.carrier_bad_messages >= 4


async def test_play_fetches_wav_and_raw_ulaw(env: Env, media_server: LoopbackServer) -> None:
    _, session, _ = await connect(env)
    base = media_server.base_url
    for item, name, ms in (
        ("w", "tone.wav", 800),
        ("u", "ulaw.wav", 500),
        ("r", "raw.ulaw", 300),
        ("rd", "redirect", 800),
    ):
        await session.send({"type": "play", "id": item, "url": f"{base}/{name}"})
        done = await session.wait_for(
            lambda m, i=item: m["type"] == "output.done" and m["id"] == i, timeout=10
        )
        assert abs(done["heardMs"] - ms) <= 40, done
    assert session.of_type("error") == []


async def test_play_failures_are_play_fetch_failed(env: Env, media_server: LoopbackServer) -> None:
    _, session, _ = await connect(env)
    base = media_server.base_url
    for item, url in (
        ("missing", f"{base}/missing.wav"),
        ("html", f"{base}/page.html"),
        ("broken", f"{base}/broken.wav"),
        ("ftp", "ftp://example.com/a.wav"),
        # A host that cannot be IDNA-encoded, a port out of range: the URL's fault, not the call's.
        ("idna", "http://exa\u2028mple.com/a.wav"),
        ("empty-label", "http://a..b/a.wav"),
        ("port", "http://example.com:99999/a.wav"),
        # Cloud metadata is refused though this gateway allows private addresses.
        ("metadata-name", "http://metadata.google.internal/computeMetadata/v1/"),
        ("metadata-short", "http://metadata./"),
        ("metadata-ip", "http://169.254.169.254/latest/meta-data/"),
        ("metadata-mapped", "http://[::ffff:169.254.169.254]/latest/"),
    ):
        await session.send({"type": "play", "id": item, "url": url})
        err = await session.wait_for(
            lambda m, i=item: m["type"] == "error" and m["relatesTo"] == i, timeout=10
        )
        assert err["code"] == "play_fetch_failed", err
    # Without an id the error relates to the command's type (docs/protocol-session-v1.md).
    await session.send({"type": "play", "url": f"{base}/missing.wav"})
    err = await session.wait_for(
        lambda m: m["type"] == "error" and m["relatesTo"] == "play", timeout=10
    )
    assert err["code"] == "play_fetch_failed", err
    await still_works(session)
    assert session.of_type("session.end") == []


async def test_a_redirect_to_cloud_metadata_is_refused(env: Env) -> None:
    async def redirect(request: Request) -> Response:
        return Response(status_code=302, headers={"Location": "http://169.254.169.254/latest/"})

    server = LoopbackServer(Starlette(routes=[Route("/{name}", redirect)]))
    await server.start()
    try:
        _, session, _ = await connect(env)
        await session.send({"type": "hold", "id": "h", "music": f"{server.base_url}/music.wav"})
        err = await session.wait_for("error", timeout=10)
        assert err["code"] == "play_fetch_failed" and "metadata" in err["message"], err
        await session.send({"type": "resume"})
        await still_works(session)
    finally:
        await server.stop()


async def test_play_from_private_addresses_needs_the_operator(media_server: LoopbackServer) -> None:
    async with gateway_env(media={"allow_private": False}) as env:
        _, session, _ = await connect(env)
        await session.send({"type": "play", "id": "p", "url": f"{media_server.base_url}/tone.wav"})
        err = await session.wait_for("error", timeout=10)
        assert err["code"] == "play_fetch_failed" and "allow_private" in err["message"]


async def test_http_bad_requests_get_json_errors(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.base_url) as client:
        r = await client.post(
            "/twilio/voice", content=b"{}", headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
        r = await client.post(
            "/twilio/voice",
            content=b"x" * 70_000,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 413
        r = await client.post("/v1/calls", json={"app": "main"})
        assert r.status_code == 401
        r = await client.post(
            "/v1/calls", json={"app": "main"}, headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
        assert r.status_code == 400 and "E.164" in r.json()["message"]
        bearer = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"}
        for body, words in (
            (('{"app":' * 3000 + '"main"' + "}" * 3000).encode(), "nested too deeply"),
            (DEEP.encode(), "nested too deeply"),
            (b"[1, 2]", "a JSON object"),
            (b"{nope", "not valid JSON"),
            (rb'{"app": "\ud800"}', "not valid JSON"),
        ):
            r = await client.post("/v1/calls", content=body, headers=bearer)
            assert r.status_code == 400 and words in r.json()["message"], (r.status_code, r.text)


async def test_a_slow_app_never_affects_another_call(env: Env) -> None:
    call1, session1, _ = await connect(env, continuous_media=True)
    call2, session2, _ = await connect(env, continuous_media=True)
    session1.stop_reading = True
    await call1.send_audio_ulaw(b"\x10" * 160 * 200)
    await still_works(session2, "other")
    await asyncio.sleep(0.5)
    assert not session2.of_type("session.end")
    session1.stop_reading = False
    assert call2.closed is False
