"""The voice SDK end to end with the gateway's real turn events, and over the SIP carrier.

The scripted turn events of tests/unit/test_sdk_server.py are replaced here by the gateway's own
ears (VAD, the offline STT and the turn detector, appbridge/calls/listening.py): a synthesised
caller speaks through the fake Twilio ingress, as in tests/integration/test_turns.py, and the SDK
turns what the gateway emits into ``gather`` results (docs/protocol-session-v1.md, "Turn and
transcript events") and automatic barge-in (docs/protocol-session-v1.md, "Interruptions": the
gateway keeps playing; the app sends ``clear``).

The last test is one SDK call through the inbound SIP carrier with real sipp as the caller (the
approach of tests/integration/test_sip_sipp.py): the app reads ``from``/``to`` taken from the SIP
headers (docs/sip.md, "Inbound calls"), speaks, and hangs up, which must reach sipp as a BYE.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from appbridge.sdk import AppServer, Session, TurnEnded, TurnUserStarted
from appbridge.testing import FakeApp
from appbridge.testing.fake_twilio import FakeTwilioCall
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import SECRET, make_config
from tests.integration.sipp_support import SIPP
from tests.integration.test_sdk import SENTENCE, SdkEnv, sdk_env
from tests.integration.test_sip_sipp import PCAPS, SipEnv, run_sipp
from tests.integration.test_turns import synthesise_ulaw, wer

pytestmark = pytest.mark.timeout(90)

QUESTION = "Hello, this is the bank. How can I help you today?"
ANSWER = "I would like to pay my phone bill today."  # WER 0 in every frame alignment
INTERRUPTION = "Sorry, can I stop you there for a moment?"
SIP_ROUTED = "+15550001111"


@pytest.fixture
async def sdk() -> AsyncIterator[SdkEnv]:
    async with sdk_env() as e:
        yield e


async def _heard_out(call: FakeTwilioCall, quiet_s: float = 0.4) -> None:
    """Waits until the caller heard the first item out: audio began, then ``quiet_s`` of silence
    (not one silent tick, which a partial first frame also gives)."""
    quiet_frames = round(quiet_s / 0.020)

    def done() -> bool:
        if call.first_audio_at() is None:
            return False
        tail = call.heard_frames()[-quiet_frames:]
        return len(tail) == quiet_frames and not any(n for _, _, n in tail)

    await call.wait_until(done, timeout=15)


def _assert_prefix(heard_text: str, sentence: str) -> list[str]:
    words = heard_text.split()
    assert words, "nothing was heard before the interruption"
    assert sentence.split()[: len(words)] == words, heard_text
    assert len(words) < len(sentence.split()), "the whole sentence was heard"
    return words


# ---------------------------------------------------------------- gather(speech=True)
async def test_gather_with_a_prompt_returns_the_spoken_answer(sdk: SdkEnv) -> None:
    call, session = await sdk.call(continuous_media=True)
    await session.listen(patience="low")
    answer_ulaw = await synthesise_ulaw(ANSWER)
    gathering = asyncio.create_task(session.gather(prompt=QUESTION, timeout_s=10))
    await _heard_out(call)  # the caller waits for the question to end, then answers
    await call.send_audio_ulaw(answer_ulaw)
    result = await asyncio.wait_for(gathering, 30)
    assert result.kind == "speech", result
    assert wer(ANSWER, result.text) <= 0.35, result.text
    assert result.turn is not None and result.turn.abandoned is False
    assert result.turn.duration_ms > 1000
    assert call.clears_received == 0  # the prompt had ended: nothing to stop


async def test_an_answer_over_the_prompt_stops_it_and_is_gathered(sdk: SdkEnv) -> None:
    call, session = await sdk.call(continuous_media=True)
    await session.listen(patience="low")
    answer_ulaw = await synthesise_ulaw(ANSWER)
    prompt = session.say(SENTENCE)  # long: the caller will not wait for its end
    gathering = asyncio.create_task(session.gather(prompt=prompt, timeout_s=10))
    assert await asyncio.wait_for(prompt.wait_started(), 10)
    await asyncio.sleep(0.8)
    await call.send_audio_ulaw(answer_ulaw)
    heard = await asyncio.wait_for(prompt, 15)
    assert heard.interrupted
    _assert_prefix(heard.heard_text, SENTENCE)
    result = await asyncio.wait_for(gathering, 30)
    assert result.kind == "speech" and wer(ANSWER, result.text) <= 0.35, result.text
    assert call.clears_received >= 1


# ---------------------------------------------------------------- automatic barge-in
async def test_caller_speech_barges_in_on_an_interruptible_say(sdk: SdkEnv) -> None:
    call, session = await sdk.call(continuous_media=True)
    interruption = await synthesise_ulaw(INTERRUPTION)
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.0)
    spoke_at = time.monotonic()
    await call.send_audio_ulaw(interruption)
    result = await asyncio.wait_for(out, 15)
    assert result.interrupted and result.heard_ms >= 800
    _assert_prefix(result.heard_text, SENTENCE)
    # The SDK's clear reached Twilio (docs/protocol-session-v1.md, ``clear``: the gateway forwards
    # it), after the caller began to speak, and nothing of the sentence played on after it.
    await call.wait_until(lambda: call.clears_received >= 1, timeout=5)
    assert call.clears_received == 1 and call.clear_times[0] > spoke_at
    cleared_at = call.clear_times[0]
    await asyncio.sleep(0.3)
    late = [n for t, _, n in call.heard_frames() if t >= cleared_at + 0.06 and n]
    assert late == []
    # The caller's turn still ends normally and reaches the app as an event.
    async with asyncio.timeout(20):
        async for event in session:
            if isinstance(event, TurnEnded):
                break


async def test_without_auto_barge_in_the_say_plays_on(sdk: SdkEnv) -> None:
    call, session = await sdk.call(continuous_media=True)
    session.auto_barge_in = False
    interruption = await synthesise_ulaw(INTERRUPTION)
    out = session.say(SENTENCE)
    assert await asyncio.wait_for(out.wait_started(), 10)
    await asyncio.sleep(1.0)
    await call.send_audio_ulaw(interruption)
    async with asyncio.timeout(15):
        async for event in session:
            if isinstance(event, TurnUserStarted):
                break
    assert not out.done()  # the caller is talking over the sentence
    result = await asyncio.wait_for(out, 20)
    assert result.done and result.heard_ms > 3000
    assert call.clears_received == 0


# ---------------------------------------------------------------- over SIP, with sipp
async def test_an_sdk_call_over_sip_says_and_hangs_up(tmp_path: Path) -> None:
    if SIPP is None:  # test_sip_sipp already failed the run under CI=true
        pytest.skip("sipp missing: run deploy/install-test-peers.sh")
    sessions: asyncio.Queue[Session] = asyncio.Queue()

    async def handler(session: Session) -> None:
        sessions.put_nowait(session)
        await session.wait_closed()

    server = await AppServer(handler, secrets=SECRET).serve()
    sock = bind_loopback()
    config = make_config(
        sock.getsockname()[1],
        "http://127.0.0.1:9",
        [{"ref": "main", "url": server.url, "signing_secret": SECRET}],
        numbers=[{"number": SIP_ROUTED, "app": "main"}],
        sip={"listen": ["udp:127.0.0.1:5060"], "rtp_ports": [41800, 41899]},
    )
    assert config.sip is not None
    # Port 0 (any free port) bypasses the validator on purpose: tests must not collide.
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("udp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            # run_sipp reads only the SIP port of its environment.
            env = SipEnv(gw, FakeApp(secret=SECRET), gw.sip.transport.udp_addresses[0][1])
            sipp = asyncio.create_task(
                run_sipp(
                    env,
                    "uac_gateway_bye.xml",
                    SIP_ROUTED,
                    tmp_path,
                    pcap=str(PCAPS / "g711a.pcap"),
                )
            )
            session = await asyncio.wait_for(sessions.get(), 10)
            assert (session.from_, session.to, session.direction) == (
                "+15551230002",
                SIP_ROUTED,
                "inbound",
            )
            assert session.call_ref.startswith("CA") and len(session.call_ref) == 34
            said = await asyncio.wait_for(session.say("Thank you for calling. Goodbye."), 15)
            assert said.done and said.heard_ms > 1000
            assert await asyncio.wait_for(session.hangup(), 10) == "app_hangup"
            rc, log = await asyncio.wait_for(sipp, 40)
            assert rc == 0, log  # sipp got the BYE and answered it 200
            assert session.closed
            assert gw.sip.inbound.rejected == {}
            assert gw.metrics.calls_ended.get("app_hangup") == 1
    finally:
        await server.close()
