"""The pause between sentences synthesised apart (appbridge/speech/pauses.py)."""

from __future__ import annotations

import numpy as np

from appbridge.speech.pauses import (
    SENTENCE_PAUSE_MS,
    pause_to_add_ms,
    tail_bytes,
    trailing_silence_ms,
)


def _pcm(loud_ms: int, quiet_ms: int, rate: int = 16000) -> bytes:
    t = np.arange(rate * loud_ms // 1000) / rate
    tone = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    return tone.tobytes() + bytes(rate * quiet_ms // 1000 * 2)


def test_trailing_silence_is_measured_in_10_ms_windows() -> None:
    assert trailing_silence_ms(_pcm(200, 0), 16000) == 0
    assert trailing_silence_ms(_pcm(200, 120), 16000) == 120
    assert trailing_silence_ms(_pcm(0, 250), 16000) == 250
    assert trailing_silence_ms(b"", 16000) == 0


def test_the_pause_is_topped_up_to_a_sentence_pause_and_never_negative() -> None:
    assert pause_to_add_ms(0) == SENTENCE_PAUSE_MS
    assert pause_to_add_ms(120) == SENTENCE_PAUSE_MS - 120
    assert pause_to_add_ms(SENTENCE_PAUSE_MS + 50) == 0


def test_the_tail_kept_covers_a_whole_pause() -> None:
    tail = _pcm(100, 400)[-tail_bytes(16000) :]
    assert trailing_silence_ms(tail, 16000) == SENTENCE_PAUSE_MS
