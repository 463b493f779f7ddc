"""Audio formats and the streaming converter (appbridge.media.codecs)."""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appbridge.media.codecs import (
    PCM16_8K,
    PCM16_16K,
    PCM16_24K,
    PCMA_8K,
    PCMU_8K,
    AudioFormat,
    Converter,
    alaw_to_pcm16,
    pcm16_to_alaw,
    pcm16_to_ulaw,
    ulaw_to_pcm16,
)


def _sine(freq_hz: float, rate_hz: int, seconds: float, amplitude: int = 12000) -> bytes:
    n = int(rate_hz * seconds)
    t = np.arange(n) / rate_hz
    samples = np.rint(amplitude * np.sin(2 * math.pi * freq_hz * t)).astype("<i2")
    out: bytes = samples.tobytes()
    return out


def _dominant_hz(pcm16: bytes, rate_hz: int) -> float:
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate_hz / len(samples))


# -- AudioFormat ---------------------------------------------------------------------------


def test_format_sizes() -> None:
    assert PCMU_8K.bytes_per_sample == 1
    assert PCM16_16K.bytes_per_sample == 2
    assert PCMU_8K.frame_bytes() == 160
    assert PCM16_16K.frame_bytes() == 640
    assert PCM16_8K.frame_bytes(20) == 320
    assert PCM16_24K.frame_bytes(10) == 480
    assert AudioFormat("pcm16", 22050).frame_bytes() == 882
    assert AudioFormat("pcm16", 11025).frame_bytes() == 440  # 220.5 samples round down


def test_format_silence_values() -> None:
    assert PCMU_8K.silence(20) == b"\xff" * 160
    assert PCMA_8K.silence(20) == b"\xd5" * 160
    assert PCM16_16K.silence(10) == b"\x00" * 320
    assert PCMU_8K.silence(0) == b""
    # G.711 silence really decodes to (near) zero.
    assert set(ulaw_to_pcm16(PCMU_8K.silence(20))) == {0}
    assert max(abs(s) for (s,) in struct.iter_unpack("<h", alaw_to_pcm16(PCMA_8K.silence(20)))) < 16


def test_format_ms_for_bytes() -> None:
    assert PCMU_8K.ms_for_bytes(160) == 20
    assert PCMU_8K.ms_for_bytes(8000) == 1000
    assert PCM16_16K.ms_for_bytes(640) == 20
    assert PCM16_16K.ms_for_bytes(641) == 20  # odd byte is not a sample
    assert PCM16_16K.ms_for_bytes(31) == 0


def test_format_rejects_unknown_codec_and_bad_rates() -> None:
    with pytest.raises(ValueError, match="unknown codec"):
        AudioFormat("opus", 48000)
    with pytest.raises(ValueError, match="out of range"):
        AudioFormat("pcm16", 0)
    with pytest.raises(ValueError, match="out of range"):
        AudioFormat("pcmu", -8000)


def test_format_is_hashable_value() -> None:
    assert AudioFormat("pcmu", 8000) == PCMU_8K
    assert len({PCMU_8K, AudioFormat("pcmu", 8000), PCM16_16K}) == 2
    assert str(PCM16_16K) == "pcm16/16000"


# -- G.711 helpers -------------------------------------------------------------------------


def test_ulaw_known_values() -> None:
    decoded = struct.unpack("<3h", ulaw_to_pcm16(b"\xff\x00\x80"))
    assert decoded == (0, -32124, 32124)  # G.711 table 2a end points


def test_ulaw_round_trip_every_code() -> None:
    codes = bytes(range(256))
    back = pcm16_to_ulaw(ulaw_to_pcm16(codes))
    # 0x7F is -0, which encodes back as +0 (0xFF); every other code survives.
    expected = bytes(0xFF if c == 0x7F else c for c in codes)
    assert back == expected


def test_alaw_round_trip_every_code() -> None:
    codes = bytes(range(256))
    assert pcm16_to_alaw(alaw_to_pcm16(codes)) == codes


def test_helpers_reject_odd_pcm16() -> None:
    with pytest.raises(ValueError, match="even length"):
        pcm16_to_ulaw(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="even length"):
        pcm16_to_alaw(b"\x00")


# -- Converter -----------------------------------------------------------------------------


def test_identity_returns_the_same_object() -> None:
    conv = Converter(PCM16_16K, AudioFormat("pcm16", 16000))
    data = b"\x01\x02\x03"  # even an odd length passes through untouched
    assert conv.is_identity
    assert conv.convert(data) is data
    assert conv.pending_bytes == 0


def test_pcmu_to_pcm16_same_rate_is_plain_decode() -> None:
    data = bytes(range(256))
    assert Converter(PCMU_8K, PCM16_8K).convert(data) == ulaw_to_pcm16(data)


def test_pcm16_to_pcmu_same_rate_is_plain_encode() -> None:
    pcm = _sine(440, 8000, 0.1)
    assert Converter(PCM16_8K, PCMU_8K).convert(pcm) == pcm16_to_ulaw(pcm)


def test_pcma_both_ways() -> None:
    pcm = _sine(440, 8000, 0.1)
    alaw = Converter(PCM16_8K, PCMA_8K).convert(pcm)
    assert alaw == pcm16_to_alaw(pcm)
    assert Converter(PCMA_8K, PCMU_8K).convert(alaw) == pcm16_to_ulaw(alaw_to_pcm16(alaw))


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (PCM16_16K, PCMU_8K),
        (PCMU_8K, PCM16_16K),
        (PCMU_8K, PCM16_24K),
        (AudioFormat("pcm16", 22050), PCMU_8K),
        (AudioFormat("pcm16", 44100), PCM16_16K),
        (AudioFormat("pcm16", 48000), PCMU_8K),
    ],
)
def test_resampling_keeps_duration_and_pitch(src: AudioFormat, dst: AudioFormat) -> None:
    pcm = _sine(440, src.rate_hz, 1.0)
    data = pcm if src.codec == "pcm16" else pcm16_to_ulaw(pcm)
    out = Converter(src, dst).convert(data)
    out_pcm = out if dst.codec == "pcm16" else ulaw_to_pcm16(out)
    n_out = len(out_pcm) // 2
    assert abs(n_out - dst.rate_hz) <= 2  # one second in, one second out
    assert abs(_dominant_hz(out_pcm, dst.rate_hz) - 440) < 3


def test_odd_pcm16_byte_is_carried_to_the_next_chunk() -> None:
    pcm = _sine(300, 16000, 0.02)
    conv = Converter(PCM16_16K, PCMU_8K)
    first = conv.convert(pcm[:1])
    assert first == b""
    assert conv.pending_bytes == 1
    rest = conv.convert(pcm[1:])
    assert conv.pending_bytes == 0
    assert first + rest == Converter(PCM16_16K, PCMU_8K).convert(pcm)


def test_reset_forgets_state() -> None:
    pcm = _sine(300, 16000, 0.1)
    conv = Converter(PCM16_16K, PCMU_8K)
    fresh = conv.convert(pcm)
    conv.convert(pcm[:5])
    conv.reset()
    assert conv.pending_bytes == 0
    assert conv.convert(pcm) == fresh


_FORMATS = [
    PCMU_8K,
    PCMA_8K,
    PCM16_8K,
    PCM16_16K,
    PCM16_24K,
    AudioFormat("pcm16", 22050),
    AudioFormat("pcm16", 44100),
    AudioFormat("pcm16", 48000),
]


@settings(max_examples=150, deadline=None)
@given(
    src=st.sampled_from(_FORMATS),
    dst=st.sampled_from(_FORMATS),
    data=st.binary(min_size=0, max_size=3000),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12),
)
def test_chunked_stream_converts_like_the_whole(
    src: AudioFormat, dst: AudioFormat, data: bytes, cuts: list[int]
) -> None:
    whole = Converter(src, dst).convert(data)
    conv = Converter(src, dst)
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    pieces = [conv.convert(data[a:b]) for a, b in itertools.pairwise(bounds)]
    assert b"".join(pieces) == whole


def test_per_frame_stream_matches_one_shot_for_a_long_call() -> None:
    pcm = _sine(523, 16000, 2.0)
    one_shot = Converter(PCM16_16K, PCMU_8K).convert(pcm)
    conv = Converter(PCM16_16K, PCMU_8K)
    frame = PCM16_16K.frame_bytes()
    streamed = b"".join(conv.convert(pcm[i : i + frame]) for i in range(0, len(pcm), frame))
    assert streamed == one_shot
    assert len(streamed) == 16000  # 2 s of 8 kHz µ-law
