"""G.722 through the `G722` wheel: sizes, round-trip quality, wideband, streaming state."""

from __future__ import annotations

import numpy as np
import pytest

from appbridge.carriers.sip import offer_answer, sdp
from appbridge.media import g722

pytestmark = pytest.mark.skipif(not g722.AVAILABLE, reason="the G722 package is not installed")

RATE_HZ = 16_000


def tone(freq_hz: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(RATE_HZ * seconds)) / RATE_HZ
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * freq_hz * t)).astype("<i2")


def round_trip(pcm: np.ndarray) -> np.ndarray:
    enc, dec = g722.G722Encoder(), g722.G722Decoder()
    out = bytearray()
    data = pcm.tobytes()
    for i in range(0, len(data), g722.PCM_BYTES_20MS):
        packet = enc.encode(data[i : i + g722.PCM_BYTES_20MS])
        assert len(packet) == g722.FRAME_BYTES_20MS
        out += dec.decode(packet)
    return np.frombuffer(bytes(out), dtype="<i2")


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """Best SNR over the codec's delay (QMF analysis + synthesis: a few dozen samples)."""
    best = -np.inf
    skip = 800  # let the ADPCM predictors settle
    r = ref[skip:-100].astype(np.float64)
    for lag in range(64):
        o = out[skip + lag : skip + lag + len(r)].astype(np.float64)
        noise = np.sum((r - o) ** 2)
        best = max(best, 10 * np.log10(np.sum(r**2) / max(noise, 1e-9)))
    return float(best)


def test_frame_sizes_and_rtp_clock_quirk() -> None:
    assert g722.RTP_CLOCK_RATE_HZ == 8000 and g722.SAMPLE_RATE_HZ == 16000
    assert g722.PCM_BYTES_20MS == 640 and g722.FRAME_BYTES_20MS == 160
    assert sdp.G722.frame_units == 160  # 20 ms advances the RTP timestamp by 160, as G.711
    assert sdp.G722.audio_rate_hz == 16000
    enc = g722.G722Encoder()
    assert len(enc.encode(bytes(640))) == 160
    assert len(g722.G722Decoder().decode(bytes(160))) == 640


@pytest.mark.parametrize(
    ("freq_hz", "min_snr_db"), [(440.0, 45.0), (1000.0, 40.0), (3000.0, 35.0), (6000.0, 22.0)]
)
def test_round_trip_snr_on_tones(freq_hz: float, min_snr_db: float) -> None:
    """Measured with libg722 1.2.8: 57, 47, 41 and 27 dB."""
    pcm = tone(freq_hz, 1.0)
    assert snr_db(pcm, round_trip(pcm)) > min_snr_db


def test_wideband_tone_above_narrowband_survives() -> None:
    """6 kHz cannot pass G.711 at 8 kHz; G.722's upper sub-band carries it."""
    pcm = tone(6000.0, 1.0)
    out = round_trip(pcm)[1600:].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    peak_hz = np.argmax(spectrum) * RATE_HZ / len(out)
    assert abs(peak_hz - 6000.0) < 20
    assert np.sqrt(np.mean(out**2)) > 0.5 * 0.3 * 32767 / np.sqrt(2)


def test_streaming_in_frames_equals_one_call() -> None:
    pcm = tone(1000.0, 0.2).tobytes()
    whole = g722.G722Encoder().encode(pcm)
    enc = g722.G722Encoder()
    pieces = b"".join(enc.encode(pcm[i : i + 640]) for i in range(0, len(pcm), 640))
    assert pieces == whole


def test_silence_round_trips_to_near_silence() -> None:
    out = round_trip(np.zeros(RATE_HZ // 2, dtype="<i2"))
    assert int(np.max(np.abs(out))) < 64


def test_encoder_rejects_partial_sample_pairs() -> None:
    with pytest.raises(ValueError):
        g722.G722Encoder().encode(bytes(642))


def test_without_the_wheel_g722_is_neither_offered_nor_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(g722, "AVAILABLE", False)
    monkeypatch.setattr(g722, "_lib", None)
    assert "G722" not in sdp.default_codecs()
    with pytest.raises(g722.G722Unavailable):
        g722.G722Encoder()
    neg = offer_answer.SdpNegotiator(
        local_address="10.0.0.1", rtp_port=20000, codecs=["G722", "PCMU"]
    )
    offer = neg.create_offer()
    assert offer.media[0].formats == ["0", "101"]
