"""The pause between sentences, kept when text arrives a piece at a time
(docs/protocol-session-v1.md, ``speak`` with ``last: false``).

A streamed ``speak`` is synthesised a few sentences at a time, as they are complete. A TTS engine
puts a pause between the sentences of one text but none after its last one (eSpeak NG ends on
the last phoneme), so sentences synthesised apart would run together, and a recogniser on the
far side would hear one run-on sentence. The gateway tops the silence that ends one synthesis up
to :data:`SENTENCE_PAUSE_MS` before the next one starts, so streamed text sounds like the same
text spoken at once. Sans-I/O.
"""

from __future__ import annotations

from typing import Final

import numpy as np

#: The pause between two sentences of one text (eSpeak NG at its default rate: about 300-320 ms).
SENTENCE_PAUSE_MS: Final = 300
#: Samples quieter than this (of 32767) count as silence: well under speech, over dither.
_QUIET_LEVEL: Final = 200
_WINDOW_MS: Final = 10


def trailing_silence_ms(pcm16: bytes, rate_hz: int) -> int:
    """How long the end of ``pcm16`` (16-bit mono) is silent, in whole 10 ms windows."""
    window = rate_hz * _WINDOW_MS // 1000
    samples = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype=np.int16)
    n = len(samples) // window
    if n == 0 or window == 0:
        return 0
    tail = samples[len(samples) - n * window :].reshape(n, window).astype(np.int32)
    loud = np.nonzero(np.abs(tail).max(axis=1) >= _QUIET_LEVEL)[0]
    quiet_windows = n if len(loud) == 0 else n - 1 - int(loud[-1])
    return quiet_windows * _WINDOW_MS


def pause_to_add_ms(trailing_ms: int) -> int:
    """Silence to add after a synthesis that ended a sentence, before the next sentence."""
    return max(0, SENTENCE_PAUSE_MS - trailing_ms) // _WINDOW_MS * _WINDOW_MS


def tail_bytes(rate_hz: int) -> int:
    """How much of a synthesis's end (16-bit mono) :func:`trailing_silence_ms` needs to see."""
    return rate_hz * SENTENCE_PAUSE_MS // 1000 * 2
