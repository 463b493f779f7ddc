"""fonoster.session.v1 end to end on Twilio calls (docs/protocol-session-v1.md), over real loopback
sockets.

The gateway runs in-process; Twilio (webhook, Media Stream, REST API) and the app are the fakes of
``appbridge.testing``, which speak the wire formats independently of the gateway's codecs.
Real-time waits are bounded and generous: they check what happens, never how fast (the
benchmark measures speed).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid

from appbridge.http.metrics import render_metrics
from appbridge.testing.audio import dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from appbridge.testing.fake_app import FakeSession
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.integration.conftest import SECRET, Env, gateway_env

SENTENCE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."


async def connect(env: Env, **kw: object) -> tuple[FakeTwilioCall, FakeSession, dict]:
    call = await env.twilio.place_call("+15550001111", "+15550002222", **kw)  # type: ignore[arg-type]
    assert call.webhook_status == 200, call.twiml
    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    return call, session, start


def output_order(session: FakeSession) -> list[tuple[str, str]]:
    """The ``output.*`` events the app received, as (type, id), in order."""
    return [(m["type"], m["id"]) for m in session.messages if m["type"].startswith("output.")]


async def test_signed_request_and_every_session_start_field(env: Env) -> None:
    call, session, start = await connect(env)
    ts = session.headers["x-fonoster-timestamp"]
    assert abs(int(ts) - time.time()) < 300
    expected = hmac.new(SECRET.encode(), f"{ts}.{env.app.url}".encode(), hashlib.sha256)
    assert session.headers["x-fonoster-signature"] == expected.hexdigest()
    assert session.messages[0] is start  # always the first message
    assert start["protocol"] == "fonoster.session.v1"
    uuid.UUID(start["sessionRef"])
    assert start["callRef"] == call.call_sid
    assert start["appRef"] == "main"
    assert start["direction"] == "inbound"
    assert (start["from"], start["to"]) == ("+15550001111", "+15550002222")
    assert start["metadata"] == {}
    assert "handoff" in start and start["handoff"] is None
    assert start["audio"] == {"codec": "pcm16", "rate": 16000}
    assert start["tracks"] == [
        {"id": 1, "side": "inbound", "kind": "audio", "codec": "pcm16"},
        {"id": 2, "side": "outbound", "kind": "audio", "codec": "pcm16"},
    ]
    assert start["speech"] == {"voice": "local/en-US", "language": "en-US"}
    assert call.webhook_content_type.startswith("text/xml")


async def test_caller_audio_arrives_as_track_frames_in_the_session_format(env: Env) -> None:
    call, session, _ = await connect(env)
    await call.send_audio_ulaw(ulaw_encode(tone_pcm16(1000, 600, 8000)))
    await session.wait_until(lambda: len(session.audio) >= 25, timeout=5)
    frames = session.audio[:25]
    assert all(f[0] == 1 for f in frames)
    assert all(len(f) == 1 + 640 for f in frames)  # 20 ms of pcm16 at 16 kHz
    pcm = b"".join(f[1:] for f in frames[5:25])
    assert abs(dominant_freq(pcm, 16000) - 1000) < 30


async def test_pcmu_sessions_get_pcmu_frames() -> None:
    def apps(app):  # type: ignore[no-untyped-def]
        return [
            {
                "ref": "u",
                "url": app.url,
                "signing_secret": SECRET,
                "audio": {"codec": "pcmu", "rate": 8000},
            }
        ]

    async with gateway_env(apps) as env:
        call, session, start = await connect(env)
        assert start["audio"] == {"codec": "pcmu", "rate": 8000}
        tone = ulaw_encode(tone_pcm16(500, 400, 8000))
        await call.send_audio_ulaw(tone)
        await session.wait_until(lambda: len(session.audio) >= 15, timeout=5)
        assert all(len(f) == 161 and f[0] == 1 for f in session.audio[:15])
        pcm = ulaw_decode(b"".join(f[1:] for f in session.audio[2:15]))
        assert abs(dominant_freq(pcm, 8000) - 500) < 30


async def test_streamed_speak_pieces_make_one_utterance(env: Env) -> None:
    call, session, _ = await connect(env)
    for piece in ("Hello, ", "this is one ", "streamed sentence. ", "And a second one."):
        await session.send({"type": "speak", "id": "u1", "text": piece, "last": False})
    await session.send({"type": "speak", "id": "u1", "text": "", "last": True})
    done = await session.wait_for("output.done", timeout=15)
    assert done["id"] == "u1" and done["heardMs"] > 1500
    started = session.of_type("output.started")
    assert [m["id"] for m in started] == ["u1"]
    assert len(call.heard_ulaw()) / 8000 > 1.5
    assert session.of_type("error") == []


async def test_a_repeated_sentence_plays_whole_from_the_tts_cache(env: Env) -> None:
    call, session, _ = await connect(env)
    cache = env.gw.catalog.tts_cache
    assert cache is not None
    text = "Your call matters to us, please stay on the line."
    heard_ms: list[int] = []
    hits, misses = cache.stats.hits, cache.stats.misses
    for item in ("first", "kept", "cached"):
        await session.send({"type": "speak", "id": item, "text": text})
        done = await session.wait_for(
            lambda m, i=item: m.get("type") == "output.done" and m["id"] == i, timeout=15
        )
        heard_ms.append(done["heardMs"])
    # Asked for twice, then kept: the third is played from memory.
    assert (cache.stats.misses, cache.stats.hits) == (misses + 2, hits + 1)
    assert heard_ms[0] > 1500 and abs(heard_ms[2] - heard_ms[1]) <= 40
    assert len(call.heard_ulaw()) / 8000 > 3 * 1.5
    metrics = render_metrics(env.gw)
    assert 'appbridge_tts_cache_requests_total{result="hit"} ' in metrics
    assert session.of_type("error") == []


async def test_unknown_voice_is_invalid_catalog_id(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "speak", "id": "v1", "text": "hi", "voice": "nope/nothing"})
    err = await session.wait_for("error", timeout=5)
    assert err["code"] == "invalid_catalog_id" and err["relatesTo"] == "v1"
    assert err["fatal"] is False
    await session.send({"type": "speak", "id": "v2", "text": "hi", "language": "xx-YY"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "v2", timeout=5)
    assert err["code"] == "invalid_catalog_id"
    # Without an id, relatesTo is the command's type (docs/protocol-session-v1.md), not an id the
    # gateway made up and the app never saw.
    await session.send({"type": "speak", "text": "hi", "voice": "nope/nothing"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "speak", timeout=5)
    assert err["code"] == "invalid_catalog_id"


async def test_voice_and_language_overrides(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send(
        {
            "type": "speak",
            "id": "es",
            "text": "Hola, buenos días.",
            "voice": "local/es-ES",
            "language": "es-ES",
        }
    )
    done = await session.wait_for("output.done", timeout=15)
    assert done["id"] == "es"


async def test_app_audio_joins_the_queue_without_output_events_and_marks_follow_it(
    env: Env,
) -> None:
    call, session, _ = await connect(env)
    await session.send_binary(tone_pcm16(700, 600, 16000))
    await session.send({"type": "mark", "name": "after-audio", "id": "mk"})
    mark = await session.wait_for("mark", timeout=5)
    assert mark == {"type": "mark", "name": "after-audio", "cleared": False, "id": "mk"}
    heard = ulaw_decode(call.heard_ulaw())
    assert 0.5 <= len(heard) / 2 / 8000 <= 0.7
    assert abs(dominant_freq(heard, 8000) - 700) < 30
    assert not [m for m in session.messages if m["type"].startswith("output.")]


async def test_clear_empties_the_queue_tells_twilio_and_clears_marks(env: Env) -> None:
    call, session, _ = await connect(env)
    await session.send_binary(tone_pcm16(440, 5000, 16000))
    await session.send({"type": "mark", "name": "m1"})
    await session.send({"type": "speak", "id": "later", "text": "never heard"})
    await call.wait_until(lambda: call.first_audio_at() is not None, timeout=5)
    await asyncio.sleep(0.3)
    t_clear = time.monotonic()
    await session.send({"type": "clear"})
    mark = await session.wait_for("mark", timeout=5)
    assert mark == {"type": "mark", "name": "m1", "cleared": True}
    interrupted = await session.wait_for("output.interrupted", timeout=5)
    assert interrupted == {
        "type": "output.interrupted",
        "id": "later",
        "heardText": "",
        "heardMs": 0,
    }
    await call.wait_until(lambda: call.clears_received >= 1, timeout=5)
    await asyncio.sleep(0.3)
    silent_at = call.silence_after(t_clear)
    assert silent_at is not None
    # Nothing after the clear is audible: less than a second of the 5 s tone played in all.
    assert len(call.heard_ulaw()) < 8000 * 1.5
    assert session.of_type("output.started") == []


async def test_interrupted_speech_reports_heard_text_and_ms(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "speak", "id": "long", "text": SENTENCE})
    await session.wait_for("output.started", timeout=10)
    await asyncio.sleep(1.5)
    await session.send({"type": "clear", "id": "c1"})
    ev = await session.wait_for("output.interrupted", timeout=5)
    assert ev["id"] == "long"
    assert 1000 <= ev["heardMs"] <= 3000
    words = ev["heardText"].split()
    assert words, ev
    assert SENTENCE.split()[: len(words)] == words
    assert len(words) < len(SENTENCE.split())


async def test_preempt_interrupts_the_playing_item_and_keeps_the_rest(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "speak", "id": "a", "text": SENTENCE})
    await session.send({"type": "speak", "id": "c", "text": "Queued behind."})
    await session.wait_for("output.started", timeout=10)
    await asyncio.sleep(0.5)
    await session.send({"type": "speak", "id": "b", "text": "Urgent.", "preempt": True})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "c", timeout=15)
    assert output_order(session) == [
        ("output.started", "a"),
        ("output.interrupted", "a"),
        ("output.started", "b"),
        ("output.done", "b"),
        ("output.started", "c"),
        ("output.done", "c"),
    ]


async def test_preempt_ends_a_streamed_speak_whose_pieces_keep_coming(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "speak", "id": "s", "text": f"{SENTENCE} ", "last": False})
    await session.wait_for("output.started", timeout=10)
    await session.send({"type": "speak", "id": "b", "text": "Urgent.", "preempt": True})
    await session.wait_for(lambda m: m["type"] == "output.interrupted", timeout=10)
    # The app streams on, as an LLM does before it notices: those pieces belong to the
    # utterance the preempt cut off, and are dropped as after a clear, however late they come.
    await session.send({"type": "speak", "id": "s", "text": "And more words. ", "last": False})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "b", timeout=15)
    await session.send({"type": "speak", "id": "s", "text": "The end.", "last": True})
    await session.send({"type": "mark", "name": "after"})
    await session.wait_for(lambda m: m["type"] == "mark" and m["name"] == "after", timeout=10)
    assert output_order(session) == [
        ("output.started", "s"),
        ("output.interrupted", "s"),
        ("output.started", "b"),
        ("output.done", "b"),
    ]
    assert session.of_type("error") == []
    # The id is free again once its last piece came: a new utterance under it plays.
    await session.send({"type": "speak", "id": "s", "text": "A new one."})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "s", timeout=15)


async def test_queue_full_past_120_seconds(env: Env) -> None:
    _, session, _ = await connect(env)
    second = tone_pcm16(300, 1000, 16000)
    for _ in range(125):
        await session.send_binary(second)
    err = await session.wait_for("error", timeout=10)
    assert err["code"] == "queue_full" and err["relatesTo"] == "audio"
    await session.send({"type": "speak", "id": "big", "text": "one more"})
    err = await session.wait_for(lambda m: m.get("relatesTo") == "big", timeout=10)
    assert err["code"] == "queue_full"
    await session.send({"type": "clear"})
    await session.send({"type": "speak", "id": "ok", "text": "fine again"})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "ok", timeout=15)


async def test_dtmf_from_the_caller(env: Env) -> None:
    call, session, _ = await connect(env)
    await call.send_dtmf("7")
    ev = await session.wait_for("dtmf", timeout=5)
    assert ev == {"type": "dtmf", "digit": "7"}


async def test_unknown_types_and_fields_are_ignored(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "future.command", "x": 1})
    await session.send({"type": "speak", "id": "s", "text": "ok", "futureField": {"a": 1}})
    await session.wait_for("output.done", timeout=10)
    assert session.of_type("error") == []


async def test_subscribe_and_listen_update_are_answered_plainly(env: Env) -> None:
    _, session, _ = await connect(env)
    await session.send({"type": "subscribe", "events": ["turn.estimate"]})
    await session.send({"type": "listen.update", "id": "lu", "language": "zz-ZZ"})
    err = await session.wait_for("error", timeout=5)
    assert err["code"] == "invalid_catalog_id" and err["relatesTo"] == "lu"
