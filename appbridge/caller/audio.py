"""The two signal measures the test caller narrates with: µ-law decoding and loudness.

``appbridge call`` tells when the far end starts and stops making sound by the RMS of each
20 ms frame. µ-law goes through :mod:`audioop` directly (ITU-T G.711) and the RMS comes from
numpy, independently of the gateway's own codecs; the tests' helpers
(:mod:`appbridge.testing.audio`) reuse both.
"""

from __future__ import annotations

import math
import warnings
from types import ModuleType

import numpy as np

__all__ = ["load_audioop", "rms_pcm16", "ulaw_decode"]


def load_audioop() -> ModuleType:
    """Import audioop once, hiding its Python 3.11/3.12 DeprecationWarning.

    On Python 3.13+ the ``audioop-lts`` distribution provides the same module name.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop

    return audioop


_audioop = load_audioop()


def rms_pcm16(pcm16: bytes) -> float:
    """Root mean square of the samples (0.0 for empty input), in sample units."""
    if not pcm16:
        return 0.0
    if len(pcm16) % 2:
        raise ValueError(f"pcm16 needs an even byte count, got {len(pcm16)}")
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    return float(math.sqrt(float(np.mean(samples * samples))))


def ulaw_decode(ulaw: bytes) -> bytes:
    """G.711 µ-law to pcm16."""
    result: bytes = _audioop.ulaw2lin(ulaw, 2)
    return result
