"""A bounded cache of finished utterances, in front of every TTS provider.

Callers hear the same sentences again and again: a greeting, "please hold", a menu, a closing
line. Synthesising each again costs CPU (eSpeak NG: about 4 ms of a core per 2 s sentence) or
money and latency (a cloud voice), so the catalog puts :class:`CachingTtsProvider` in front of
each provider: the first request for a sentence streams from the engine as before; once it has
finished cleanly its chunks are kept, and later requests for the same voice, language and text
are answered from memory at once.

* Only an utterance that ran to its end is kept: one cut short by ``clear``/``preempt``
  (the consumer closed the stream) or ended by an error is not, so a cached sentence is always
  whole.
* The key is the voice id (which names the provider), the language and the exact text. Provider
  settings that shape the audio (eSpeak's rate, a cloud model) are fixed for a catalog; a
  configuration reload builds a new catalog and so a new, empty cache.
* Bounded by bytes of PCM, least recently used first out; one utterance larger than an eighth
  of the budget is never kept, so a few long texts cannot flush the common short ones.
* Two calls asking for the same new sentence at once both synthesise it (no waiting on another
  call's request: a slow engine must not couple calls); the second to finish replaces the first.

``[speech] tts_cache_mb`` sets the budget (default 32 MiB, about six minutes of 22050 Hz audio;
``0`` turns the cache off). ``/metrics`` reports hits, misses and bytes held.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from appbridge.speech.base import TtsChunk, TtsProvider, VoiceInfo, WordTiming

__all__ = ["CachingTtsProvider", "TtsCache", "TtsCacheStats"]

# One utterance may take at most this share of the budget.
_ENTRY_SHARE = 8

_Key = tuple[str, str, str]
_Entry = tuple[tuple[bytes, int, tuple[WordTiming, ...]], ...]


@dataclass(slots=True)
class TtsCacheStats:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    evicted: int = 0
    too_large: int = 0


class TtsCache:
    """Finished utterances by (voice id, language, text), least recently used evicted first."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // _ENTRY_SHARE
        self._entries: OrderedDict[_Key, tuple[_Entry, int]] = OrderedDict()
        self.bytes = 0
        self.stats = TtsCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: _Key) -> _Entry | None:
        found = self._entries.get(key)
        if found is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return found[0]

    def put(self, key: _Key, entry: _Entry) -> None:
        size = sum(len(pcm) for pcm, _, _ in entry)
        if size > self.max_entry_bytes:
            self.stats.too_large += 1
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (entry, size)
        self.bytes += size
        self.stats.stored += 1
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self.stats.evicted += 1


class CachingTtsProvider:
    """``inner`` with finished utterances answered from ``cache`` (module docstring)."""

    def __init__(self, inner: TtsProvider, cache: TtsCache) -> None:
        self.inner = inner
        self.name = inner.name
        self._cache = cache

    def voices(self) -> Sequence[VoiceInfo]:
        return self.inner.voices()

    async def aclose(self) -> None:
        aclose = getattr(self.inner, "aclose", None)
        if aclose is not None:
            await aclose()

    async def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]:
        key = (voice.id, language, text)
        entry = self._cache.get(key)
        if entry is not None:
            for pcm16, rate_hz, words in entry:
                yield TtsChunk(pcm16, rate_hz, list(words))
                # The consumer converts and queues each chunk as it comes: one chunk per loop
                # turn, so a long cached text cannot hold up other calls' media.
                await asyncio.sleep(0)
            return
        kept: list[tuple[bytes, int, tuple[WordTiming, ...]]] = []
        size = 0
        limit = self._cache.max_entry_bytes
        stream = self.inner.synthesize(text, voice, language)
        try:
            async for chunk in stream:
                if size <= limit:
                    kept.append((chunk.pcm16, chunk.rate_hz, tuple(chunk.words)))
                    size += len(chunk.pcm16)
                yield chunk
        finally:
            await stream.aclose()
        # Reached only when the engine finished and the consumer took every chunk.
        if kept:
            self._cache.put(key, tuple(kept))
