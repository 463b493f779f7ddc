"""A fetched file converted for a call, a slice at a time (appbridge/media/fetch.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appbridge.media.codecs import PCMU_8K, AudioFormat, Converter
from appbridge.media.fetch import SLICE_MS, convert_for_call
from appbridge.media.wav import DecodedAudio


@pytest.mark.parametrize("rate_hz", [8000, 16000, 48000, 384000])
async def test_the_same_audio_as_in_one_piece_with_the_loop_running_between_slices(
    rate_hz: int,
) -> None:
    seconds = 0.8 if rate_hz == 384000 else 3.0
    samples = np.random.default_rng(rate_hz).standard_normal(int(rate_hz * seconds)) * 5000
    audio = DecodedAudio(samples.astype("<i2").tobytes(), rate_hz)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    converted = await convert_for_call(audio, PCMU_8K)
    task.cancel()
    whole = Converter(AudioFormat("pcm16", rate_hz), PCMU_8K).convert(audio.pcm16)
    assert converted == whole
    slices = -(-int(rate_hz * seconds) // (rate_hz * SLICE_MS // 1000))
    assert ticks >= slices  # every slice gave the loop a turn


async def test_an_empty_file_converts_to_nothing() -> None:
    assert await convert_for_call(DecodedAudio(b"", 16000), PCMU_8K) == b""
