"""The compiled sample-rate converter (appbridge/media/_ratecv.c) against audioop.ratecv."""

from __future__ import annotations

import random
import warnings

import pytest

from appbridge.media import resample
from appbridge.media.resample import ratecv

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

# Every rate pair the gateway converts between (carriers 8/16 kHz, sessions 8/16/24 kHz, eSpeak
# NG 22050 Hz, Deepgram 24 kHz, the STT model 16 kHz), and a few awkward ones.
RATIOS = [
    (8000, 16000),
    (16000, 8000),
    (8000, 24000),
    (24000, 8000),
    (16000, 24000),
    (24000, 16000),
    (22050, 16000),
    (22050, 8000),
    (22050, 24000),
    (8000, 8000),
    (44100, 8000),
    (11025, 16000),
    (7999, 16001),
]


def test_the_package_was_built_with_the_compiled_converter() -> None:
    # `make install` builds it (setup.py); the fallback is only for machines without a compiler.
    assert resample.COMPILED, "appbridge/media/_ratecv.c was not built: reinstall with a compiler"


def noise(rng: random.Random, samples: int) -> bytes:
    kind = rng.random()
    if kind < 0.2:  # full scale, both signs: the edges of the 32-bit arithmetic
        return (b"\xff\x7f\x00\x80" * samples)[: 2 * samples]
    return bytes(rng.getrandbits(8) for _ in range(2 * samples))


@pytest.mark.parametrize(("inrate", "outrate"), RATIOS)
def test_same_samples_and_state_as_audioop_whatever_the_chunking(inrate: int, outrate: int) -> None:
    rng = random.Random(inrate * 7 + outrate)
    for _ in range(60):
        ours = theirs = None
        for _ in range(6):
            data = noise(rng, rng.choice([0, 1, 2, 3, 80, 159, 160, 320, 441, 960]))
            a, theirs = audioop.ratecv(data, 2, 1, inrate, outrate, theirs)
            b, ours = ratecv(data, inrate, outrate, ours)
            assert (b, ours) == (a, theirs)


def test_the_state_is_interchangeable_with_audioops() -> None:
    rng = random.Random(5)
    first, second = noise(rng, 160), noise(rng, 160)
    _, state = audioop.ratecv(first, 2, 1, 8000, 16000, None)
    expected, _ = audioop.ratecv(second, 2, 1, 8000, 16000, state)
    assert ratecv(second, 8000, 16000, state)[0] == expected
    _, ours = ratecv(first, 16000, 8000, None)
    assert ratecv(second, 16000, 8000, ours) == audioop.ratecv(second, 2, 1, 16000, 8000, ours)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="whole number of frames"):
        ratecv(b"\x00\x01\x02", 8000, 16000, None)
    with pytest.raises(ValueError, match="inrate must be within"):
        ratecv(b"", 0, 16000, None)
    with pytest.raises(ValueError, match="outrate must be within"):
        ratecv(b"", 8000, 1 << 23, None)
    for state in [(0,), (0, ()), (0, ((1, 2), (3, 4))), (0, ((1,),)), (0, ((1 << 40, 0),))]:
        with pytest.raises(ValueError, match="illegal state"):
            ratecv(b"\x00\x00", 8000, 16000, state)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ratecv(b"", 8000, 16000)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ratecv("text", 8000, 16000, None)  # type: ignore[arg-type]
