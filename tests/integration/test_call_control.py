"""Call control and listen-only sockets on Twilio calls, over loopback."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from appbridge.testing.audio import decode_dtmf, dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio_outbound import Callee
from tests.integration.conftest import SECRET, Env, gateway_env
from tests.integration.test_bad_input import media_server  # noqa: F401  (fixture)
from tests.integration.test_lifecycle import closed_port
from tests.integration.test_session_protocol import connect
from tests.integration.test_turns import synthesise_ulaw


@asynccontextmanager
async def with_apps(n: int, secret: str | None = SECRET) -> AsyncIterator[list[FakeApp]]:
    apps = [FakeApp(secret=secret) for _ in range(n)]
    for app in apps:
        await app.start()
    try:
        yield apps
    finally:
        for app in apps:
            await app.stop()


async def test_dtmf_send_plays_standard_tones_the_caller_can_decode(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.send({"type": "dtmf.send", "id": "d1", "digits": "19#*0"})
    await session.send({"type": "mark", "name": "after-dtmf"})
    await session.wait_for("mark", timeout=10)
    heard = ulaw_decode(call.heard_ulaw())
    assert decode_dtmf(heard, 8000) == "19#*0"
    assert session.of_type("error") == []
    assert not [m for m in session.messages if m["type"].startswith("output.")]


async def test_hold_music_gating_and_resume(env: Env, media_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    call, session, _ = await connect(env, continuous_media=True)
    await session.wait_until(lambda: len(session.audio) > 10, timeout=5)
    await session.send({"type": "hold", "id": "h", "music": f"{media_server.base_url}/tone.wav"})
    await asyncio.sleep(0.3)
    frames_at_hold = len(session.audio)
    heard_at_hold = len(call.heard_ulaw())
    # Every command but resume/hangup/transfer/handoff is refused while on hold.
    for msg in (
        {"type": "speak", "id": "s", "text": "no"},
        {"type": "clear", "id": "c"},
        {"type": "play", "id": "p", "url": "http://x/y.wav"},
        {"type": "dtmf.send", "id": "d", "digits": "1"},
        {"type": "mark", "name": "m"},
    ):
        await session.send(msg)
    errors = [await session.wait_for("error", timeout=5) for _ in range(5)]
    assert {e["code"] for e in errors} == {"on_hold"}
    assert {e["relatesTo"] for e in errors} == {"s", "c", "p", "d", "mark"}
    await call.send_dtmf("4")  # keypresses still arrive
    assert (await session.wait_for("dtmf", timeout=5))["digit"] == "4"
    await asyncio.sleep(1.2)
    assert len(session.audio) <= frames_at_hold + 1  # no caller audio on hold
    music = ulaw_decode(call.heard_ulaw()[heard_at_hold:])
    assert len(music) / 2 / 8000 > 0.8  # the music loops (the file is 0.8 s)
    assert abs(dominant_freq(music, 8000) - 600) < 30
    await session.send({"type": "resume", "id": "r"})
    await session.wait_until(lambda: len(session.audio) > frames_at_hold + 20, timeout=5)
    await session.send({"type": "speak", "id": "back", "text": "Back."})
    await session.wait_for("output.done", timeout=10)


async def test_hold_music_of_a_few_minutes_plays(env: Env, media_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Hold music is not the app's output: the 120 s queue limit does not apply to it. A WAV
    file's own limit (600 s) does."""
    call, session, _ = await connect(env)
    other, session2, _ = await connect(env)
    base = media_server.base_url
    fetches = env.gw.music.fetches
    await session.send({"type": "hold", "id": "h", "music": f"{base}/minutes-3.wav"})
    await session2.send({"type": "hold", "id": "h", "music": f"{base}/minutes-3.wav"})
    await asyncio.sleep(1.5)
    for caller in (call, other):
        music = ulaw_decode(caller.heard_ulaw()[-8000:])
        assert abs(dominant_freq(music, 8000) - 700) < 30
    # Both callers hear one download, kept once (media/music.py).
    assert env.gw.music.fetches == fetches + 1
    await session2.send({"type": "resume", "id": "r"})
    await session.send({"type": "resume", "id": "r"})
    await session.send({"type": "hold", "id": "h2", "music": f"{base}/minutes-10.5.wav"})
    err = await session.wait_for("error", timeout=15)
    assert (err["code"], err["relatesTo"]) == ("play_fetch_failed", "h2"), err
    assert "600 s" in err["message"]


async def test_hold_without_music_is_silence(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.send_binary(tone_pcm16(500, 3000, 16000))
    await call.wait_until(lambda: call.first_audio_at() is not None, timeout=5)
    await session.send({"type": "hold"})
    await asyncio.sleep(0.3)
    heard = len(call.heard_ulaw())
    await asyncio.sleep(0.8)
    assert len(call.heard_ulaw()) - heard < 400  # at most a frame or two in flight
    await session.send({"type": "resume"})
    await asyncio.sleep(0.8)  # the app's queued audio plays on after resume
    assert len(call.heard_ulaw()) - heard > 4000


async def test_handoff_moves_the_call_to_another_app(env: Env) -> None:
    async with with_apps(1) as (second,):
        apps = {ref: app for ref, app in env.gw.config.apps.items()}
        apps["second"] = _app("second", second.url)
        _reload(env, apps)
        call, first, start1 = await connect(env)
        payload = {"customer": 42, "note": "vip"}
        await first.send({"type": "handoff", "id": "ho", "app": "second", "payload": payload})
        end = await first.wait_for("session.end", timeout=5)
        assert end == {"type": "session.end", "reason": "handoff", "id": "ho"}
        session2 = await second.next_session(timeout=5)
        start2 = await session2.wait_for("session.start", timeout=5)
        assert start2["handoff"] == payload
        assert start2["callRef"] == start1["callRef"] == call.call_sid
        assert start2["sessionRef"] != start1["sessionRef"]
        assert start2["appRef"] == "second"
        await session2.send({"type": "speak", "id": "hi", "text": "Second app here."})
        await session2.wait_for("output.done", timeout=10)
        assert not call.closed
        await call.send_audio_ulaw(b"\x20" * 800)
        await session2.wait_until(lambda: len(session2.audio) >= 3, timeout=5)


async def test_the_app_handed_to_starts_with_its_own_listening(env: Env) -> None:
    """``subscribe`` and ``listen.update`` were the first app's choices: the second app gets
    no opt-in event it did not ask for, and recognition runs as its own configuration says."""
    async with with_apps(1) as (second,):
        apps = {ref: app for ref, app in env.gw.config.apps.items()}
        apps["second"] = _app("second", second.url)
        _reload(env, apps)
        call, first, _ = await connect(env, continuous_media=True)
        await first.send({"type": "subscribe", "events": ["turn.estimate", "transcript.partial"]})
        await first.send(
            {"type": "listen.update", "language": "es-ES", "hints": ["Fonoster"], "patience": "low"}
        )
        live = env.gw.registry.get(call.call_sid)
        assert live is not None
        await call.wait_until(
            lambda: live.ears is not None and live.ears.detector.patience == "low", timeout=5
        )
        assert live.ears is not None and (live.ears.language, live.ears.hints) == (
            "es-ES",
            ["Fonoster"],
        )
        await first.send({"type": "handoff", "id": "ho", "app": "second", "payload": {}})
        await first.wait_for("session.end", timeout=5)
        session2 = await second.next_session(timeout=5)
        start2 = await session2.wait_for("session.start", timeout=5)
        assert start2["speech"]["language"] == "en-US"
        assert live.ears is not None
        assert (live.ears.language, live.ears.hints) == ("en-US", [])
        assert live.ears.detector.patience == "normal"
        await asyncio.sleep(0.3)
        await call.send_audio_ulaw(await synthesise_ulaw("I would like to check my balance."))
        ended = await session2.wait_for("turn.ended", timeout=20)
        assert ended["abandoned"] is False and ended["language"].startswith("en")
        kinds = {m["type"] for m in session2.messages}
        assert "turn.estimate" not in kinds and "transcript.partial" not in kinds
        await session2.send({"type": "subscribe", "events": ["turn.estimate"]})
        await call.send_audio_ulaw(await synthesise_ulaw("And my savings too."))
        await session2.wait_for("turn.estimate", timeout=15)


async def test_handoff_limits_and_bad_targets(env: Env) -> None:
    async with with_apps(1) as (other,):
        apps = {ref: app for ref, app in env.gw.config.apps.items()}
        apps["other"] = _app("other", other.url)
        apps["down"] = _app("down", f"ws://127.0.0.1:{closed_port()}/x")
        _reload(env, apps)
        _, session, _ = await connect(env)
        await session.send({"type": "handoff", "id": "u", "app": "nope"})
        err = await session.wait_for("error", timeout=5)
        assert (err["code"], err["relatesTo"]) == ("bad_message", "u")
        await session.send_text(
            json.dumps({"type": "handoff", "id": "big", "app": "other", "payload": "x" * 17000})
        )
        err = await session.wait_for("error", timeout=5)
        assert (err["code"], err["relatesTo"]) == ("bad_message", "big")
        await session.send({"type": "handoff", "id": "dn", "app": "down"})
        err = await session.wait_for("error", timeout=10)
        assert (err["code"], err["relatesTo"]) == ("internal", "dn")  # unreachable, no fallback
        await session.send({"type": "speak", "id": "still", "text": "Still mine."})
        await session.wait_for("output.done", timeout=10)
        # Five handoffs bounce the call between the apps; the sixth is refused.
        current = session
        for i in range(5):
            target = "other" if i % 2 == 0 else "main"
            await current.send({"type": "handoff", "id": f"h{i}", "app": target})
            await current.wait_for("session.end", timeout=10)
            server = other if target == "other" else env.app
            current = await server.next_session(timeout=5)
            await current.wait_for("session.start", timeout=5)
        await current.send({"type": "handoff", "id": "h6", "app": "main"})
        err = await current.wait_for("error", timeout=5)
        assert err["code"] == "bad_message" and "5 handoffs" in err["message"]


async def test_handoff_to_an_unreachable_app_follows_its_fallback_message(env: Env) -> None:
    apps = {ref: app for ref, app in env.gw.config.apps.items()}
    apps["down"] = _app("down", f"ws://127.0.0.1:{closed_port()}/x", message="Goodbye now.")
    _reload(env, apps)
    call, session, _ = await connect(env, continuous_media=True)
    await session.send({"type": "handoff", "id": "x", "app": "down"})
    end = await session.wait_for("session.end", timeout=10)
    assert end["reason"] == "handoff"
    await call.wait_closed(timeout=15)
    assert len(call.heard_ulaw()) > 4000  # the fallback message was spoken


async def test_cold_transfer_through_twilio(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.send({"type": "transfer", "id": "t1", "to": "+15557654321"})
    end = await session.wait_for("session.end", timeout=10)
    assert end == {"type": "session.end", "reason": "transfer", "id": "t1"}
    twiml = [r.form.get("Twiml") for r in env.rest.requests if r.form.get("Twiml")]
    assert twiml and "<Dial><Number>+15557654321</Number></Dial>" in twiml[0]
    assert not [r for r in env.rest.requests if r.form.get("Status") == "completed"]
    await call.wait_closed(timeout=5)


async def test_transfer_failures(env: Env) -> None:
    _, session, _ = await connect(env)
    env.rest.fail_next(400, 21211)
    await session.send({"type": "transfer", "id": "t", "to": "+15557654321"})
    err = await session.wait_for("error", timeout=10)
    assert (err["code"], err["relatesTo"]) == ("transfer_failed", "t")
    for target in ("sip:someone@evil.example", "12345", "http://x"):
        await session.send({"type": "transfer", "id": target, "to": target})
        err = await session.wait_for(lambda m, t=target: m.get("relatesTo") == t, timeout=5)
        assert err["code"] == "transfer_failed"
    # REFER is SIP signalling: Twilio calls cannot do it.
    await session.send({"type": "transfer", "id": "r", "to": "+15557654321", "mode": "refer"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "r", timeout=5)
    assert err["code"] == "feature_not_supported"
    # A warm transfer is completed by its id: without one it is refused before anything rings.
    await session.send({"type": "transfer", "to": "+15557654321", "mode": "warm"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "transfer", timeout=5)
    assert err["code"] == "bad_message" and "needs an id" in err["message"]
    # A warm transfer to a busy party: transfer_failed, and the caller is back with the app.
    env.rest.dialer.default_callee = Callee("busy")
    await session.send({"type": "transfer", "id": "w", "to": "+15557654321", "mode": "warm"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "w", timeout=10)
    assert err["code"] == "transfer_failed"
    await session.send({"type": "transfer.complete", "id": "none"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "none", timeout=5)
    assert err["code"] == "bad_message"
    await session.send({"type": "speak", "id": "ok", "text": "Still here."})
    await session.wait_for("output.done", timeout=10)


async def test_listeners_get_events_and_their_tracks_and_are_read_only() -> None:
    async with with_apps(3) as (both, inbound, slow):

        def apps(app: FakeApp) -> list[dict[str, Any]]:
            return [
                {
                    "ref": "main",
                    "url": app.url,
                    "signing_secret": SECRET,
                    "listeners": [
                        {"url": both.url, "tracks": "both"},
                        {"url": inbound.url, "tracks": "inbound"},
                        {"url": slow.url, "tracks": "outbound"},
                        {"url": f"ws://127.0.0.1:{closed_port()}/gone", "tracks": "both"},
                    ],
                }
            ]

        async with gateway_env(apps) as env:
            call, session, start = await connect(env)
            l_both = await both.next_session(timeout=5)
            l_in = await inbound.next_session(timeout=5)
            l_slow = await slow.next_session(timeout=5)
            ts = l_both.headers["x-fonoster-timestamp"]
            expected = hmac.new(SECRET.encode(), f"{ts}.{both.url}".encode(), hashlib.sha256)
            assert l_both.headers["x-fonoster-signature"] == expected.hexdigest()
            for listener in (l_both, l_in, l_slow):
                assert (await listener.wait_for("session.start", timeout=5)) == start
            l_slow.stop_reading = True
            await call.send_audio_ulaw(ulaw_encode(tone_pcm16(900, 400, 8000)))
            await session.send({"type": "speak", "id": "s", "text": "Hello listeners."})
            await session.send({"type": "bogus"})
            await session.send({"type": "speak", "id": "bad", "voice": "x/y", "text": "a"})
            done = await session.wait_for("output.done", timeout=10)
            assert (await l_both.wait_for("output.done", timeout=5)) == done
            assert (await l_in.wait_for("error", timeout=5))["relatesTo"] == "bad"
            await l_both.wait_until(lambda: len(l_both.track_audio(1)) > 6000, timeout=5)
            inbound_ids = {f[0] for f in l_in.audio}
            assert inbound_ids == {1}  # inbound only: the caller's track
            both_ids = {f[0] for f in l_both.audio}
            assert both_ids == {1, 2}  # both tracks, as separate frames: never mixed
            assert all(len(f) == 641 for f in l_both.audio)
            outbound = l_both.track_audio(2)
            assert len(outbound) > 16000  # what the caller heard, at 16 kHz pcm16
            # A listener that talks back gets read_only, and nothing reaches the call.
            await l_both.send({"type": "hangup", "id": "nope"})
            await l_both.send_binary(b"\x00" * 640)
            errs = [
                await l_both.wait_for(
                    lambda m: m["type"] == "error" and m["code"] == "read_only", timeout=5
                )
                for _ in range(2)
            ]
            assert {e["relatesTo"] for e in errs} == {"nope", "audio"}
            assert not session.of_type("session.end")
            await session.send({"type": "hangup", "id": "end"})
            assert (await l_both.wait_for("session.end", timeout=5))["reason"] == "app_hangup"
            assert (await l_in.wait_for("session.end", timeout=5))["id"] == "end"


def _app(ref: str, url: str, message: str | None = None) -> Any:
    from appbridge.config import AppConfig, Fallback

    return AppConfig(
        ref=ref,
        url=url,
        signing_secret=SECRET,
        fallback=Fallback(message=message) if message else None,
    )


def _reload(env: Env, apps: dict[str, Any]) -> None:
    import dataclasses

    env.gw.reload(dataclasses.replace(env.gw.config, apps=apps))
