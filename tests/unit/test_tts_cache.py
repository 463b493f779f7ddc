"""The utterance cache in front of the TTS providers (appbridge/speech/cache.py)."""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import AsyncGenerator, Sequence

import pytest

from appbridge.config import ConfigError, default_config, parse_config
from appbridge.speech.base import ProviderTimeout, TtsChunk, VoiceInfo, WordTiming
from appbridge.speech.cache import SEEN_DIGESTS, CachingTtsProvider, TtsCache, cache_key
from appbridge.speech.catalog import build_catalog, default_catalog
from appbridge.speech.providers.local import LocalTtsProvider, shared_engine

VOICE = VoiceInfo("fake/one", "fake", "one", ("en-US",), 8000)
OTHER_VOICE = VoiceInfo("fake/two", "fake", "two", ("en-US",), 8000)


class CountingProvider:
    """A provider whose every chunk is 100 bytes, with a word timing on the first."""

    name = "fake"

    def __init__(self, chunks: int = 3, fail_after: int | None = None) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.requests: list[str] = []
        self.closed = 0

    def voices(self) -> Sequence[VoiceInfo]:
        return [VOICE, OTHER_VOICE]

    async def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]:
        self.requests.append(text)
        try:
            for i in range(self.chunks):
                if self.fail_after is not None and i >= self.fail_after:
                    raise ProviderTimeout("the engine stopped answering")
                words = [WordTiming(0, 50, text.split()[0])] if i == 0 else []
                yield TtsChunk(bytes([i]) * 100, 8000, words)
        finally:
            self.closed += 1


async def speak(
    provider: CachingTtsProvider, text: str, voice: VoiceInfo = VOICE, language: str = "en-US"
) -> list[TtsChunk]:
    async with contextlib.aclosing(provider.synthesize(text, voice, language)) as stream:
        return [chunk async for chunk in stream]


async def test_a_sentence_asked_for_again_is_kept_and_then_answered_from_the_cache() -> None:
    inner = CountingProvider()
    cache = TtsCache(10_000)
    provider = CachingTtsProvider(inner, cache)
    first = await speak(provider, "Hello there.")
    assert len(cache) == 0  # said once: only its digest is remembered
    second = await speak(provider, "Hello there.")
    assert len(cache) == 1 and cache.bytes == 300
    third = await speak(provider, "Hello there.")
    assert inner.requests == ["Hello there.", "Hello there."]
    assert [(c.pcm16, c.rate_hz, c.words) for c in third] == [
        (c.pcm16, c.rate_hz, c.words) for c in first
    ]
    assert third[0].words is not second[0].words  # each hit gets lists of its own
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.first_seen, stats.stored) == (1, 2, 1, 1)


async def test_sentences_said_once_cost_no_memory() -> None:
    inner = CountingProvider()
    cache = TtsCache(10_000_000)
    provider = CachingTtsProvider(inner, cache)
    for n in range(SEEN_DIGESTS + 100):
        await speak(provider, f"Answer number {n}.")
    assert cache.bytes == 0 and len(cache) == 0
    assert cache.stats.first_seen == SEEN_DIGESTS + 100
    assert len(cache._seen) == SEEN_DIGESTS  # the oldest digests are forgotten
    await speak(provider, "Answer number 0.")  # forgotten: a first request again
    assert len(cache) == 0
    await speak(provider, f"Answer number {SEEN_DIGESTS + 99}.")  # remembered: kept now
    assert len(cache) == 1


async def test_voice_language_and_text_make_the_key() -> None:
    inner = CountingProvider()
    provider = CachingTtsProvider(inner, TtsCache(10_000))
    await speak(provider, "Hello there.")
    await speak(provider, "Hello there!")
    await speak(provider, "Hello there.", OTHER_VOICE)
    await speak(provider, "Hello there.", language="en-GB")
    assert len(inner.requests) == 4


async def test_an_utterance_cut_short_is_not_kept() -> None:
    inner = CountingProvider()
    cache = TtsCache(10_000)
    provider = CachingTtsProvider(inner, cache)
    await speak(provider, "Cut me.")  # the first request: remembered, not kept
    async with contextlib.aclosing(provider.synthesize("Cut me.", VOICE, "en-US")) as stream:
        async for _ in stream:
            break  # a clear: the consumer stops reading
    assert inner.closed == 2  # the engine's stream was closed at once
    assert len(cache) == 0
    await speak(provider, "Cut me.")
    assert inner.requests == ["Cut me."] * 3
    assert len(cache) == 1


async def test_a_failed_utterance_raises_and_is_not_kept() -> None:
    inner = CountingProvider(fail_after=2)
    cache = TtsCache(10_000)
    provider = CachingTtsProvider(inner, cache)
    for _ in range(2):
        with pytest.raises(ProviderTimeout):
            await speak(provider, "Broken.")
    assert len(cache) == 0 and inner.closed == 2


async def test_least_recently_used_goes_first_and_large_ones_never_enter() -> None:
    inner = CountingProvider()
    cache = TtsCache(8 * 300)  # room for eight 300-byte utterances; one may be 300 bytes
    provider = CachingTtsProvider(inner, cache)
    for n in range(8):
        await speak(provider, f"Sentence {n}.")
        await speak(provider, f"Sentence {n}.")  # asked twice: kept
    await speak(provider, "Sentence 0.")  # a hit: now the most recently used
    await speak(provider, "Sentence 8.")
    await speak(provider, "Sentence 8.")  # kept: evicts sentence 1
    assert cache.stats.evicted == 1 and cache.bytes == 8 * 300
    before = len(inner.requests)
    await speak(provider, "Sentence 0.")
    assert len(inner.requests) == before
    await speak(provider, "Sentence 1.")
    assert len(inner.requests) == before + 1

    big = CachingTtsProvider(CountingProvider(chunks=4), cache)
    for _ in range(3):
        await speak(big, "Too long to keep.")
    assert cache.stats.too_large == 2  # the second and third requests tried
    assert cache_key("fake/one", "en-US", "Too long to keep.") not in cache._entries


def config_with(speech_toml: str):  # type: ignore[no-untyped-def]
    app = '[[apps]]\nref = "a"\nurl = "wss://app.example.com/s"\n'
    return parse_config(
        tomllib.loads(speech_toml + app), {}, known_voice=default_catalog().is_known_voice
    )


def test_the_cache_is_on_by_default_and_tts_cache_mb_sets_or_disables_it() -> None:
    default = build_catalog(default_config())
    assert default.tts_cache is not None
    assert default.tts_cache.max_bytes == 32 * 1024 * 1024
    assert all(isinstance(p, CachingTtsProvider) for p in default.providers())
    sized = build_catalog(config_with("[speech]\ntts_cache_mb = 8\n"))
    assert sized.tts_cache is not None and sized.tts_cache.max_bytes == 8 * 1024 * 1024
    off = build_catalog(config_with("[speech]\ntts_cache_mb = 0\n"))
    assert off.tts_cache is None
    assert all(isinstance(p, LocalTtsProvider) for p in off.providers())


@pytest.mark.parametrize("value", ["-1", "5000", '"big"', "1.5", "true"])
def test_bad_tts_cache_mb_is_a_clear_config_error(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_with(f"[speech]\ntts_cache_mb = {value}\n")
    assert "speech.tts_cache_mb: expected an integer 0-4096" in str(err.value)


async def test_real_espeak_speaks_a_cached_sentence_once() -> None:
    catalog = build_catalog(default_config())
    provider, voice, language = catalog.voice_for(None, None)
    assert isinstance(provider, CachingTtsProvider)
    text = "The cache test sentence, spoken once."
    engine = shared_engine()

    async def spoken() -> list[TtsChunk]:
        async with contextlib.aclosing(provider.synthesize(text, voice, language)) as stream:
            return [chunk async for chunk in stream]

    await spoken()
    first = await spoken()  # asked for again: kept
    requests = engine.stats.requests
    second = await spoken()
    assert engine.stats.requests == requests  # eSpeak NG did not run again
    # eSpeak NG varies its samples a little from run to run: equal bytes are the cache's.
    assert b"".join(c.pcm16 for c in second) == b"".join(c.pcm16 for c in first)
    assert len(b"".join(c.pcm16 for c in first)) > voice.rate_hz  # over half a second
    assert [w.text for c in second for w in c.words] == [w.text for c in first for w in c.words]
