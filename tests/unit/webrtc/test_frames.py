"""Frame conversion between aiortc and the engine (appbridge/carriers/webrtc/frames.py)."""

from __future__ import annotations

import fractions
import itertools

import av
import numpy as np
import pytest

from appbridge.carriers.webrtc.frames import (
    SILENCE_SETTLE_FRAMES,
    InboundAudio,
    OutboundAudio,
    leg_format,
)
from appbridge.media.codecs import PCM16_8K, PCM16_16K, ulaw_to_pcm16
from appbridge.testing.audio import dominant_freq, tone_pcm16


def _frame(pcm: bytes, rate: int, layout: str = "mono", fmt: str = "s16") -> av.AudioFrame:
    channels = 2 if layout == "stereo" else 1
    samples = len(pcm) // 2 // channels
    frame = av.AudioFrame(format=fmt, layout=layout, samples=samples)
    frame.planes[0].update(pcm)
    frame.sample_rate = rate
    return frame


def _stereo(pcm: bytes) -> bytes:
    mono = np.frombuffer(pcm, dtype="<i2")
    return np.repeat(mono, 2).tobytes()


def test_leg_formats() -> None:
    assert leg_format("opus") == PCM16_16K
    assert leg_format("PCMU") == leg_format("pcma") == PCM16_8K
    with pytest.raises(ValueError):
        leg_format("G722")


def test_opus_frames_become_20_ms_of_16_khz_mono() -> None:
    """Opus decodes to 48 kHz stereo (RFC 7587): mixed down and resampled, the tone stays."""
    tone = tone_pcm16(440, 1000, 48000)
    conv = InboundAudio(16000)
    out: list[bytes] = []
    for start in range(0, len(tone), 1920):  # 20 ms of 48 kHz mono
        out += conv.convert(_frame(_stereo(tone[start : start + 1920]), 48000, "stereo"))
    assert all(len(f) == 640 for f in out)
    assert len(out) in (49, 50)  # the resampler may hold a sample or two back
    assert abs(dominant_freq(b"".join(out), 16000) - 440) < 5


def test_g711_frames_pass_at_8_khz() -> None:
    tone = tone_pcm16(1000, 100, 8000)
    conv = InboundAudio(8000)
    out = [
        f for i in range(0, len(tone), 320) for f in conv.convert(_frame(tone[i : i + 320], 8000))
    ]
    assert b"".join(out) == tone


def test_odd_sized_frames_are_recut_into_whole_frames() -> None:
    tone = tone_pcm16(500, 200, 8000)
    conv = InboundAudio(8000)
    out: list[bytes] = []
    for i in range(0, len(tone), 200):  # 12.5 ms pieces
        out += conv.convert(_frame(tone[i : i + 200], 8000))
    assert all(len(f) == 320 for f in out)
    assert b"".join(out) == tone[: len(out) * 320]


def test_other_sample_formats_go_through_the_fallback_resampler() -> None:
    samples = np.sin(np.arange(960) * 2 * np.pi * 300 / 48000).astype(np.float32) * 0.25
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="fltp", layout="mono")
    frame.sample_rate = 48000
    conv = InboundAudio(16000)
    out = b"".join(conv.convert(frame) + conv.convert(frame) + conv.convert(frame))
    assert len(out) % 640 == 0 and len(out) >= 640


def test_outbound_opus_is_encoded_here_with_pts_on_its_rtp_clock() -> None:
    wrap = OutboundAudio(PCM16_16K, "opus")
    packets = [wrap.wrap(tone_pcm16(440, 20, 16000)) for _ in range(3)]
    packets.append(wrap.wrap(b"\x00\x00" * 100))  # a short frame is padded to 20 ms
    sent = [p for p in packets if p is not None]
    assert len(sent) >= 3 and all(isinstance(p, av.Packet) for p in sent)
    assert sent[0].pts == 0  # libopus's look-ahead is taken out
    # Stamped on Opus's 48 kHz RTP clock (RFC 7587 §4.1): 960 per 20 ms.
    assert [b.pts - a.pts for a, b in itertools.pairwise(sent)] == [960] * (len(sent) - 1)
    assert all(p.time_base == fractions.Fraction(1, 48000) for p in sent)
    assert wrap.pts == 4 * 320  # in the leg's samples
    decoder = av.CodecContext.create("libopus", "r")
    decoded = b"".join(
        bytes(f.planes[0])[: f.samples * 2 * len(f.layout.channels)]
        for p in sent
        for f in decoder.decode(av.Packet(bytes(p)))
    )
    assert decoded  # a real Opus stream


def test_settled_opus_silence_is_sent_again_without_encoding() -> None:
    wrap = OutboundAudio(PCM16_16K, "opus")
    tone = tone_pcm16(440, 20, 16000)
    packets = [wrap.wrap(tone) for _ in range(5)]
    silent = [wrap.wrap_silence() for _ in range(SILENCE_SETTLE_FRAMES + 20)]
    packets += silent + [wrap.wrap(tone) for _ in range(10)]
    sent = [p for p in packets if p is not None]
    repeated = [bytes(p) for p in silent[SILENCE_SETTLE_FRAMES:]]
    assert len(set(repeated)) == 1 and repeated[0] == bytes(silent[SILENCE_SETTLE_FRAMES - 1])
    # Timestamps only rise, by whole frames: the frame libopus held back is dropped, once.
    steps = [b.pts - a.pts for a, b in itertools.pairwise(sent)]
    assert all(step > 0 and step % 960 == 0 for step in steps) and steps.count(1920) == 1
    assert len(sent) == len(packets) - 1  # the held-back frame, only
    decoder = av.CodecContext.create("libopus", "r")
    pcm = [
        np.frombuffer(bytes(f.planes[0])[: f.samples * 2 * len(f.layout.channels)], "<i2")
        for p in sent
        for f in decoder.decode(av.Packet(bytes(p)))
    ]
    quiet = np.concatenate(pcm[10:20]).astype(float)
    loud = np.concatenate(pcm[-5:]).astype(float)
    assert np.sqrt(np.mean(quiet**2)) < 30 < 1000 < np.sqrt(np.mean(loud**2))


def test_outbound_g711_is_encoded_once_as_a_packet() -> None:
    wrap = OutboundAudio(PCM16_8K, "PCMU")
    tone = tone_pcm16(1000, 20, 8000)
    packet = wrap.wrap(tone)
    assert isinstance(packet, av.Packet)
    assert (packet.pts, packet.time_base) == (0, fractions.Fraction(1, 8000))
    decoded = np.frombuffer(ulaw_to_pcm16(bytes(packet)), dtype="<i2").astype(float)
    original = np.frombuffer(tone, dtype="<i2").astype(float)
    assert len(bytes(packet)) == 160
    assert np.max(np.abs(decoded - original)) < 300  # µ-law's quantisation
    assert wrap.wrap(tone).pts == 160
