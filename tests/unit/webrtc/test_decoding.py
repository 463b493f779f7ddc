"""Opus from a browser decoded straight to mono (carriers/webrtc/decoding.py)."""

from __future__ import annotations

import fractions
from types import SimpleNamespace

import av
import numpy as np

from appbridge.carriers.webrtc import decoding
from appbridge.carriers.webrtc.decoding import MonoOpusDecoder
from appbridge.testing.audio import dominant_freq


def _browser_opus(freq_hz: float, frames: int) -> list[bytes]:
    """What a browser sends: Opus encoded from 48 kHz stereo, 20 ms a packet."""
    enc: object = av.CodecContext.create("libopus", "w")
    enc.sample_rate, enc.layout, enc.format = 48000, "stereo", "s16"  # type: ignore[attr-defined]
    enc.time_base = fractions.Fraction(1, 48000)  # type: ignore[attr-defined]
    t = np.arange(frames * 960) / 48000
    tone = (np.sin(2 * np.pi * freq_hz * t) * 8000).astype("<i2")
    packets = []
    for i in range(frames):
        chunk = np.repeat(tone[i * 960 : (i + 1) * 960], 2).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="stereo")
        frame.sample_rate, frame.pts = 48000, i * 960
        packets += [bytes(p) for p in enc.encode(frame)]  # type: ignore[attr-defined]
    return packets


def test_a_browsers_stereo_opus_comes_out_mono() -> None:
    decoder = MonoOpusDecoder()
    out = []
    for i, data in enumerate(_browser_opus(440, 25)):
        for frame in decoder.decode(SimpleNamespace(data=data, timestamp=i * 960)):
            assert (frame.sample_rate, len(frame.layout.channels)) == (48000, 1)
            assert frame.samples == 960
            out.append(bytes(frame.planes[0])[: frame.samples * 2])
    pcm = b"".join(out)
    assert abs(dominant_freq(pcm[9600:], 48000) - 440) < 20


def test_only_opus_gets_the_mono_decoder() -> None:
    opus = SimpleNamespace(mimeType="audio/opus", name="opus")
    pcmu = SimpleNamespace(mimeType="audio/PCMU", name="PCMU", clockRate=8000, channels=1)
    assert isinstance(decoding._get_decoder(opus), MonoOpusDecoder)
    assert not isinstance(decoding._get_decoder(pcmu), MonoOpusDecoder)
