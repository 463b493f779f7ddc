"""The anti-aliasing filter that goes before every downsampling of the media path.

The sample-rate converter (:mod:`appbridge.media.resample`) interpolates linearly between
neighbouring samples and filters nothing. Going down in rate, every component above the new
rate's Nyquist frequency then folds back into the band at almost full strength: a 6 kHz
component of a 16 kHz app's audio reaches an 8 kHz caller as a 2 kHz tone at the same level,
and the hiss of eSpeak NG's sibilants (22050 Hz) lands inside the telephone band. Sampling
theory asks for a low-pass filter before the rate drops (an ITU-T G.712 channel passes
300-3400 Hz and stops what would fold). So a :class:`~appbridge.media.codecs.Converter` that
downsamples runs its audio through :func:`lowpass_for` first (docs/protocol-session-v1.md,
``session.start``, on ``audio``).

**The filter** is a linear-phase FIR, a Kaiser-windowed sinc with its cutoff at the new
Nyquist frequency. Its transition band spans 0.425 to 0.575 of the new rate (3.4 to 4.6 kHz for
8 kHz), so whatever folds lands above 3.4 kHz, and it stops at least 50 dB (measured on the
quantised taps when they are designed). The taps are Q14 integers with a DC gain of exactly
one. The delay is half the taps, about 1.2 ms at every ratio.

**Why our own code.** The compiled filter (appbridge/media/_lowpass.c) takes about 1.6 µs per
20 ms frame from 16 to 8 kHz, which makes the whole conversion 2.9 µs instead of 1.1 µs.
python-soxr's streaming resampler holds audio back in blocks: fed 20 ms frames, it returned
nothing for 3 to 5 frames, then a burst, adding 25 to 110 ms of latency. It cannot sit on a
path paced every 20 ms (docs/ARCHITECTURE.md). Without a C compiler the same integer arithmetic
runs in numpy (:class:`NumpyLowpass`), with the same output.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["COMPILED", "LowpassFilter", "NumpyLowpass", "design_taps", "lowpass_for"]

Q_BITS: Final = 14
STOPBAND_DB: Final = 50.0
PASS_EDGE: Final = 0.425  # of the new rate: 3.4 kHz at 8 kHz
STOP_EDGE: Final = 0.575  # 4.6 kHz at 8 kHz: what lies above folds to below 3.4 kHz no more
MOST_TAPS: Final = 1001  # a design stops growing here (384 kHz to 8 kHz); _lowpass.c takes 1024


class LowpassFilter(Protocol):
    """A streaming filter: the history of the stream is kept between chunks."""

    def filter(self, data: bytes) -> bytes: ...

    def reset(self) -> None: ...


class NumpyLowpass:
    """The compiled filter's arithmetic in numpy: the same samples, for a build without C."""

    __slots__ = ("_history", "_taps")

    _history: npt.NDArray[np.int64]
    _taps: npt.NDArray[np.int64]

    def __init__(self, coefficients: bytes) -> None:
        import numpy as np

        taps = np.frombuffer(coefficients, dtype=np.int16).astype(np.int64)
        if not 1 <= len(taps) <= 1024 or len(coefficients) % 2:
            raise ValueError("coefficients must be 1 to 1024 int16 taps")
        if int(np.abs(taps).sum()) >= 65536:
            raise ValueError("the taps' absolute sum must stay below 65536")
        self._taps = taps[::-1].copy()
        self._history = np.zeros(len(taps) - 1, dtype=np.int64)

    def filter(self, data: bytes) -> bytes:
        import numpy as np

        if len(data) % 2:
            raise ValueError("data must hold whole 16-bit samples")
        work = np.concatenate([self._history, np.frombuffer(data, dtype=np.int16)])
        acc = np.convolve(work, self._taps, mode="valid") if len(data) else work[:0]
        self._history = work[len(work) - len(self._history) :]
        out = np.clip((acc + (1 << (Q_BITS - 1))) >> Q_BITS, -32768, 32767)
        filtered: bytes = out.astype(np.int16).tobytes()
        return filtered

    def reset(self) -> None:
        self._history[:] = 0


try:
    from appbridge.media._lowpass import Lowpass as _CompiledLowpass

    COMPILED = True
except ImportError:  # installed without a C compiler (setup.py: the extension is optional)
    COMPILED = False


@cache
def design_taps(src_hz: int, dst_hz: int) -> bytes:
    """The Q14 taps (native int16) of the filter for going from ``src_hz`` down to ``dst_hz``.

    Kaiser's formulas give the window's shape and a first length (Oppenheim & Schafer,
    "Discrete-Time Signal Processing", 7.6). They are estimates, so the length then grows two
    taps at a time until the quantised filter, measured, stops ``STOPBAND_DB``.
    """
    import numpy as np

    if not 0 < 2 * STOP_EDGE * dst_hz < src_hz:
        raise ValueError("no low-pass filter is needed for this ratio (lowpass_for)")
    width = 2 * math.pi * (STOP_EDGE - PASS_EDGE) * dst_hz / src_hz  # radians per sample
    first = math.ceil((STOPBAND_DB - 8) / (2.285 * width)) | 1  # odd: a whole-sample delay
    count = min(first, MOST_TAPS)
    while True:
        taps = _kaiser_lowpass(count, 0.5 * dst_hz / src_hz)
        if _stopband_db(taps, STOP_EDGE * dst_hz / src_hz) >= STOPBAND_DB or count >= MOST_TAPS:
            designed: bytes = taps.astype(np.int16).tobytes()  # native order, as the C reads
            return designed
        count += 2


def _kaiser_lowpass(count: int, cutoff: float) -> npt.NDArray[np.int64]:
    """``count`` Q14 taps cutting off at ``cutoff`` cycles per sample, DC gain exactly one."""
    import numpy as np

    beta = 0.1102 * (STOPBAND_DB + 5 - 8.7)  # a little margin over the target
    n = np.arange(count) - (count - 1) / 2
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(count, beta)
    quantised: npt.NDArray[np.int64] = np.round(taps / taps.sum() * (1 << Q_BITS)).astype(np.int64)
    quantised[count // 2] += (1 << Q_BITS) - int(quantised.sum())
    return quantised


def _stopband_db(taps: npt.NDArray[np.int64], stop: float) -> float:
    """The smallest attenuation, in dB, from ``stop`` cycles per sample to half the rate."""
    import numpy as np

    response = np.abs(np.fft.rfft(taps / (1 << Q_BITS), 1 << 16))
    worst = response[np.fft.rfftfreq(1 << 16) >= stop].max()
    return float(-20 * math.log10(max(worst, 1e-12)))


def lowpass_for(src_hz: int, dst_hz: int) -> LowpassFilter | None:
    """A new filter for one stream going from ``src_hz`` to ``dst_hz``; None when the rate
    does not drop (going up, linear interpolation creates no alias inside the old band), or
    drops so little that whatever folds lands above the passband anyway."""
    if dst_hz >= src_hz or src_hz <= 2 * STOP_EDGE * dst_hz:
        return None
    taps = design_taps(src_hz, dst_hz)
    if COMPILED:
        compiled: LowpassFilter = _CompiledLowpass(taps)
        return compiled
    return NumpyLowpass(taps)
