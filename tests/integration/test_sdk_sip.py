"""The voice SDK against the real gateway over loopback, through the SIP carrier (docs/sdk.md).

tests/integration/test_sdk.py covers every SDK method on calls from the fake Twilio carrier;
this module covers them on SIP calls. The caller is :class:`appbridge.caller.sip.SipTestCaller`
(the gateway's own SIP cores playing the UAC: RTP both ways, RFC 4733 keypresses both ways,
BYE), so no outside peer is needed, except for transfers: there a sipp UAS on the configured
trunk plays the new party (tests/integration/sdk_sip_support.py has the scenario). Each test
places one call and checks both ends: what the app's :class:`Session` reports, and what the
caller heard (pcm16 8 kHz) or received.

One gateway, two SDK apps and a WAV server are shared by the whole module (module-scoped event
loop); every call gets its own caller number, by which its session is found, so nothing leaks
between tests.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from appbridge.caller.sip import SipTestCaller
from appbridge.sdk import (
    AudioFrame,
    DtmfEvent,
    InvalidCatalogId,
    OnHold,
    PlayFetchFailed,
    SessionClosed,
    TranscriptPartial,
    TransferFailed,
    TurnEnded,
    TurnEstimate,
    TurnUserStarted,
)
from appbridge.testing.audio import dominant_freq, rms_pcm16, tone_pcm16, ulaw_decode
from tests.integration.sdk_sip_support import (
    BUSY_UAS,
    MUSIC_HZ,
    PARTY,
    PARTY_HZ,
    PARTY_UAS,
    ROUTED,
    ReferringCaller,
    SdkSipEnv,
    at_s,
    frames_8k,
    hear_on,
    is_silent,
    run_sipp_uas,
    sdk_sip_env,
    sipp_listening,
    voiced_s,
    voiced_span_s,
)
from tests.integration.sipp_support import SIPP
from tests.integration.test_turns import synthesise_ulaw, wer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.asyncio(loop_scope="module"),
]

SENTENCE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
QUESTION = "Hello, this is the bank. How can I help you today?"
ANSWER = "I would like to pay my phone bill today."  # WER 0 in every frame alignment
INTERRUPTION = "Sorry, can I stop you there for a moment?"
TALK = "I would like to check the balance of my savings account please."
CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[SdkSipEnv]:
    async with sdk_sip_env() as e:
        yield e


@pytest_asyncio.fixture(loop_scope="module")
async def caller(env: SdkSipEnv) -> AsyncIterator[SipTestCaller]:
    c = env.caller()
    try:
        yield c
    finally:
        await c.close()


def need_sipp() -> None:
    """Transfers need sipp as the new party: a missing sipp fails under CI=true."""
    if SIPP is None:
        if CI:
            pytest.fail("CI=true and sipp is missing: run deploy/install-test-peers.sh")
        pytest.skip("sipp missing: run deploy/install-test-peers.sh")


async def speech_8k(text: str) -> bytes:
    """eSpeak-synthesised speech as a phone line carries it (pcm16 8 kHz)."""
    return ulaw_decode(await synthesise_ulaw(text))


async def heard_out(caller: SipTestCaller, quiet_s: float = 0.4, timeout_s: float = 15) -> None:
    """Waits until the caller heard something, then ``quiet_s`` of silence."""
    quiet = round(quiet_s / 0.020)

    def done() -> bool:
        frames = frames_8k(caller.heard())
        if not any(rms_pcm16(f) >= 150 for f in frames):
            return False
        return len(frames) >= quiet and all(rms_pcm16(f) < 150 for f in frames[-quiet:])

    await caller.wait_until(done, timeout_s)


def assert_prefix(heard_text: str, sentence: str) -> None:
    words = heard_text.split()
    assert words, "nothing was heard before the interruption"
    assert sentence.split()[: len(words)] == words, heard_text
    assert len(words) < len(sentence.split()), "the whole sentence was heard"


# ------------------------------------------------------------------ start data
async def test_start_data_comes_from_the_sip_headers(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    assert (session.from_, session.to, session.direction) == (caller.from_user, ROUTED, "inbound")
    assert session.metadata == {} and session.handoff_payload is None
    assert session.app_ref == "main"
    assert session.call_ref.startswith("CA") and len(session.call_ref) == 34
    assert (session.audio.codec, session.audio.rate) == ("pcm16", 16000)
    # The caller saw 100, then 180 while the app was dialed, then the 200 (docs/sip.md, "Inbound
    # calls").
    assert {e.status for e in caller.history if e.kind == "provisional"} >= {100, 180}
    assert caller.status == 200 and not caller.ended


# ------------------------------------------------------------------ output
async def test_say_is_heard_for_as_long_as_it_lasts(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    before = len(caller.heard())
    result = await asyncio.wait_for(session.say("Hello from the SDK, over SIP."), 15)
    assert result.done and result.heard_ms > 800
    await hear_on(caller)  # the last packets through the caller's jitter buffer
    heard = caller.heard()[before:]
    assert abs(voiced_span_s(heard) - result.heard_ms / 1000) < 0.3, voiced_span_s(heard)
    assert max(rms_pcm16(f) for f in frames_8k(heard)) > 1000


async def test_clear_interrupts_say_and_the_caller_hears_silence(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.2)
    await session.clear()
    cleared_at = len(caller.heard())
    result = await asyncio.wait_for(out, 5)
    assert result.interrupted and 800 <= result.heard_ms <= 3000, result
    assert_prefix(result.heard_text, SENTENCE)
    await asyncio.sleep(0.5)
    heard = caller.heard()
    assert voiced_s(heard[:cleared_at]) > 0.5  # the sentence was playing
    # docs/protocol-session-v1.md, ``clear``: silence within 40 ms; 160 ms allows for the caller's
    # jitter buffer.
    assert is_silent(heard[cleared_at + at_s(0.16) :])


async def test_preempt_plays_first_and_an_unknown_voice_raises(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    first = session.say(SENTENCE)
    queued = session.say("Queued behind.")
    assert await asyncio.wait_for(first.wait_started(), 10)
    urgent = session.say("Urgent.", preempt=True)
    interrupted = await asyncio.wait_for(first, 10)
    assert interrupted.interrupted and interrupted.heard_ms < 3000
    assert (await asyncio.wait_for(urgent, 10)).done
    assert (await asyncio.wait_for(queued, 10)).done
    with pytest.raises(InvalidCatalogId):
        await asyncio.wait_for(session.say("hi", voice="nope/nothing"), 5)
    await hear_on(caller)
    assert voiced_s(caller.heard()) > 1.0


async def test_say_stream_is_one_utterance(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)

    async def tokens() -> AsyncIterator[str]:
        for piece in ("Hello, ", "this is one ", "streamed sentence. ", "And a second one."):
            await asyncio.sleep(0.02)
            yield piece

    before = len(caller.heard())
    result = await asyncio.wait_for(session.say_stream(tokens()), 15)
    assert result.done and result.heard_ms > 1500
    await hear_on(caller)
    assert voiced_span_s(caller.heard()[before:]) > 1.5


async def test_play_and_a_play_that_cannot_be_fetched(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    before = len(caller.heard())
    played = await asyncio.wait_for(session.play(f"{env.media_url}/tone.wav"), 10)
    assert played.done and abs(played.heard_ms - 800) <= 40  # the gateway played all of it
    await hear_on(caller)
    heard = caller.heard()[before:]
    # The whole 0.8 s is asserted on the gateway's side (heard_ms, above). What the test
    # caller plays out comes through its own real-time jitter buffer, on the test's loop: when
    # a loaded machine stalls that loop, packets arrive late and are dropped there (full CI
    # runs kept 0.68 s and, on 2 December 2026, 0.52 s). So here: the tone reached the caller,
    # a good part of it, and never more than was played.
    assert 0.3 <= voiced_s(heard) <= 0.9
    assert abs(dominant_freq(heard, 8000) - MUSIC_HZ) < 20
    with pytest.raises(PlayFetchFailed):
        await asyncio.wait_for(session.play(f"{env.media_url}/missing.wav"), 10)


async def test_send_audio_then_a_mark(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    before = len(caller.heard())
    await session.send_audio(tone_pcm16(700, 600, 16000, amplitude=8000))
    mark = await asyncio.wait_for(session.mark("after-audio"), 5)
    assert mark.name == "after-audio" and mark.cleared is False
    await hear_on(caller)
    heard = caller.heard()[before:]
    assert 0.5 <= voiced_s(heard) <= 0.7
    assert abs(dominant_freq(heard, 8000) - 700) < 20


# ------------------------------------------------------------------ input
async def test_gather_rfc4733_digits_by_terminator_and_by_count(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    gathering = asyncio.create_task(session.gather(timeout_s=10, speech=False))
    await asyncio.sleep(0.1)
    await caller.send_digits("123#")
    result = await asyncio.wait_for(gathering, 10)
    assert (result.kind, result.digits, result.terminator) == ("dtmf", "123", "#")
    gathering = asyncio.create_task(session.gather(timeout_s=10, max_digits=2, speech=False))
    await asyncio.sleep(0.1)
    await caller.send_digits("45")
    result = await asyncio.wait_for(gathering, 10)
    assert (result.kind, result.digits, result.terminator) == ("dtmf", "45", None)
    # A key during a prompt stops the prompt (the caller hears silence) and is the answer.
    prompt = session.say(SENTENCE)
    gathering = asyncio.create_task(session.gather(prompt=prompt, max_digits=1))
    assert await asyncio.wait_for(prompt.wait_started(), 10)
    await asyncio.sleep(0.8)
    await caller.send_digits("9")
    result = await asyncio.wait_for(gathering, 10)
    assert (result.kind, result.digits) == ("dtmf", "9")
    assert (await asyncio.wait_for(prompt, 5)).interrupted
    stopped_at = len(caller.heard())
    await asyncio.sleep(0.5)
    assert is_silent(caller.heard()[stopped_at + at_s(0.16) :])
    timed_out = await asyncio.wait_for(session.gather(timeout_s=0.3, speech=False), 5)
    assert timed_out.timed_out


async def test_gather_by_speech_with_the_local_stt(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    await session.listen(patience="low")
    answer = await speech_8k(ANSWER)
    gathering = asyncio.create_task(session.gather(prompt=QUESTION, timeout_s=10))
    await heard_out(caller)  # the caller waits for the question to end, then answers
    await caller.send_audio(answer)
    result = await asyncio.wait_for(gathering, 30)
    assert result.kind == "speech", result
    assert wer(ANSWER, result.text) <= 0.5, result.text
    assert result.turn is not None and result.turn.abandoned is False
    assert result.turn.duration_ms > 1000


async def test_caller_speech_barges_in_and_the_caller_hears_silence(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    interruption = await speech_8k(INTERRUPTION)
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.0)
    await caller.send_audio(interruption, wait=False)
    result = await asyncio.wait_for(out, 15)
    stopped_at = len(caller.heard())
    assert result.interrupted and result.heard_ms >= 800, result
    assert_prefix(result.heard_text, SENTENCE)
    await asyncio.sleep(0.5)
    assert is_silent(caller.heard()[stopped_at + at_s(0.16) :])
    async with asyncio.timeout(20):  # the caller's turn still reaches the app
        async for event in session:
            if isinstance(event, TurnEnded):
                break


async def test_without_auto_barge_in_the_say_plays_on(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    session.auto_barge_in = False
    interruption = await speech_8k(INTERRUPTION)
    before = len(caller.heard())
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.0)
    await caller.send_audio(interruption, wait=False)
    async with asyncio.timeout(15):
        async for event in session:
            if isinstance(event, TurnUserStarted):
                break
    assert not out.done()  # the caller is talking over the sentence
    result = await asyncio.wait_for(out, 20)
    assert result.done and result.heard_ms > 3000
    await hear_on(caller)
    assert abs(voiced_span_s(caller.heard()[before:]) - result.heard_ms / 1000) < 0.3


async def test_listen_and_subscribe_bring_partials_and_estimates(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    await session.listen(language="en-US", hints=["savings"], patience="low")
    await session.subscribe("turn.estimate", "transcript.partial")
    await asyncio.wait_for(session.mark("probe"), 5)  # both were accepted before this
    await caller.send_audio(await speech_8k(TALK), wait=False)
    seen: list[object] = []
    async with asyncio.timeout(30):
        async for event in session:
            if not isinstance(event, AudioFrame):
                seen.append(event)
            if isinstance(event, TurnEnded):
                break
    estimates = [e for e in seen if isinstance(e, TurnEstimate)]
    partials = [e for e in seen if isinstance(e, TranscriptPartial)]
    assert estimates and all(0.0 <= e.eot <= 1.0 for e in estimates)
    assert partials and all(p.text for p in partials)
    ended = seen[-1]
    assert isinstance(ended, TurnEnded)
    assert wer(TALK, ended.text) <= 0.5, ended.text


async def test_caller_audio_arrives_as_typed_frames(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    await caller.send_audio(tone_pcm16(1000, 600, 8000, amplitude=8000))
    await caller.send_digits("5")
    frames: list[AudioFrame] = []
    async with asyncio.timeout(10):
        async for event in session:
            if isinstance(event, AudioFrame):
                frames.append(event)
            elif isinstance(event, DtmfEvent):
                assert event.digit == "5"
                break
    assert {f.track_id for f in frames} == {1}
    assert all(len(f.data) == 640 for f in frames)  # 20 ms of pcm16 at 16 kHz
    loud = [f.data for f in frames if rms_pcm16(f.data) > 2000]
    assert 25 <= len(loud) <= 32  # 600 ms of tone
    assert abs(dominant_freq(b"".join(loud), 16000) - 1000) < 20


# ------------------------------------------------------------------ call control
async def test_hold_plays_music_refuses_commands_and_keys_still_arrive(
    env: SdkSipEnv, caller: SipTestCaller
) -> None:
    session = await env.call(caller)
    await session.hold(music=f"{env.media_url}/tone.wav")
    with pytest.raises(OnHold):
        await asyncio.wait_for(session.say("Not now."), 5)
    with pytest.raises(OnHold):
        await asyncio.wait_for(session.mark("m"), 5)
    held_at = len(caller.heard())
    await asyncio.sleep(1.0)
    music = caller.heard()[held_at:]
    assert voiced_s(music) > 0.7 and abs(dominant_freq(music, 8000) - MUSIC_HZ) < 20
    await caller.send_digits("7")
    async with asyncio.timeout(5):
        async for event in session:
            if isinstance(event, DtmfEvent):
                assert event.digit == "7"
                break
    await session.resume()
    resumed_at = len(caller.heard())
    assert (await asyncio.wait_for(session.say("Back with you now."), 10)).done
    said_at = len(caller.heard())
    await asyncio.sleep(0.5)
    assert voiced_s(caller.heard()[resumed_at:said_at]) > 0.5
    assert is_silent(caller.heard()[said_at + at_s(0.16) :])  # the music stopped on resume


async def test_dtmf_reaches_the_caller_as_rfc4733(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    await session.dtmf("123")
    await caller.wait_until(lambda: len(caller.received_digits) >= 3, 10)
    assert caller.received_digits == ["1", "2", "3"]
    assert [e.digit for e in caller.history if e.kind == "dtmf_received"] == ["1", "2", "3"]


async def test_handoff_to_a_second_sdk_app(env: SdkSipEnv, caller: SipTestCaller) -> None:
    first = await env.call(caller)
    end = await asyncio.wait_for(first.handoff("second", {"customer": 42}), 10)
    assert end.reason == "handoff" and first.closed
    second = await asyncio.wait_for(env.second_sessions.get(), 10)
    assert second.handoff_payload == {"customer": 42}
    assert (second.call_ref, second.from_) == (first.call_ref, caller.from_user)
    before = len(caller.heard())
    assert (await asyncio.wait_for(second.say("Second app here."), 10)).done
    await hear_on(caller)
    assert voiced_s(caller.heard()[before:]) > 0.4
    assert not caller.ended  # the call lives on across the handoff
    await caller.hangup()
    await asyncio.wait_for(second.wait_closed(), 5)
    assert second.end is not None and second.end.reason == "caller_hangup"


async def test_hangup_sends_the_caller_a_bye(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    assert await asyncio.wait_for(session.hangup(), 10) == "app_hangup"
    await caller.wait_ended(timeout_s=5)
    assert caller.hung_up_by == "remote"
    assert (await caller.wait_for("remote_hangup", timeout_s=1)).kind == "remote_hangup"
    assert session.closed


async def test_the_caller_hanging_up_mid_await(env: SdkSipEnv, caller: SipTestCaller) -> None:
    session = await env.call(caller)
    out = session.say(SENTENCE)
    gathering = asyncio.create_task(session.gather(timeout_s=60))
    assert await asyncio.wait_for(out.wait_started(), 10)
    await caller.hangup()
    assert caller.hung_up_by == "caller"
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(out, 5)
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(gathering, 5)
    assert session.end is not None and session.end.reason == "caller_hangup"
    with pytest.raises(SessionClosed):
        session.say("Too late.")


# ------------------------------------------------------------------ transfers
async def test_cold_transfer_bridges_the_caller_to_the_party(
    env: SdkSipEnv, caller: SipTestCaller, tmp_path: Path
) -> None:
    need_sipp()
    session = await env.call(caller)
    party = asyncio.create_task(run_sipp_uas(env, PARTY_UAS, tmp_path))
    await sipp_listening(env.party_port)
    end = await asyncio.wait_for(session.transfer(PARTY), 15)
    assert end.reason == "transfer" and session.closed
    assert not caller.ended  # the caller stays, now with the party
    bridged_at = len(caller.heard())
    await asyncio.sleep(1.0)
    heard = caller.heard()[bridged_at + at_s(0.2) :]
    assert voiced_s(heard) > 0.6 and abs(dominant_freq(heard, 8000) - PARTY_HZ) < 20
    await caller.hangup()
    rc, log = await asyncio.wait_for(party, 15)
    assert rc == 0, log  # the party got the gateway's BYE and answered it


async def test_cold_transfer_to_a_busy_party_fails_and_the_call_goes_on(
    env: SdkSipEnv, caller: SipTestCaller, tmp_path: Path
) -> None:
    need_sipp()
    session = await env.call(caller)
    party = asyncio.create_task(run_sipp_uas(env, BUSY_UAS, tmp_path))
    await sipp_listening(env.party_port)
    with pytest.raises(TransferFailed):
        await asyncio.wait_for(session.transfer(PARTY), 15)
    rc, log = await asyncio.wait_for(party, 15)
    assert rc == 0, log
    with pytest.raises(TransferFailed):  # not a trunk's host: refused before any dialing
        await asyncio.wait_for(session.transfer("sip:someone@203.0.113.9"), 5)
    before = len(caller.heard())
    assert (await asyncio.wait_for(session.say("Sorry, they are busy."), 10)).done
    await hear_on(caller)
    assert voiced_s(caller.heard()[before:]) > 0.5


async def test_warm_transfer_consults_then_completes(
    env: SdkSipEnv, caller: SipTestCaller, tmp_path: Path
) -> None:
    need_sipp()
    session = await env.call(caller)
    party = asyncio.create_task(run_sipp_uas(env, PARTY_UAS, tmp_path))
    await sipp_listening(env.party_port)
    waiting_at = len(caller.heard())
    transfer = session.transfer(PARTY, mode="warm")
    # The party answered when its audio reaches the app, in the caller's place.
    loud: list[bytes] = []
    async with asyncio.timeout(15):
        async for event in session:
            if isinstance(event, AudioFrame) and rms_pcm16(event.data) > 2000:
                loud.append(event.data)
                if len(loud) >= 10:
                    break
    assert abs(dominant_freq(b"".join(loud), 16000) - PARTY_HZ) < 20
    # The party's tone is a voice to the turn detector: interruptible=False keeps the SDK's
    # automatic barge-in from clearing this.
    intro = session.say("I have a caller for you.", interruptible=False)
    assert (await asyncio.wait_for(intro, 10)).done
    # Meanwhile the caller waited, hearing neither the party nor the app.
    assert is_silent(caller.heard()[waiting_at:])
    end = await asyncio.wait_for(transfer.complete(), 10)
    assert end.reason == "transfer" and session.closed
    bridged_at = len(caller.heard())
    await asyncio.sleep(1.0)
    heard = caller.heard()[bridged_at + at_s(0.2) :]
    assert voiced_s(heard) > 0.6 and abs(dominant_freq(heard, 8000) - PARTY_HZ) < 20
    await caller.hangup()
    rc, log = await asyncio.wait_for(party, 15)
    assert rc == 0, log


async def test_refer_transfer_hands_the_caller_over(env: SdkSipEnv) -> None:
    async with env.caller(ReferringCaller) as caller:
        assert isinstance(caller, ReferringCaller)
        session = await env.call(caller)
        end = await asyncio.wait_for(
            session.transfer(PARTY, mode="refer", headers={"X-Case": "42"}), 15
        )
        assert end.reason == "transfer" and session.closed
        assert len(caller.refers) == 1
        refer_to = caller.refers[0].headers.get("Refer-To") or ""
        assert refer_to.startswith(f"<sip:{PARTY}@127.0.0.1") and "X-Case=42" in refer_to
        await caller.wait_ended(timeout_s=5)  # the gateway's BYE after the final NOTIFY
        assert caller.hung_up_by == "remote"


async def test_refer_declined_by_the_caller_side_fails(env: SdkSipEnv) -> None:
    async with env.caller(ReferringCaller) as caller:
        assert isinstance(caller, ReferringCaller)
        caller.notify_status = 603
        session = await env.call(caller)
        with pytest.raises(TransferFailed):
            await asyncio.wait_for(session.transfer(PARTY, mode="refer"), 15)
        assert not caller.ended and not session.closed
        assert (await asyncio.wait_for(session.say("Still here."), 10)).done
