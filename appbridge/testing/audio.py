"""Small signal helpers for the test peers, the benchmark and the test caller.

They let a test say "the caller heard a 440 Hz tone" or "this was silence" without trusting the
gateway's own codecs: µ-law goes through :mod:`audioop` directly (G.711, ITU-T G.711 §A), tones and
power come from numpy. Every PCM argument is 16-bit signed little-endian mono ("pcm16"), as the
session protocol defines it (docs/protocol-session-v1.md, ``session.start``). The test caller's
two measures (:func:`rms_pcm16`, :func:`ulaw_decode`) live in :mod:`appbridge.caller.audio`.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from appbridge.caller.audio import load_audioop, rms_pcm16, ulaw_decode

__all__ = [
    "ULAW_SILENCE_BYTE",
    "dominant_freq",
    "dual_tone",
    "goertzel_power",
    "is_silent_ulaw",
    "rms_pcm16",
    "silence_pcm16",
    "silence_ulaw",
    "tone_pcm16",
    "ulaw_decode",
    "ulaw_encode",
]

#: µ-law code of a zero sample: what Twilio plays and sends for silence (G.711 bias, all bits set).
ULAW_SILENCE_BYTE = 0xFF


_audioop = load_audioop()


def _samples(pcm16: bytes) -> npt.NDArray[np.float64]:
    if len(pcm16) % 2:
        raise ValueError(f"pcm16 needs an even byte count, got {len(pcm16)}")
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float64)


def _to_pcm16(samples: npt.NDArray[np.float64]) -> bytes:
    clipped = np.clip(np.rint(samples), -32768, 32767).astype("<i2")
    return clipped.tobytes()


def tone_pcm16(
    freq_hz: float, ms: float, rate_hz: int, amplitude: int = 8000, phase_rad: float = 0.0
) -> bytes:
    """A sine of ``freq_hz`` lasting ``ms`` milliseconds at ``rate_hz``, as pcm16 bytes."""
    count = round(rate_hz * ms / 1000.0)
    t_s = np.arange(count, dtype=np.float64) / rate_hz
    return _to_pcm16(amplitude * np.sin(2.0 * math.pi * freq_hz * t_s + phase_rad))


def dual_tone(
    low_hz: float, high_hz: float, ms: float, rate_hz: int, amplitude: int = 4000
) -> bytes:
    """Two summed sines of ``amplitude`` each: a DTMF keypress (ITU-T Q.23) when the pair fits."""
    count = round(rate_hz * ms / 1000.0)
    t_s = np.arange(count, dtype=np.float64) / rate_hz
    signal = amplitude * (
        np.sin(2.0 * math.pi * low_hz * t_s) + np.sin(2.0 * math.pi * high_hz * t_s)
    )
    return _to_pcm16(signal)


def silence_pcm16(ms: float, rate_hz: int) -> bytes:
    """``ms`` milliseconds of digital silence in pcm16."""
    return bytes(2 * round(rate_hz * ms / 1000.0))


def silence_ulaw(ms: float) -> bytes:
    """``ms`` milliseconds of µ-law 8 kHz silence (0xFF bytes)."""
    return bytes([ULAW_SILENCE_BYTE]) * round(8 * ms)


def goertzel_power(pcm16: bytes, rate_hz: int, freq_hz: float) -> float:
    """Normalised power of ``freq_hz`` in the block: the quantity Goertzel's filter yields.

    Goertzel (1958) evaluates one DFT term, |sum x[n]·e^(-jωn)|², by a recursion; numpy computes
    the same term directly, which is faster in Python. It is divided by n² so a full-block sine of
    amplitude A reads about A²/4 whatever the block length, which makes thresholds comparable
    between 20 ms frames and whole recordings.
    """
    samples = _samples(pcm16)
    n = samples.size
    if n == 0:
        return 0.0
    omega = 2.0 * math.pi * freq_hz / rate_hz
    phases = omega * np.arange(n, dtype=np.float64)
    real = float(np.dot(samples, np.cos(phases)))
    imag = float(np.dot(samples, np.sin(phases)))
    return (real * real + imag * imag) / float(n * n)


def dominant_freq(pcm16: bytes, rate_hz: int) -> float:
    """The frequency (Hz) of the strongest FFT bin, DC excluded; 0.0 for silence or no input."""
    samples = _samples(pcm16)
    if samples.size < 2 or not np.any(samples):
        return 0.0
    window = np.hanning(samples.size)
    spectrum = np.abs(np.fft.rfft((samples - samples.mean()) * window))
    spectrum[0] = 0.0
    peak = int(np.argmax(spectrum))
    return float(peak * rate_hz / samples.size)


def ulaw_encode(pcm16: bytes) -> bytes:
    """pcm16 to G.711 µ-law, one byte per sample."""
    result: bytes = _audioop.lin2ulaw(pcm16, 2)
    return result


def is_silent_ulaw(ulaw: bytes, threshold_rms: float = 100.0) -> bool:
    """Whether µ-law audio decodes quieter than ``threshold_rms`` (empty counts as silent)."""
    return rms_pcm16(ulaw_decode(ulaw)) < threshold_rms


# The DTMF keypad (ITU-T Q.23), written out here independently of the gateway's generator.
_DTMF_ROWS_HZ = (697, 770, 852, 941)
_DTMF_COLS_HZ = (1209, 1336, 1477, 1633)
_DTMF_KEYS = ("123A", "456B", "789C", "*0#D")


def decode_dtmf(pcm16: bytes, rate_hz: int, block_ms: int = 20) -> str:
    """A Goertzel DTMF decoder: one digit per run of blocks in which one row tone and one column
    tone each stand 10 dB above the rest of their group (a twist-tolerant, standard detector)."""
    samples = np.frombuffer(pcm16[: len(pcm16) // 2 * 2], dtype="<i2")
    n = rate_hz * block_ms // 1000
    out: list[str] = []
    previous: str | None = None
    for start in range(0, len(samples) - n + 1, n):
        block = samples[start : start + n].tobytes()
        rows = [goertzel_power(block, rate_hz, f) for f in _DTMF_ROWS_HZ]
        cols = [goertzel_power(block, rate_hz, f) for f in _DTMF_COLS_HZ]
        energy = float(np.sum(samples[start : start + n].astype(np.float64) ** 2))
        r, c = int(np.argmax(rows)), int(np.argmax(cols))
        digit = None
        if energy > 1e6 and sorted(rows)[-2] * 10 < rows[r] and sorted(cols)[-2] * 10 < cols[c]:
            digit = _DTMF_KEYS[r][c]
        if digit is not None and digit != previous:
            out.append(digit)
        previous = digit
    return "".join(out)
