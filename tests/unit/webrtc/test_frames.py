"""RTP payloads to and from the engine's frames (appbridge/carriers/webrtc/frames.py)."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest

from appbridge.carriers.webrtc.frames import (
    SILENCE_SETTLE_FRAMES,
    InboundAudio,
    OutboundAudio,
    leg_format,
    rtp_clock_hz,
)
from appbridge.media.codecs import (
    PCM16_8K,
    PCM16_16K,
    pcm16_to_alaw,
    pcm16_to_ulaw,
    ulaw_to_pcm16,
)
from appbridge.testing.audio import dominant_freq, tone_pcm16


def _opus_packets(pcm16: bytes, rate: int, channels: int = 1) -> list[bytes]:
    """A browser's Opus stream of ``pcm16`` (20 ms packets), made with libopus."""
    layout = "stereo" if channels == 2 else "mono"
    enc = av.CodecContext.create("libopus", "w")
    enc.format, enc.layout, enc.sample_rate = "s16", layout, rate
    enc.time_base = fractions.Fraction(1, rate)
    step = rate // 50 * 2 * channels
    packets: list[bytes] = []
    for i, start in enumerate(range(0, len(pcm16) - step + 1, step)):
        frame = av.AudioFrame(format="s16", layout=layout, samples=rate // 50)
        frame.planes[0].update(pcm16[start : start + step])
        frame.sample_rate, frame.pts = rate, i * rate // 50
        frame.time_base = fractions.Fraction(1, rate)
        packets += [bytes(p) for p in enc.encode(frame)]
    return packets


def _stereo(pcm: bytes) -> bytes:
    mono = np.frombuffer(pcm, dtype="<i2")
    return np.repeat(mono, 2).tobytes()


def test_leg_formats() -> None:
    assert leg_format("opus") == PCM16_16K
    assert leg_format("PCMU") == leg_format("pcma") == PCM16_8K
    with pytest.raises(ValueError):
        leg_format("G722")


def test_opus_from_a_browser_becomes_20_ms_of_16_khz_mono() -> None:
    """A stereo Opus stream (RFC 7587) decodes straight to mono and is resampled; the tone
    stays."""
    tone = tone_pcm16(440, 1000, 48000)
    conv = InboundAudio("opus", 16000)
    out: list[bytes] = []
    for packet in _opus_packets(_stereo(tone), 48000, channels=2):
        out += conv.decode(packet)
    assert all(len(f) == 640 for f in out)
    assert len(out) in (48, 49, 50)  # libopus and the resampler hold a little back
    assert abs(dominant_freq(b"".join(out[5:]), 16000) - 440) < 5


def test_fullband_opus_above_8_khz_does_not_fold_into_the_16_khz_leg() -> None:
    """A browser encodes fullband Opus: its 12 kHz would reach the leg as 4 kHz without the
    low-pass filter before the rate drops (media/antialias.py)."""
    conv = InboundAudio("opus", 16000)
    out: list[bytes] = []
    high = tone_pcm16(12000, 600, 48000, amplitude=12000)
    for packet in _opus_packets(high + tone_pcm16(1000, 600, 48000, amplitude=12000), 48000):
        out += conv.decode(packet)
    heard = np.frombuffer(b"".join(out), dtype="<i2").astype(np.float64)
    folded, band = heard[3200:9000], heard[13000:18000]  # after libopus's priming
    assert np.sqrt(np.mean(folded**2)) < np.sqrt(np.mean(band**2)) * 10 ** (-40 / 20)
    assert abs(dominant_freq(b"".join(out)[26000:36000], 16000) - 1000) < 5


def test_g711_payloads_decode_at_8_khz() -> None:
    tone = tone_pcm16(1000, 100, 8000)
    conv = InboundAudio("PCMU", 8000)
    out = [
        f for i in range(0, len(tone), 320) for f in conv.decode(pcm16_to_ulaw(tone[i : i + 320]))
    ]
    assert all(len(f) == 320 for f in out) and len(out) == 5
    decoded = np.frombuffer(b"".join(out), dtype="<i2").astype(float)
    assert np.max(np.abs(decoded - np.frombuffer(tone, dtype="<i2"))) < 300


def test_odd_sized_payloads_are_recut_into_whole_frames() -> None:
    tone = tone_pcm16(500, 200, 8000)
    conv = InboundAudio("PCMA", 8000)
    out: list[bytes] = []
    for i in range(0, len(tone), 200):  # 12.5 ms packets
        out += conv.decode(pcm16_to_alaw(tone[i : i + 200]))
    assert all(len(f) == 320 for f in out) and len(out) == 10


def test_a_payload_the_decoder_refuses_is_heard_as_nothing() -> None:
    conv = InboundAudio("opus", 16000)
    assert conv.decode(b"\xff" * 3) == []
    tone = tone_pcm16(440, 100, 16000)
    assert sum(len(conv.decode(p)) for p in _opus_packets(tone, 16000)) >= 3


def _decoded(packets: list[bytes]) -> list[np.ndarray]:
    decoder = av.CodecContext.create("libopus", "r")
    return [
        np.frombuffer(bytes(f.planes[0])[: f.samples * 2 * len(f.layout.channels)], "<i2")
        for p in packets
        for f in decoder.decode(av.Packet(p))
    ]


def test_outbound_opus_is_one_packet_a_tick_after_libopus_primes() -> None:
    wrap = OutboundAudio(PCM16_16K, "opus")
    payloads = [wrap.audio(tone_pcm16(440, 20, 16000)) for _ in range(3)]
    payloads.append(wrap.audio(b"\x00\x00" * 100))  # a short frame is padded to 20 ms
    sent = [p for p in payloads if p is not None]
    assert len(sent) >= 3 and all(isinstance(p, bytes) for p in sent)
    assert payloads[-1] is not None  # after the first, every tick has its packet
    assert _decoded(sent)  # a real Opus stream


def test_settled_opus_silence_is_sent_again_without_encoding() -> None:
    wrap = OutboundAudio(PCM16_16K, "opus")
    tone = tone_pcm16(440, 20, 16000)
    payloads = [wrap.audio(tone) for _ in range(5)]
    silent = [wrap.silence() for _ in range(SILENCE_SETTLE_FRAMES + 20)]
    resumed = [wrap.audio(tone) for _ in range(10)]
    repeated = silent[SILENCE_SETTLE_FRAMES:]
    assert len(set(repeated)) == 1 and repeated[0] == silent[SILENCE_SETTLE_FRAMES - 1]
    # The frame libopus held back when the repeats took over is dropped, once: that tick
    # sends nothing (the leg skips its RTP timestamp).
    assert resumed.count(None) == 1 and resumed[0] is None
    sent = [p for p in payloads + silent + resumed if p is not None]
    pcm = _decoded(sent)
    quiet = np.concatenate(pcm[10:20]).astype(float)
    loud = np.concatenate(pcm[-5:]).astype(float)
    assert np.sqrt(np.mean(quiet**2)) < 30 < 1000 < np.sqrt(np.mean(loud**2))


def test_outbound_g711_is_encoded_once_per_frame() -> None:
    wrap = OutboundAudio(PCM16_8K, "PCMU")
    tone = tone_pcm16(1000, 20, 8000)
    payload = wrap.audio(tone)
    assert payload is not None and len(payload) == 160
    decoded = np.frombuffer(ulaw_to_pcm16(payload), dtype="<i2").astype(float)
    original = np.frombuffer(tone, dtype="<i2").astype(float)
    assert np.max(np.abs(decoded - original)) < 300  # µ-law's quantisation
    assert wrap.silence() == pcm16_to_ulaw(bytes(320))  # G.711 silence is encoded every tick


def test_rtp_clocks() -> None:
    assert rtp_clock_hz("opus") == 48000 and rtp_clock_hz("PCMU") == rtp_clock_hz("PCMA") == 8000
