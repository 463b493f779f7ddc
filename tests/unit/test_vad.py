"""The per-frame VAD (WebRTC) and the frame level helper, on synthesised telephone speech."""

from __future__ import annotations

import numpy as np
import pytest

from appbridge.turn.vad import SILENCE_DBFS, Vad, frame_dbfs
from tests.unit.test_local_stt import silence, telephone_speech

SENTENCE = "Please transfer me to the billing department."


def frames(pcm16: bytes, rate_hz: int, frame_ms: int = 20) -> list[bytes]:
    step = rate_hz * frame_ms // 1000 * 2
    return [pcm16[i : i + step] for i in range(0, len(pcm16) - step + 1, step)]


@pytest.mark.parametrize("rate_hz", [8000, 16000, 24000])
def test_speech_is_speech_and_silence_is_not(rate_hz: int) -> None:
    speech = telephone_speech(SENTENCE, rate_hz)
    audio = silence(500, rate_hz) + speech + silence(500, rate_hz)
    vad = Vad(rate_hz)
    bits = [vad.is_speech(f) for f in frames(audio, rate_hz)]
    n_speech = len(speech) // (rate_hz // 50 * 2)
    lead, body, tail = bits[:25], bits[25 : 25 + n_speech], bits[25 + n_speech + 5 :]
    assert not any(lead) and not any(tail)
    assert sum(body) / len(body) > 0.7  # pauses between words are short non-speech runs
    assert any(body[:5]) and any(body[-5:])  # onset and end are found within a few frames


@pytest.mark.parametrize(("frame_ms", "rate_hz"), [(10, 8000), (30, 16000), (10, 24000)])
def test_frame_lengths(frame_ms: int, rate_hz: int) -> None:
    audio = telephone_speech(SENTENCE, rate_hz)
    vad = Vad(rate_hz, frame_ms=frame_ms)
    assert vad.frame_bytes == rate_hz * frame_ms // 1000 * 2
    bits = [vad.is_speech(f) for f in frames(audio, rate_hz, frame_ms)]
    assert sum(bits) / len(bits) > 0.6


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Vad(11025)
    with pytest.raises(ValueError):
        Vad(8000, frame_ms=25)
    with pytest.raises(ValueError):
        Vad(8000, aggressiveness=4)
    vad = Vad(8000)
    with pytest.raises(ValueError):
        vad.is_speech(bytes(318))


def test_energy_gate() -> None:
    rate_hz = 8000
    speech = telephone_speech(SENTENCE, rate_hz)
    quiet = (np.frombuffer(speech, dtype="<i2") * 10 ** (-45 / 20)).astype("<i2").tobytes()
    gated = Vad(rate_hz)
    assert not any(gated.is_speech(f) for f in frames(quiet, rate_hz))
    ungated = Vad(rate_hz, min_dbfs=None)
    assert any(ungated.is_speech(f) for f in frames(quiet, rate_hz))


def test_frame_dbfs() -> None:
    assert frame_dbfs(bytes(320)) == SILENCE_DBFS
    assert frame_dbfs(b"") == SILENCE_DBFS
    square = np.tile(np.array([32767, -32767], dtype="<i2"), 80).tobytes()
    assert frame_dbfs(square) == pytest.approx(0.0, abs=0.01)
    half = np.tile(np.array([16384, -16384], dtype="<i2"), 80).tobytes()
    assert frame_dbfs(half) == pytest.approx(-6.02, abs=0.01)
    t = np.arange(160) / 8000
    sine = (np.sin(2 * np.pi * 1000 * t) * 32767 * 0.1).astype("<i2").tobytes()
    assert frame_dbfs(sine) == pytest.approx(-23.0, abs=0.1)  # -20 dB peak, -3 dB for RMS
    assert frame_dbfs(sine + b"\x01") == frame_dbfs(sine)  # a stray odd byte is ignored
