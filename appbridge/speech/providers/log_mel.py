"""Whisper's input features: 80 log-mel bands of 25 ms Hann windows every 10 ms at 16 kHz.

The front end of the local recogniser (``whisper_engine.py``; docs/turn-taking.md, "How it works"),
written with numpy so that no audio library is needed: Slaney-style mel filters over 0-8 kHz, the
power spectrum's log10 clamped 8 decades under its peak and scaled as Whisper was trained.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["HOP", "MAX_FRAMES", "MODEL_RATE_HZ", "log_mel"]

MODEL_RATE_HZ: Final = 16000  # Whisper's input rate, and the Segmenter's

N_FFT: Final = 400
HOP: Final = 160
N_MELS: Final = 80
MAX_FRAMES: Final = 3000  # Whisper's 30 s window


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # The Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
    linear = hz / (200.0 / 3.0)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz < 1000.0, linear, log_part)


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel < 15.0, linear, log_part)


def _mel_filters() -> npt.NDArray[np.float32]:
    """Triangular filters on the Slaney scale, each normalised to unit area, as Whisper was
    trained with."""
    fft_hz = np.linspace(0.0, MODEL_RATE_HZ / 2, 1 + N_FFT // 2)
    edges = np.array([0.0, MODEL_RATE_HZ / 2])
    mel_edges = _hz_to_mel(edges)
    centres_hz = _mel_to_hz(np.linspace(mel_edges[0], mel_edges[1], N_MELS + 2))
    widths = np.diff(centres_hz)
    ramps = centres_hz[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (centres_hz[2:] - centres_hz[:-2]))[:, None]
    return weights.astype(np.float32)


_FILTERS: Final = _mel_filters()
_WINDOW: Final = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def log_mel(audio: npt.NDArray[np.float32], n_frames: int) -> npt.NDArray[np.float32]:
    """Whisper's input features for ``audio`` (16 kHz floats in [-1, 1]), zero-padded or cut to
    ``n_frames`` 10 ms frames: shape (80, n_frames)."""
    padded = np.zeros(n_frames * HOP, dtype=np.float32)
    n = min(len(audio), len(padded))
    padded[:n] = audio[:n]
    half = N_FFT // 2
    padded = np.pad(padded, (half, half), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
    spectrum = np.fft.rfft(frames * _WINDOW, axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    # einsum, not a BLAS matmul: OpenBLAS worker threads busy-wait after a call and would take a
    # second core for the whole decode that follows.
    mel = np.einsum("mk,tk->mt", _FILTERS, power, optimize=False)
    logs = np.log10(np.maximum(mel, 1e-10))
    logs = np.maximum(logs, logs.max() - 8.0)
    features: npt.NDArray[np.float32] = ((logs + 4.0) / 4.0).astype(np.float32)
    return features
