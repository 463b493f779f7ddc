"""The voice SDK against the real gateway, over loopback, on calls from the fake Twilio carrier.

The gateway runs in-process (``gateway_env``); its app URL points at an SDK ``AppServer``, which
replaces the FakeApp of the protocol tests. The handler hands each :class:`Session` to the test,
which drives it while the fake caller (``FakeTwilioCall``) hears, presses keys and hangs up.
Keypresses are gathered here end to end; speech turns from the gateway's own turn detector are
driven in tests/integration/test_sdk_e2e.py, and scripted ones in tests/unit/test_sdk_server.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from appbridge.sdk import (
    AppServer,
    AudioFrame,
    DtmfEvent,
    FeatureNotSupported,
    InvalidCatalogId,
    OnHold,
    PlayFetchFailed,
    Session,
    SessionClosed,
    TransferFailed,
)
from appbridge.testing.audio import decode_dtmf, dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from appbridge.testing.fake_app import fonoster_headers
from appbridge.testing.fake_twilio import FakeTwilioCall, LoopbackServer
from appbridge.testing.fake_twilio_outbound import Callee
from tests.integration.conftest import SECRET, Env, gateway_env
from tests.integration.test_bad_input import media_server  # noqa: F401  (fixture)

SENTENCE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."


class SdkEnv:
    def __init__(self, env: Env, server: AppServer) -> None:
        self.env = env
        self.server = server
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        self.handled = 0

    async def call(self, **kw: Any) -> tuple[FakeTwilioCall, Session]:
        call = await self.env.twilio.place_call("+15550001111", "+15550002222", **kw)
        assert call.webhook_status == 200, call.twiml
        session = await asyncio.wait_for(self.sessions.get(), 5)
        return call, session


@asynccontextmanager
async def sdk_env(
    handler: Callable[[Session], Awaitable[None]] | None = None,
    *,
    gateway_secret: str = SECRET,
    extra_apps: Callable[[], list[dict[str, Any]]] | None = None,
) -> AsyncIterator[SdkEnv]:
    holder: list[SdkEnv] = []

    async def run(session: Session) -> None:
        holder[0].handled += 1
        holder[0].sessions.put_nowait(session)
        if handler is not None:
            await handler(session)
        else:
            await session.wait_closed()

    server = await AppServer(run, secrets=SECRET).serve()

    def apps(_: object) -> list[dict[str, Any]]:
        own = [{"ref": "main", "url": server.url, "signing_secret": gateway_secret}]
        return own + (extra_apps() if extra_apps else [])

    try:
        async with gateway_env(apps) as env:
            holder.append(SdkEnv(env, server))
            yield holder[0]
    finally:
        await server.close()


@pytest.fixture
async def sdk() -> AsyncIterator[SdkEnv]:
    async with sdk_env() as e:
        yield e


async def test_start_data_of_a_signed_session(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    assert (session.from_, session.to, session.direction) == (
        "+15550001111",
        "+15550002222",
        "inbound",
    )
    assert session.call_ref == call.call_sid and session.app_ref == "main"
    assert session.metadata == {} and session.handoff_payload is None
    assert (session.audio.codec, session.audio.rate) == ("pcm16", 16000)


async def test_say_is_heard_and_reports_done(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    result = await asyncio.wait_for(session.say("Hello from the SDK."), 15)
    assert result.done and result.heard_ms > 500
    assert len(call.heard_ulaw()) / 8000 > 0.5


async def test_clear_interrupts_say_with_what_was_heard(sdk: SdkEnv) -> None:
    _, session = await sdk.call()
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.2)
    await session.clear()
    result = await asyncio.wait_for(out, 5)
    assert result.interrupted and 800 <= result.heard_ms <= 3000
    words = result.heard_text.split()
    assert words and SENTENCE.split()[: len(words)] == words


async def test_preempt_and_an_unknown_voice(sdk: SdkEnv) -> None:
    _, session = await sdk.call()
    first = session.say(SENTENCE)
    queued = session.say("Queued behind.")
    assert await asyncio.wait_for(first.wait_started(), 10)
    urgent = session.say("Urgent.", preempt=True)
    assert (await asyncio.wait_for(first, 10)).interrupted
    assert (await asyncio.wait_for(urgent, 10)).done
    assert (await asyncio.wait_for(queued, 10)).done
    with pytest.raises(InvalidCatalogId) as info:
        await asyncio.wait_for(session.say("hi", voice="nope/nothing"), 5)
    assert info.value.relates_to is not None and info.value.relates_to.startswith("sdk-say-")


async def test_say_stream_is_one_utterance(sdk: SdkEnv) -> None:
    call, session = await sdk.call()

    async def tokens() -> AsyncIterator[str]:
        for piece in ("Hello, ", "this is one ", "streamed sentence. ", "And a second one."):
            await asyncio.sleep(0.02)
            yield piece

    result = await asyncio.wait_for(session.say_stream(tokens()), 15)
    assert result.done and result.heard_ms > 1500
    assert len(call.heard_ulaw()) / 8000 > 1.5


def _pauses(ulaw: bytes, min_ms: int = 150) -> list[int]:
    """The silences of at least ``min_ms`` between sounds in 8 kHz µ-law, in 10 ms steps."""
    pcm = ulaw_decode(ulaw)
    runs, run, sounded = [], 0, False
    for i in range(0, len(pcm) // 160 * 160, 160):
        loud = max(abs(s) for s in pcm[i : i + 80 : 4]) >= 200
        if loud:
            if sounded and run * 10 >= min_ms:
                runs.append(run * 10)
            run, sounded = 0, True
        else:
            run += 1
    return runs


STREAMED = ("Hello there. ", "How are you today? ", "I can help with your order. ", "Goodbye.")


async def test_streamed_text_keeps_the_pauses_between_sentences() -> None:
    async def stream(session: Session) -> None:
        async def pieces() -> AsyncIterator[str]:
            for piece in STREAMED:
                await asyncio.sleep(0.3)  # each sentence arrives on its own
                yield piece

        await session.say_stream(pieces())
        await session.hangup()

    async def whole(session: Session) -> None:
        await session.say("".join(STREAMED))
        await session.hangup()

    heard = {}
    for name, handler in (("whole", whole), ("streamed", stream)):
        async with sdk_env(handler) as sdk:
            call, _ = await sdk.call()
            await call.wait_closed(timeout=20)
            heard[name] = _pauses(call.heard_ulaw())
    # Three sentence pauses of about 300 ms either way (speech/pauses.py).
    assert len(heard["whole"]) == 3, heard
    assert len(heard["streamed"]) == 3, heard
    assert all(250 <= ms <= 400 for ms in heard["streamed"]), heard


async def test_play_and_a_play_that_cannot_be_fetched(
    sdk: SdkEnv,
    media_server: LoopbackServer,  # noqa: F811
) -> None:
    _, session = await sdk.call()
    played = await asyncio.wait_for(session.play(f"{media_server.base_url}/tone.wav"), 10)
    assert played.done and abs(played.heard_ms - 800) <= 40
    with pytest.raises(PlayFetchFailed):
        await asyncio.wait_for(session.play(f"{media_server.base_url}/missing.wav"), 10)
    looping = session.play(f"{media_server.base_url}/tone.wav", loop=True)
    assert await asyncio.wait_for(looping.wait_started(), 10)
    await asyncio.sleep(1.0)
    session.clear()
    result = await asyncio.wait_for(looping, 5)
    assert result.interrupted and result.heard_ms > 800  # it went round at least once


async def test_send_audio_then_a_mark(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    await session.send_audio(tone_pcm16(700, 600, 16000))
    mark = await asyncio.wait_for(session.mark("after-audio"), 5)
    assert mark.name == "after-audio" and mark.cleared is False
    heard = ulaw_decode(call.heard_ulaw())
    assert 0.5 <= len(heard) / 2 / 8000 <= 0.7
    assert abs(dominant_freq(heard, 8000) - 700) < 30


async def test_events_caller_audio_frames_and_keys(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    await call.send_audio_ulaw(ulaw_encode(tone_pcm16(1000, 600, 8000)))
    await call.send_dtmf("5")
    frames: list[AudioFrame] = []
    async with asyncio.timeout(5):
        async for event in session:
            if isinstance(event, AudioFrame):
                frames.append(event)
            elif isinstance(event, DtmfEvent):
                assert event.digit == "5"
                break
    assert len(frames) >= 25 and {f.track_id for f in frames} == {1}
    assert all(len(f.data) == 640 for f in frames)
    pcm = b"".join(f.data for f in frames[5:25])
    assert abs(dominant_freq(pcm, 16000) - 1000) < 30


async def test_gather_digits_end_to_end(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    for digit in "123#":
        await call.send_dtmf(digit)
    result = await asyncio.wait_for(session.gather(timeout_s=10), 10)
    assert (result.kind, result.digits, result.terminator) == ("dtmf", "123", "#")
    task = asyncio.create_task(
        session.gather(prompt="Press a key now, please, any key will do.", max_digits=1)
    )
    await call.wait_until(lambda: call.first_audio_at() is not None, timeout=10)
    await call.send_dtmf("9")
    result = await asyncio.wait_for(task, 10)
    assert (result.kind, result.digits) == ("dtmf", "9")
    await call.wait_until(lambda: call.clears_received >= 1, timeout=5)  # the prompt stopped
    timed_out = await asyncio.wait_for(session.gather(timeout_s=0.3, speech=False), 5)
    assert timed_out.timed_out


async def test_listen_and_subscribe_are_accepted(sdk: SdkEnv) -> None:
    _, session = await sdk.call()
    await session.listen(language="es", hints=["Fonoster"], patience="high")
    await session.subscribe("turn.estimate", "transcript.partial")
    await asyncio.wait_for(session.mark("probe"), 5)
    assert (await asyncio.wait_for(session.say("Still fine."), 10)).done


async def test_hold_refuses_commands_until_resume(
    sdk: SdkEnv,
    media_server: LoopbackServer,  # noqa: F811
) -> None:
    call, session = await sdk.call()
    await session.hold(music=f"{media_server.base_url}/tone.wav")
    with pytest.raises(OnHold):
        await asyncio.wait_for(session.say("Not now."), 5)
    with pytest.raises(OnHold):
        await asyncio.wait_for(session.mark("m"), 5)
    await asyncio.sleep(0.5)
    music = ulaw_decode(call.heard_ulaw())
    assert abs(dominant_freq(music, 8000) - 600) < 30
    await session.resume()
    assert (await asyncio.wait_for(session.say("Back."), 10)).done


async def test_dtmf_is_sent_as_tones(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    await session.dtmf("19#")
    await asyncio.wait_for(session.mark("after"), 10)
    assert decode_dtmf(ulaw_decode(call.heard_ulaw()), 8000) == "19#"


async def test_cold_transfer_and_its_failures(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    sdk.env.rest.fail_next(400, 21211)
    with pytest.raises(TransferFailed):
        await asyncio.wait_for(session.transfer("+15557654321"), 10)
    with pytest.raises(FeatureNotSupported):  # REFER is SIP signalling
        await asyncio.wait_for(session.transfer("+15557654321", mode="refer"), 10)
    sdk.env.rest.dialer.default_callee = Callee("busy")  # a warm transfer to a busy party
    with pytest.raises(TransferFailed):
        await asyncio.wait_for(session.transfer("+15557654321", mode="warm"), 10)
    end = await asyncio.wait_for(session.transfer("+15557654321"), 10)
    assert end.reason == "transfer"
    twiml = [r.form["Twiml"] for r in sdk.env.rest.requests if r.form.get("Twiml")]
    assert "<Dial><Number>+15557654321</Number></Dial>" in twiml[-1]
    await call.wait_closed(timeout=5)
    assert session.closed


async def test_handoff_to_another_sdk_app() -> None:
    second_sessions: asyncio.Queue[Session] = asyncio.Queue()

    async def second_handler(session: Session) -> None:
        second_sessions.put_nowait(session)
        await session.wait_closed()

    second = await AppServer(second_handler, secrets=SECRET).serve()
    try:

        def extra() -> list[dict[str, Any]]:
            return [{"ref": "second", "url": second.url, "signing_secret": SECRET}]

        async with sdk_env(extra_apps=extra) as sdk:
            call, first = await sdk.call()
            end = await asyncio.wait_for(first.handoff("second", {"customer": 42}), 10)
            assert end.reason == "handoff"
            session2 = await asyncio.wait_for(second_sessions.get(), 5)
            assert session2.handoff_payload == {"customer": 42}
            assert session2.call_ref == call.call_sid
            assert (await asyncio.wait_for(session2.say("Second app here."), 10)).done
    finally:
        await second.close()


async def test_hangup_and_a_handler_that_returns() -> None:
    async def polite(session: Session) -> None:
        await session.say("Goodbye.")

    async with sdk_env(polite) as sdk:
        call, _ = await sdk.call()
        await call.wait_closed(timeout=15)
        assert len(call.heard_ulaw()) > 2000  # the goodbye played before the hang-up
    async with sdk_env() as sdk:
        call, session = await sdk.call()
        assert await asyncio.wait_for(session.hangup(), 10) == "app_hangup"
        await call.wait_closed(timeout=5)


async def test_the_caller_hanging_up_mid_await(sdk: SdkEnv) -> None:
    call, session = await sdk.call()
    out = session.say(SENTENCE)
    gathering = asyncio.create_task(session.gather(timeout_s=60))
    await asyncio.sleep(0.5)
    await call.hangup()
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(out, 5)
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(gathering, 5)
    assert session.end is not None and session.end.reason == "caller_hangup"


async def test_a_gateway_with_the_wrong_secret_never_reaches_the_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="appbridge.calls.app_session")
    async with sdk_env(gateway_secret="not-the-apps-secret") as sdk:
        call = await sdk.env.twilio.place_call("+15550001111", "+15550002222")
        # The app answers 401: a refused signature does not heal, so it is not retried, and
        # the log says what happened. With no fallback the call ends.
        assert sdk.handled == 0 and sdk.server.refused == 1
        assert call.twiml_verbs == ["Hangup"] and not call.has_stream
    said = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(said) == 1 and "HTTP 401" in said[0] and "signature" in said[0], said


async def test_direct_bad_requests_get_401(sdk: SdkEnv) -> None:
    url = sdk.server.url
    for headers in (
        fonoster_headers("wrong", url),
        fonoster_headers(SECRET, url, timestamp=1_000_000_000),
        {},
    ):
        with pytest.raises(InvalidStatus) as info:
            await connect(url, additional_headers=headers)
        assert info.value.response.status_code == 401
    async with connect(url, additional_headers=fonoster_headers(SECRET, url)) as ws:
        await ws.send(json.dumps({"type": "speak", "text": "I am not the gateway"}))
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 1008
    assert sdk.handled == 0
