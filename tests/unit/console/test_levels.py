"""dBFS of one frame per codec (console/levels.py)."""

from __future__ import annotations

import math
import struct

import pytest

from appbridge.console.levels import SILENCE_DBFS, dbfs
from appbridge.media.codecs import pcm16_to_alaw, pcm16_to_ulaw


def sine(amplitude: float, n: int = 160) -> bytes:
    samples = [round(amplitude * 32767 * math.sin(2 * math.pi * 1000 * i / 8000)) for i in range(n)]
    return struct.pack(f"<{n}h", *samples)


def test_a_full_scale_sine_is_about_minus_3_dbfs() -> None:
    assert dbfs(sine(1.0), "pcm16") == pytest.approx(-3.0, abs=0.2)
    assert dbfs(sine(0.1), "pcm16") == pytest.approx(-23.0, abs=0.2)


@pytest.mark.parametrize(("codec", "encode"), [("pcmu", pcm16_to_ulaw), ("pcma", pcm16_to_alaw)])
def test_g711_frames_are_decoded_first(codec: str, encode: object) -> None:
    frame = encode(sine(0.1))  # type: ignore[operator]
    assert dbfs(frame, codec) == pytest.approx(-23.0, abs=0.5)


def test_silence_and_unmeasured_codecs_read_minus_100() -> None:
    assert dbfs(b"", "pcm16") == SILENCE_DBFS
    assert dbfs(bytes(320), "pcm16") == SILENCE_DBFS
    assert dbfs(b"\xff" * 160, "pcmu") == SILENCE_DBFS
    assert dbfs(b"\x12" * 80, "g722") == SILENCE_DBFS
    assert dbfs(b"\x01\x00\x02", "pcm16") > SILENCE_DBFS  # an odd byte is ignored
