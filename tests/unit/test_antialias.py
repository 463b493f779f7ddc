"""The anti-aliasing filter before downsampling (appbridge/media/antialias.py, _lowpass.c)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from appbridge.media import antialias
from appbridge.media.antialias import (
    PASS_EDGE,
    STOP_EDGE,
    NumpyLowpass,
    design_taps,
    lowpass_for,
)
from appbridge.media.codecs import PCMU_8K, AudioFormat, Converter
from appbridge.testing.audio import tone_pcm16

# Every downsampling the gateway does: sessions 16/24 kHz to 8/16 kHz carriers, eSpeak NG's
# 22050 Hz, WAV files at CD and studio rates, and an awkward one.
DOWN = [
    (16000, 8000),
    (24000, 8000),
    (24000, 16000),
    (22050, 8000),
    (22050, 16000),
    (44100, 8000),
    (48000, 8000),
    (48000, 16000),
    (32000, 8000),
    (24000, 8001),
]


def taps(src: int, dst: int) -> np.ndarray:
    return np.frombuffer(design_taps(src, dst), dtype=np.int16).astype(np.float64) / 16384


def test_the_package_was_built_with_the_compiled_filter() -> None:
    assert antialias.COMPILED, "appbridge/media/_lowpass.c was not built: reinstall with a compiler"


@pytest.mark.parametrize(("src", "dst"), DOWN)
def test_the_band_passes_and_what_would_fold_is_stopped(src: int, dst: int) -> None:
    h = taps(src, dst)
    response = np.abs(np.fft.rfft(h, 1 << 16))
    freqs = np.fft.rfftfreq(1 << 16, 1 / src)
    passband = 20 * np.log10(response[freqs <= PASS_EDGE * dst])
    assert passband.max() < 0.1 and passband.min() > -0.1
    assert 20 * np.log10(response[freqs >= STOP_EDGE * dst].max()) <= -50
    assert h.sum() == 1.0  # DC passes unchanged
    assert len(h) % 2 == 1 and (len(h) - 1) / 2 / src <= 0.0015  # linear phase, <= 1.5 ms late


@pytest.mark.parametrize(("src", "dst"), [(16000, 8000), (24000, 8000), (22050, 8000)])
def test_a_converter_no_longer_folds_a_tone_into_the_band(src: int, dst: int) -> None:
    convert = Converter(AudioFormat("pcm16", src), AudioFormat("pcm16", dst))
    high = convert.convert(tone_pcm16(6000, 1000, src, amplitude=16000))
    assert rms(high[400:]) < 16000 / math.sqrt(2) * 10 ** (-50 / 20)  # 2 kHz at -50 dB or less
    convert.reset()
    # The filter is flat within 0.1 dB; at a ratio that is not whole, the linear interpolation
    # after it droops by itself (0.5 dB at 3 kHz and 0.7 dB at 3.4 kHz from 22050 Hz).
    droop_db = 0.1 if src % dst == 0 else 1.0
    for freq in (300, 1000, 3000, 3400):
        heard = convert.convert(tone_pcm16(freq, 500, src, amplitude=16000))[400:]
        assert abs(20 * math.log10(rms(heard) / (16000 / math.sqrt(2)))) < droop_db, freq


def test_a_wideband_app_to_a_g711_caller_is_filtered_too() -> None:
    convert = Converter(AudioFormat("pcm16", 16000), PCMU_8K)
    back = Converter(PCMU_8K, AudioFormat("pcm16", 8000))
    heard = back.convert(convert.convert(tone_pcm16(5000, 1000, 16000, amplitude=16000)))
    assert rms(heard[400:]) < 40  # 3 kHz at -52 dB or more, under µ-law's smallest steps


@pytest.mark.parametrize(("src", "dst"), [(16000, 8000), (24000, 8000), (22050, 8000)])
def test_the_compiled_filter_gives_numpys_samples_whatever_the_chunking(src: int, dst: int) -> None:
    rng = random.Random(src + dst)
    coefficients = design_taps(src, dst)
    compiled, reference = lowpass_for(src, dst), NumpyLowpass(coefficients)
    assert compiled is not None and type(compiled) is not NumpyLowpass
    for _ in range(300):
        size = rng.choice([0, 1, 2, 3, 80, 159, 160, 320, 441, 960, 4000, 9000])  # past a block
        if rng.random() < 0.2:  # full scale, both signs: saturation at the edges
            data = (b"\xff\x7f\x00\x80" * size)[: 2 * size]
        else:
            data = bytes(rng.getrandbits(8) for _ in range(2 * size))
        assert compiled.filter(data) == reference.filter(data)
    compiled.reset()
    reference.reset()
    assert compiled.filter(b"\x10\x27" * 50) == reference.filter(b"\x10\x27" * 50)


@pytest.mark.parametrize(("src", "dst"), [(16000, 8000), (24000, 16000), (22050, 8000)])
def test_a_stream_converts_the_same_whatever_its_chunking(src: int, dst: int) -> None:
    rng = np.random.default_rng(7)
    audio = (rng.standard_normal(src) * 6000).astype("<i2").tobytes()
    whole = Converter(AudioFormat("pcm16", src), AudioFormat("pcm16", dst)).convert(audio)
    chunked = Converter(AudioFormat("pcm16", src), AudioFormat("pcm16", dst))
    parts, at = [], 0
    for size in [1, 319, 320, 3, 960, 441] * 400:
        parts.append(chunked.convert(audio[at : at + size]))
        at += size
    parts.append(chunked.convert(audio[at:]))
    assert b"".join(parts) == whole


def test_reset_forgets_the_history() -> None:
    fresh = Converter(AudioFormat("pcm16", 16000), AudioFormat("pcm16", 8000))
    used = Converter(AudioFormat("pcm16", 16000), AudioFormat("pcm16", 8000))
    used.convert(tone_pcm16(1000, 100, 16000, amplitude=20000))
    used.reset()
    frame = tone_pcm16(700, 20, 16000, amplitude=9000)
    assert used.convert(frame) == fresh.convert(frame)


def test_no_filter_where_nothing_can_fold() -> None:
    assert lowpass_for(8000, 16000) is None  # up: interpolation adds no alias in the old band
    assert lowpass_for(8000, 8000) is None
    assert lowpass_for(16001, 16000) is None  # what folds lands above 0.425 of the new rate
    with pytest.raises(ValueError):
        design_taps(8000, 16000)


@pytest.mark.parametrize("make", [NumpyLowpass, lambda c: type(lowpass_for(16000, 8000))(c)])
def test_bad_taps_and_data_are_refused(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        make(b"\x00")  # half a tap
    with pytest.raises(ValueError):
        make(b"")
    with pytest.raises(ValueError):
        make(b"\xff\x7f" * 3)  # an absolute sum of 98301: the 32-bit sums could overflow
    good = make(design_taps(16000, 8000))
    with pytest.raises(ValueError):
        good.filter(b"\x00\x01\x02")


def test_an_uninitialised_compiled_filter_raises_rather_than_crashes() -> None:
    kind = type(lowpass_for(16000, 8000))
    bare = kind.__new__(kind)
    with pytest.raises(ValueError):
        bare.filter(b"\x00\x00")
    with pytest.raises(ValueError):
        bare.reset()


def rms(pcm16: bytes) -> float:
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0
