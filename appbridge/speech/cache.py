"""A bounded cache of finished utterances, in front of every TTS provider.

Callers hear the same sentences again and again: a greeting, "please hold", a menu, a closing
line. Synthesising each again costs CPU (eSpeak NG: about 4 ms of a core per 2 s sentence) or
money and latency (a cloud voice), so the catalog puts :class:`CachingTtsProvider` in front of
each provider: a request streams from the engine as before, and once a sentence has been asked
for a second time and that synthesis has finished cleanly, its chunks are kept; later requests
for the same voice, language and text are answered from memory at once.

* Only a sentence asked for twice is kept. Most of what a voice-AI app says is new each time
  (an LLM's answers): storing every sentence would fill the budget with audio nobody asks for
  again. The cache remembers a digest of each sentence it has seen (the last
  :data:`SEEN_DIGESTS` of them, 16 bytes each) and stores a sentence's audio from its second
  request on.
* Only an utterance that ran to its end is kept: one cut short by ``clear``/``preempt``
  (the consumer closed the stream) or ended by an error is not, so a cached sentence is always
  whole.
* The key is the voice id (which names the provider), the language and the exact text. Provider
  settings that shape the audio (eSpeak's rate, a cloud model) are fixed for a catalog; a
  configuration reload builds a new catalog and so a new, empty cache.
* Bounded by bytes of PCM, least recently used first out; one utterance larger than an eighth
  of the budget is never kept, so a few long texts cannot flush the common short ones.
* Two calls asking for the same sentence at once both synthesise it (no waiting on another
  call's request: a slow engine must not couple calls); the second to finish replaces the first.

``[speech] tts_cache_mb`` sets the budget (default 32 MiB, about six minutes of 22050 Hz audio;
``0`` turns the cache off). ``/metrics`` reports hits, misses and bytes held.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from appbridge.speech.base import TtsChunk, TtsProvider, VoiceInfo, WordTiming

__all__ = ["SEEN_DIGESTS", "CachingTtsProvider", "TtsCache", "TtsCacheStats", "cache_key"]

# One utterance may take at most this share of the budget.
_ENTRY_SHARE = 8

#: How many sentences seen once are remembered (as digests) so that a second request stores.
SEEN_DIGESTS = 8192

_Key = bytes  # a digest of (voice id, language, text)
_Entry = tuple[tuple[bytes, int, tuple[WordTiming, ...]], ...]


@dataclass(slots=True)
class TtsCacheStats:
    hits: int = 0
    misses: int = 0
    first_seen: int = 0  # misses not stored: the sentence's first request
    stored: int = 0
    evicted: int = 0
    too_large: int = 0


def cache_key(voice_id: str, language: str, text: str) -> _Key:
    """The digest that stands for a sentence (texts may be long; 16 bytes are kept per key)."""
    material = "\x00".join((voice_id, language, text)).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(material, digest_size=16).digest()


class TtsCache:
    """Finished utterances by :func:`cache_key`, least recently used evicted first, stored from
    a sentence's second request on (module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // _ENTRY_SHARE
        self._entries: OrderedDict[_Key, tuple[_Entry, int]] = OrderedDict()
        self._seen: OrderedDict[_Key, None] = OrderedDict()
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

    def worth_keeping(self, key: _Key) -> bool:
        """Called on a miss: whether this synthesis should be stored once finished, i.e.
        whether the sentence was asked for before. A first request is remembered instead."""
        seen = self._seen
        if key in seen:
            seen.move_to_end(key)
            return True
        seen[key] = None
        if len(seen) > SEEN_DIGESTS:
            seen.popitem(last=False)
        self.stats.first_seen += 1
        return False

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
        cache = self._cache
        key = cache_key(voice.id, language, text)
        entry = cache.get(key)
        if entry is not None:
            for pcm16, rate_hz, words in entry:
                yield TtsChunk(pcm16, rate_hz, list(words))
                # The consumer converts and queues each chunk as it comes: one chunk per loop
                # turn, so a long cached text cannot hold up other calls' media.
                await asyncio.sleep(0)
            return
        kept: list[tuple[bytes, int, tuple[WordTiming, ...]]] = []
        size = 0
        # Past the limit nothing more is kept (and put() refuses it): -1 keeps nothing at all.
        limit = cache.max_entry_bytes if cache.worth_keeping(key) else -1
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
            cache.put(key, tuple(kept))
