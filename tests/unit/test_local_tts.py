"""The offline ``local`` TTS provider: real eSpeak NG, no mocks (docs/speech.md)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import threading
from pathlib import Path

import espeakng_loader
import numpy as np
import pytest

from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderTimeout,
    ProviderUnavailable,
    TtsChunk,
    VoiceInfo,
    WordTiming,
)
from appbridge.speech.providers.local import (
    ESPEAK_RATE_HZ,
    ChunkAssembler,
    EngineStats,
    EspeakEngine,
    LocalTtsProvider,
    WordAligner,
    shared_engine,
)

SENTENCE = "Hello, this is a test of the gateway."
LONG_TEXT = " ".join(
    f"Sentence number {n} of a long answer, read slowly to the caller on the phone."
    for n in range(40)
)


@pytest.fixture(scope="module")
def provider() -> LocalTtsProvider:
    return LocalTtsProvider()


def voice(provider: LocalTtsProvider, voice_id: str) -> VoiceInfo:
    return next(v for v in provider.voices() if v.id == voice_id)


async def collect(
    provider: LocalTtsProvider, text: str, voice_id: str = "local/en-US", language: str = "en-US"
) -> list[TtsChunk]:
    return [c async for c in provider.synthesize(text, voice(provider, voice_id), language)]


def words_of(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


def snapshot(stats: EngineStats) -> EngineStats:
    return EngineStats(stats.requests, stats.aborted, stats.samples)


# --- Voices -------------------------------------------------------------------------------------


def test_voices_are_real_espeak_voices(provider: LocalTtsProvider) -> None:
    lang_dir = Path(espeakng_loader.get_data_path()) / "lang"
    voices = provider.voices()
    assert voices[0].id == "local/en-US"
    assert len(voices) >= 6
    for v in voices:
        assert v.provider == "local"
        assert v.id == f"local/{v.languages[0]}"
        assert v.rate_hz == ESPEAK_RATE_HZ == 22050
        assert (lang_dir / provider.espeak_identifier(v.id)).is_file(), v.id


async def test_unknown_voice_and_wrong_language_are_refused(provider: LocalTtsProvider) -> None:
    stranger = VoiceInfo("local/tlh", "local", "Klingon", ("tlh",), 22050)
    with pytest.raises(InvalidCatalogId) as caught:
        [c async for c in provider.synthesize("hi", stranger, "tlh")]
    assert caught.value.code == "invalid_catalog_id"
    with pytest.raises(FeatureNotSupported) as refused:
        await collect(provider, "hi", "local/en-US", "es-ES")
    assert refused.value.code == "feature_not_supported"


# --- Synthesis ----------------------------------------------------------------------------------


async def test_sentence_is_spoken_with_word_timings(provider: LocalTtsProvider) -> None:
    chunks = await collect(provider, SENTENCE)
    assert len(chunks) >= 1
    assert all(c.rate_hz == 22050 for c in chunks)
    assert all(len(c.pcm16) > 0 and len(c.pcm16) % 2 == 0 for c in chunks)
    pcm = b"".join(c.pcm16 for c in chunks)
    duration_ms = len(pcm) // 2 * 1000 // 22050
    assert 1000 <= duration_ms <= 6000
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    rms = float(np.sqrt(np.mean(samples**2)))
    assert rms > 500  # about -36 dBFS; eSpeak speaks near -22 dBFS

    words = [w for c in chunks for w in c.words]
    assert words_of(" ".join(w.text for w in words)) == words_of(SENTENCE)
    assert words[0].start_ms == 0
    for before, after in itertools.pairwise(words):
        assert before.start_ms <= before.end_ms == after.start_ms <= after.end_ms
    assert abs(words[-1].end_ms - duration_ms) <= 1
    assert any(w.end_ms - w.start_ms >= 100 for w in words)


async def test_words_arrive_no_later_than_the_last_chunk_and_in_order(
    provider: LocalTtsProvider,
) -> None:
    chunks = await collect(provider, LONG_TEXT)
    assert len(chunks) > 3  # streamed, not one blob
    total_ms = sum(len(c.pcm16) for c in chunks) // 2 * 1000 // 22050
    first_ms = len(chunks[0].pcm16) // 2 * 1000 // 22050
    assert first_ms < total_ms / 10  # the first audio is a small part of the whole
    words = [w for c in chunks for w in c.words]
    assert words_of(" ".join(w.text for w in words)) == words_of(LONG_TEXT)
    starts = [w.start_ms for w in words]
    assert starts == sorted(starts)
    assert words[-1].end_ms <= total_ms


async def test_other_languages_speak(provider: LocalTtsProvider) -> None:
    text = "¿Qué tal, señor Núñez? Muy bien."
    chunks = await collect(provider, text, "local/es-ES", "es-ES")
    words = [w.text for c in chunks for w in c.words]
    assert " ".join(words) == text
    assert sum(len(c.pcm16) for c in chunks) > 22050  # more than half a second


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "\x00"])
async def test_empty_text_yields_nothing(provider: LocalTtsProvider, text: str) -> None:
    before = snapshot(shared_engine().stats)
    assert await collect(provider, text) == []
    assert shared_engine().stats.requests == before.requests  # the engine was not even asked


async def test_numbers_keep_one_word_per_token(provider: LocalTtsProvider) -> None:
    text = "Your balance is 1234 dollars."
    chunks = await collect(provider, text)
    assert [w.text for c in chunks for w in c.words] == text.split()


# --- Cancellation and serialisation ---------------------------------------------------------------


async def test_aclose_after_first_chunk_stops_the_engine(provider: LocalTtsProvider) -> None:
    stats = shared_engine().stats
    await collect(provider, "Warm up.")
    before = snapshot(stats)
    full = await collect(provider, LONG_TEXT)
    full_samples = sum(len(c.pcm16) for c in full) // 2
    assert full_samples > 60 * 22050  # the long text is over a minute of speech

    mid = snapshot(stats)
    chunks = provider.synthesize(LONG_TEXT, voice(provider, "local/en-US"), "en-US")
    first = await anext(chunks)
    assert first.pcm16
    await chunks.aclose()
    # The engine is serial: this request runs after the cancelled one ended, and still works.
    after_cancel = await collect(provider, "Still working.")
    assert after_cancel and sum(len(c.pcm16) for c in after_cancel) > 0

    after = snapshot(stats)
    assert after.requests == before.requests + 3
    assert after.aborted == mid.aborted + 1
    cancelled_samples = after.samples - mid.samples - sum(len(c.pcm16) for c in after_cancel) // 2
    assert 0 < cancelled_samples < full_samples / 2


async def test_cancelling_the_task_stops_the_engine(provider: LocalTtsProvider) -> None:
    got_first = asyncio.Event()

    async def listen() -> None:
        async for _ in provider.synthesize(LONG_TEXT, voice(provider, "local/en-US"), "en-US"):
            got_first.set()
            await asyncio.Event().wait()  # a consumer that stalls until cancelled

    before = snapshot(shared_engine().stats)
    task = asyncio.create_task(listen())
    await got_first.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await collect(provider, "Next.")
    assert shared_engine().stats.aborted == before.aborted + 1


async def test_concurrent_requests_are_serialised_and_both_complete(
    provider: LocalTtsProvider,
) -> None:
    english = "The first caller hears this English sentence."
    spanish = "La segunda llamada escucha esta frase en español."
    results = await asyncio.gather(
        collect(provider, english),
        collect(provider, spanish, "local/es-ES", "es-ES"),
        collect(provider, english, "local/en-GB", "en-GB"),
    )
    for chunks, text in zip(results, [english, spanish, english], strict=True):
        assert " ".join(w.text for c in chunks for w in c.words) == text
        assert sum(len(c.pcm16) for c in chunks) // 2 > 22050
    workers = [t for t in threading.enumerate() if t.name.startswith("appbridge-espeak")]
    assert len(workers) == 1


async def test_two_providers_share_one_engine() -> None:
    a, b = LocalTtsProvider(), LocalTtsProvider(rate_wpm=220)
    slow, fast = await asyncio.gather(collect(a, LONG_TEXT), collect(b, LONG_TEXT))
    assert sum(len(c.pcm16) for c in fast) < sum(len(c.pcm16) for c in slow)
    workers = [t for t in threading.enumerate() if t.name.startswith("appbridge-espeak")]
    assert len(workers) == 1


# --- Failures -------------------------------------------------------------------------------------


async def test_missing_library_is_provider_unavailable(tmp_path: Path) -> None:
    engine = EspeakEngine(library_path=str(tmp_path / "missing.so"))
    provider = LocalTtsProvider(engine=engine)
    with pytest.raises(ProviderUnavailable) as caught:
        await collect(provider, SENTENCE)
    assert caught.value.code == "provider_unavailable"
    assert not engine.loaded


class SilentEngine(EspeakEngine):
    """An engine that accepts requests and never answers."""

    def submit(self, job: object) -> None:
        return None


async def test_no_answer_is_provider_timeout() -> None:
    provider = LocalTtsProvider(engine=SilentEngine(), timeout_s=0.0)
    with pytest.raises(ProviderTimeout) as caught:
        await collect(provider, SENTENCE)
    assert caught.value.code == "provider_timeout"


def test_rate_is_bounded() -> None:
    with pytest.raises(ValueError, match="rate_wpm"):
        LocalTtsProvider(rate_wpm=20)


# --- Sans-I/O parts -------------------------------------------------------------------------------


def test_aligner_maps_events_onto_tokens() -> None:
    text = "¿Qué tal? 1234 déjà vu — ok"
    aligner = WordAligner(text)
    done: list[WordTiming] = []
    done += aligner.on_word(2, 0)  # "Qué" inside "¿Qué"
    done += aligner.on_word(6, 200)  # "tal?"
    done += aligner.on_word(11, 500)  # "1234", then more words of the same number
    done += aligner.on_word(12, 700)
    done += aligner.on_word(12, 900)
    done += aligner.on_word(16, 1100)  # "déjà"; "vu" and "—" get no event of their own
    done += aligner.on_word(16, 1300)
    done += aligner.on_word(3, 1400)  # a stray event pointing back: ignored
    done += aligner.on_word(26, 1600)  # "ok"
    done += aligner.finish(1900)
    assert done == [
        WordTiming(0, 200, "¿Qué"),
        WordTiming(200, 500, "tal?"),
        WordTiming(500, 1100, "1234"),
        WordTiming(1100, 1600, "déjà vu —"),
        WordTiming(1600, 1900, "ok"),
    ]
    assert aligner.finish(2000) == []


def test_aligner_edges() -> None:
    assert WordAligner("").on_word(1, 0) == []
    assert WordAligner("no events").finish(500) == []
    leading = WordAligner("(aside) hello there")
    assert leading.on_word(9, 40) == []  # first event at "hello": "(aside)" joins it
    assert leading.on_word(99, 300) == [WordTiming(40, 300, "(aside) hello")]  # past the end
    assert leading.finish(250) == [WordTiming(300, 300, "there")]  # never ends before it starts


def test_assembler_holds_back_the_newest_buffer() -> None:
    assembler = ChunkAssembler("one two three", rate_hz=1000, chunk_ms=100)
    buf = b"\x01\x00" * 60  # 60 ms at 1 kHz
    assert assembler.feed(buf, [(1, 0)]) is None  # held: the first chunk waits for a second buffer
    first = assembler.feed(buf, [(5, 70)])
    assert first == TtsChunk(buf, 1000, [WordTiming(0, 70, "one")])
    assert assembler.feed(b"", [(9, 110)]) is None  # events without samples
    assert assembler.feed(buf, []) is None  # 60 ms waiting: below chunk_ms
    second = assembler.feed(buf, [])
    assert second is not None and second.pcm16 == buf * 2
    assert second.words == [WordTiming(70, 110, "two")]
    last = assembler.finish()
    assert last == TtsChunk(buf, 1000, [WordTiming(110, 240, "three")])
    assert assembler.finish() is None


def test_assembler_without_audio_yields_nothing() -> None:
    assembler = ChunkAssembler("hello", rate_hz=22050, chunk_ms=250)
    assert assembler.feed(b"", [(1, 0)]) is None
    assert assembler.finish() is None
