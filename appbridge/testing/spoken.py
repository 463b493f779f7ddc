"""Speech made on the spot for the tests and the benches: text spoken by the local TTS (eSpeak
NG, docs/speech.md), so that a recogniser, a turn detector or a browser's fake microphone can be
fed known words without recordings."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib

from appbridge.speech.base import VoiceInfo
from appbridge.speech.providers.local import LocalTtsProvider


def espeak(text: str, *, rate_wpm: int = 175, voice_index: int = 0) -> tuple[bytes, int]:
    """``text`` spoken by the ``voice_index``-th English voice: pcm16 and its sample rate."""
    tts = LocalTtsProvider(rate_wpm=rate_wpm)
    english = [v for v in tts.voices() if any(t.startswith("en") for t in v.languages)]
    return synthesise(tts, text, english[voice_index % len(english)])


def synthesise(
    tts: LocalTtsProvider, text: str, voice: VoiceInfo | None = None
) -> tuple[bytes, int]:
    """``text`` spoken by ``tts`` in ``voice`` (its first voice by default), in US English."""
    chosen = voice or tts.voices()[0]

    async def run() -> tuple[bytes, int]:
        pcm, rate = bytearray(), 0
        async with contextlib.aclosing(tts.synthesize(text, chosen, "en-US")) as chunks:
            async for chunk in chunks:
                pcm += chunk.pcm16
                rate = chunk.rate_hz
        return bytes(pcm), rate

    # A thread of its own, so this works inside or outside a running event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
