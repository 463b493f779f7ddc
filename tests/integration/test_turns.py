"""Turn events end to end (docs/turn-taking.md): a synthesised caller speaks through the Twilio
ingress; the gateway's VAD, the offline STT and the turn detector answer with ``turn.*`` events."""

from __future__ import annotations

import asyncio

import httpx

from appbridge.media.codecs import PCMU_8K, AudioFormat, Converter
from appbridge.speech.catalog import default_catalog
from appbridge.testing.audio import tone_pcm16, ulaw_encode
from appbridge.testing.wer import word_error_rate as wer
from bench.report import parse_metric
from tests.integration.conftest import Env
from tests.integration.test_session_protocol import connect


async def synthesise_ulaw(text: str) -> bytes:
    """The local TTS, resampled to what a phone line carries (µ-law 8 kHz)."""
    provider, voice, language = default_catalog().voice_for("local/en-US", None, None)
    pcm = b""
    rate = 22050
    async for chunk in provider.synthesize(text, voice, language):
        pcm += chunk.pcm16
        rate = chunk.rate_hz
    return Converter(AudioFormat("pcm16", rate), PCMU_8K).convert(pcm)


async def test_a_spoken_sentence_becomes_a_turn(env: Env) -> None:
    # A sentence tiny.en reads at WER 0 in every 20 ms alignment of the frames, band-limited or
    # not. Some others swing with the alignment: "... check the balance of my savings account
    # please" reads at 0.17 to 0.58 once the phone line's low-pass filter is applied.
    sentence = "Do you have any appointments available on Monday morning?"
    call, session, _ = await connect(env, continuous_media=True)
    await session.send({"type": "subscribe", "events": ["turn.estimate", "transcript.partial"]})
    await session.send({"type": "listen.update", "patience": "low"})
    await asyncio.sleep(0.3)
    await call.send_audio_ulaw(await synthesise_ulaw(sentence))
    started = await session.wait_for("turn.user_started", timeout=15)
    ended = await session.wait_for("turn.ended", timeout=20)
    assert started == {"type": "turn.user_started"}
    assert ended["abandoned"] is False and ended["language"].startswith("en")
    assert 0.0 <= ended["confidence"] <= 1.0 and ended["durationMs"] > 1500
    # The bar leaves room for a loaded machine, where segmentation can differ.
    assert wer(sentence, ended["text"]) <= 0.5, ended["text"]
    kinds = [m["type"] for m in session.messages if m["type"].startswith("turn.")]
    assert kinds.index("turn.user_started") < kinds.index("turn.ended")
    assert "turn.estimate" in kinds  # subscribed
    estimates = [m for m in session.messages if m["type"] == "turn.estimate"]
    assert all(0.0 <= e["eot"] <= 1.0 and e["kind"] in ("speech", "pause") for e in estimates)


async def test_a_backchannel_is_not_a_turn(env: Env) -> None:
    # An acknowledgment the model reads with margin on any CPU. eSpeak's "uh-huh." sits on the
    # no-speech rule's edge (probability 0.63-0.66 against 0.6; docs/turn-taking.md), so whether
    # it is heard turns on the CPU's int8 kernels; bench.bargein measures acknowledgments.
    call, session, _ = await connect(env, continuous_media=True)
    await asyncio.sleep(0.3)
    await call.send_audio_ulaw(await synthesise_ulaw("Okay."))
    back = await session.wait_for("turn.backchannel", timeout=15)
    assert back["text"]
    await asyncio.sleep(1.0)
    assert session.of_type("turn.user_started") == []


async def test_noise_without_words_is_abandoned_after_ten_seconds(env: Env) -> None:
    call, session, _ = await connect(env, continuous_media=True)
    await asyncio.sleep(0.3)
    # A buzz the VAD takes for a voice, but with no words in it.
    buzz = b"".join(tone_pcm16(f, 100, 8000) for f in (180, 240, 210, 260) * 5)
    await call.send_audio_ulaw(ulaw_encode(buzz))
    await session.wait_for("turn.user_started", timeout=15)
    ended = await session.wait_for("turn.ended", timeout=15)
    assert ended["abandoned"] is True and ended["text"] == ""


async def test_no_turn_events_on_hold(env: Env) -> None:
    call, session, _ = await connect(env, continuous_media=True)
    await session.send({"type": "hold"})
    await asyncio.sleep(0.2)
    await call.send_audio_ulaw(await synthesise_ulaw("Hello, are you still there?"))
    await asyncio.sleep(4.0)
    assert not [m for m in session.messages if m["type"].startswith("turn.")]
    await session.send({"type": "resume"})
    await call.send_audio_ulaw(await synthesise_ulaw("Hello, are you still there?"))
    await session.wait_for("turn.ended", timeout=20)


async def test_metrics_count_the_turns_and_time_the_recogniser(env: Env) -> None:
    # docs/operations.md, "Metrics": an operator sees the turns and whether the local STT keeps up.
    async def scrape() -> str:
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            return (await client.get("/metrics")).text

    before = await scrape()
    call, session, _ = await connect(env, continuous_media=True)
    await session.send({"type": "listen.update", "patience": "low"})
    await asyncio.sleep(0.3)
    await call.send_audio_ulaw(await synthesise_ulaw("Okay."))
    await session.wait_for("turn.backchannel", timeout=15)
    await call.send_audio_ulaw(await synthesise_ulaw("Do you have any appointments on Monday?"))
    await session.wait_for("turn.ended", timeout=20)
    after = await scrape()

    def grew(name: str, labels: dict[str, str] | None = None) -> float:
        return parse_metric(after, name, labels) - parse_metric(before, name, labels)

    assert grew("appbridge_turns_total", {"outcome": "backchannel"}) == 1
    assert grew("appbridge_turns_total", {"outcome": "started"}) == 1
    ended = grew("appbridge_turns_total", {"outcome": "ended"})
    assert ended + grew("appbridge_turns_total", {"outcome": "ended_without_final"}) == 1
    assert grew("appbridge_stt_final_delay_seconds_count") >= 2  # one final per utterance
    assert grew("appbridge_stt_decodes_total", {"kind": "final"}) >= 2
    assert grew("appbridge_stt_decoded_audio_seconds_total", {"kind": "final"}) > 2.0
    assert parse_metric(after, "appbridge_stt_decode_workers") >= 1
