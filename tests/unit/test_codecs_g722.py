"""G.722 as an engine format (media/codecs.py): sizes, silence, Converter paths, stream state."""

from __future__ import annotations

import numpy as np
import pytest

from appbridge.carriers.sip.leg import LEG_CODECS, audio_format_for
from appbridge.media import g722
from appbridge.media.codecs import (
    CODECS,
    G722_16K,
    PCM16_8K,
    PCM16_16K,
    PCM16_24K,
    PCMU_8K,
    AudioFormat,
    Converter,
)
from appbridge.media.output_queue import OutputQueue
from appbridge.media.reframe import FrameConverter
from appbridge.testing.audio import dominant_freq, goertzel_power, rms_pcm16, tone_pcm16

pytestmark = pytest.mark.skipif(not g722.AVAILABLE, reason="the G722 package is not installed")

AMPLITUDE = 8000


def in_frames(conv: Converter, data: bytes, frame_bytes: int) -> bytes:
    return b"".join(
        conv.convert(data[i : i + frame_bytes]) for i in range(0, len(data), frame_bytes)
    )


def test_format_sizes_follow_rfc3551_4_5_2() -> None:
    assert "g722" in CODECS
    assert AudioFormat("g722", 16000) == G722_16K and str(G722_16K) == "g722/16000"
    assert G722_16K.bits_per_sample == 4
    assert G722_16K.frame_bytes(20) == 160  # 320 samples of 16 kHz audio, 4 bits each
    assert G722_16K.frame_bytes(10) == 80
    assert G722_16K.ms_for_bytes(160) == 20 and G722_16K.ms_for_bytes(8000) == 1000
    assert G722_16K.silence(20) == b"\xfc" * 160
    with pytest.raises(ValueError, match="16000 Hz only"):
        AudioFormat("g722", 8000)
    with pytest.raises(ValueError, match="bits per sample"):
        _ = G722_16K.bytes_per_sample
    assert PCMU_8K.bytes_per_sample == 1 and PCM16_16K.bytes_per_sample == 2


def test_the_sip_leg_prefers_and_carries_g722() -> None:
    assert LEG_CODECS[0] == "G722" and set(LEG_CODECS) == {"G722", "PCMU", "PCMA"}
    assert audio_format_for("G722") == PCM16_16K  # the leg codes G.722 itself (one state)
    assert audio_format_for("PCMU") == PCMU_8K
    with pytest.raises(ValueError):
        audio_format_for("opus")


def test_a_1khz_tone_round_trips_at_16khz_with_its_frequency_and_level() -> None:
    pcm = tone_pcm16(1000, 1000, 16000, amplitude=AMPLITUDE)
    encode, decode = Converter(PCM16_16K, G722_16K), Converter(G722_16K, PCM16_16K)
    coded = in_frames(encode, pcm, 640)
    assert len(coded) == 8000  # 64 kbit/s
    out = in_frames(decode, coded, 160)
    assert len(out) == len(pcm)
    settled = out[3200:]  # past the ADPCM start-up
    assert abs(dominant_freq(settled, 16000) - 1000) < 5
    level = rms_pcm16(settled) / rms_pcm16(pcm[3200:])
    assert 0.9 < level < 1.1


def test_wideband_survives_where_g711_cannot() -> None:
    pcm = tone_pcm16(6000, 500, 16000, amplitude=AMPLITUDE)
    out = Converter(G722_16K, PCM16_16K).convert(Converter(PCM16_16K, G722_16K).convert(pcm))
    assert abs(dominant_freq(out[1600:], 16000) - 6000) < 10
    via_ulaw = Converter(PCMU_8K, PCM16_16K).convert(Converter(PCM16_16K, PCMU_8K).convert(pcm))
    # 8 kHz sampling cannot hold 6 kHz (audioop's resampler folds it down to 2 kHz).
    assert abs(dominant_freq(via_ulaw[1600:], 16000) - 6000) > 1000


@pytest.mark.parametrize("app_format", [PCM16_8K, PCM16_24K, PCMU_8K])
def test_resampling_paths_to_and_from_g722(app_format: AudioFormat) -> None:
    """The app's format to the caller's G.722 and back, in 20 ms frames as the engine does."""
    rate = app_format.rate_hz
    src = Converter(PCM16_8K if rate == 8000 else PCM16_24K, app_format).convert(
        tone_pcm16(700, 1000, rate, amplitude=AMPLITUDE)
    )
    to_caller = FrameConverter(app_format, G722_16K)
    coded = [
        f
        for i in range(0, len(src), app_format.frame_bytes())
        for f in to_caller.convert(src[i : i + app_format.frame_bytes()])
    ]
    assert coded and all(len(f) == 160 for f in coded)
    assert len(coded) >= 49
    to_app = FrameConverter(G722_16K, app_format)
    back = [f for packet in coded for f in to_app.convert(packet)]
    assert all(len(f) == app_format.frame_bytes() for f in back)
    pcm = (
        Converter(app_format, PCM16_8K).convert(b"".join(back))
        if app_format == PCMU_8K
        else b"".join(back)
    )
    out_rate = 8000 if app_format == PCMU_8K else rate
    assert abs(dominant_freq(pcm[len(pcm) // 4 :], out_rate) - 700) < 10


def test_odd_sample_counts_are_carried_to_the_next_chunk() -> None:
    pcm = tone_pcm16(440, 200, 16000, amplitude=AMPLITUDE)
    whole = Converter(PCM16_16K, G722_16K).convert(pcm)
    conv = Converter(PCM16_16K, G722_16K)
    pieces = b"".join(conv.convert(pcm[i : i + 333]) for i in range(0, len(pcm), 333))
    assert pieces == whole  # any chunking, odd bytes and lone samples included
    conv.reset()
    assert conv.pending_bytes == 0


def test_each_converter_owns_its_codec_state() -> None:
    """Two streams through two converters decode as if each were alone (no shared state)."""
    a = tone_pcm16(500, 200, 16000, amplitude=AMPLITUDE)
    b = tone_pcm16(1500, 200, 16000, amplitude=AMPLITUDE)
    alone = Converter(PCM16_16K, G722_16K).convert(a)
    ca, cb = Converter(PCM16_16K, G722_16K), Converter(PCM16_16K, G722_16K)
    interleaved = bytearray()
    for i in range(0, len(a), 640):
        interleaved += ca.convert(a[i : i + 640])
        cb.convert(b[i : i + 640])
    assert bytes(interleaved) == alone


def test_silence_frames_decode_quietly_whatever_came_before() -> None:
    speechy = tone_pcm16(300, 300, 16000, AMPLITUDE) + tone_pcm16(2500, 300, 16000, AMPLITUDE)
    decode = Converter(G722_16K, PCM16_16K)
    decode.convert(Converter(PCM16_16K, G722_16K).convert(speechy))
    quiet = decode.convert(G722_16K.silence(200))
    assert rms_pcm16(quiet[1600:]) < 60  # below -54 dBFS
    fresh = Converter(G722_16K, PCM16_16K).convert(G722_16K.silence(100))
    assert rms_pcm16(fresh) < 5


def test_the_output_queue_carries_g722_frames() -> None:
    queue = OutputQueue(G722_16K.frame_bytes(20), G722_16K.silence(20))
    assert queue.frame_bytes == 160 and queue.silence_frame == b"\xfc" * 160


def test_splicing_two_encoders_costs_a_burst_of_noise() -> None:
    """Why the caller-bound direction wants one encoder per call (codecs.py module doc): the far
    end's decoder, in step with encoder A, mis-decodes a fresh encoder B for tens of ms."""
    pcm = tone_pcm16(1000, 1000, 16000, amplitude=AMPLITUDE)
    half = len(pcm) // 2
    one = Converter(PCM16_16K, G722_16K).convert(pcm)
    spliced = Converter(PCM16_16K, G722_16K).convert(pcm[:half]) + Converter(
        PCM16_16K, G722_16K
    ).convert(pcm[half:])
    clean = Converter(G722_16K, PCM16_16K).convert(one)
    glitched = Converter(G722_16K, PCM16_16K).convert(spliced)
    window = slice(half, half + 640)  # the 20 ms after the splice

    def off_tone(data: bytes) -> float:
        total = float(np.mean(np.frombuffer(data, dtype="<i2").astype(np.float64) ** 2))
        return total - 2 * goertzel_power(data, 16000, 1000)

    assert off_tone(glitched[window]) > 100 * max(off_tone(clean[window]), 1.0)
