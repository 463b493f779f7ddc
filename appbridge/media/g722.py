"""G.722 wideband audio (ITU-T G.722, 64 kbit/s sub-band ADPCM) for SIP calls.

Why a wheel and not our own code: the `G722` package on PyPI (libg722 by Sippy Software, public
domain, maintained, manylinux wheels) is a C implementation that is bit-exact to the ITU
specification and passes the ITU test vectors, at a few microseconds per 20 ms frame; an ADPCM
codec in per-sample Python would cost milliseconds per frame and per call. When the wheel is not
installed `AVAILABLE` is false and the SDP layer leaves G.722 out of offers and answers
(`sdp.default_codecs()`), so a call is never negotiated to a codec we cannot run.

The famous quirk (RFC 3551 section 4.5.2): G.722 samples audio at 16 kHz, but its RTP clock
rate is 8000 Hz, as the first RFC 1890 wrongly said and every implementation kept. A 20 ms
packet therefore holds 160 bytes (320 samples of 16 kHz audio, 4 bits each) and advances the RTP
timestamp by 160, exactly as G.711 does. `RTP_CLOCK_RATE_HZ` and `SAMPLE_RATE_HZ` keep the two
apart.

Each encoder and decoder carries ADPCM state from frame to frame: use one of each per call
direction, feed frames in order, and never share them between calls.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any, Final

__all__ = [
    "AVAILABLE",
    "BIT_RATE",
    "FRAME_BYTES_20MS",
    "PCM_BYTES_20MS",
    "RTP_CLOCK_RATE_HZ",
    "SAMPLE_RATE_HZ",
    "G722Decoder",
    "G722Encoder",
    "G722Unavailable",
]


def _load() -> Any:
    try:
        import G722
    except ImportError:  # pragma: no cover - exercised only where the wheel is missing
        return None
    return G722


_lib: Any = _load()

AVAILABLE: Final[bool] = _lib is not None
SAMPLE_RATE_HZ: Final = 16_000
RTP_CLOCK_RATE_HZ: Final = 8_000
BIT_RATE: Final = 64_000
FRAME_BYTES_20MS: Final = BIT_RATE // 8 // 50  # 160 bytes per 20 ms packet
PCM_BYTES_20MS: Final = SAMPLE_RATE_HZ // 50 * 2  # 640 bytes of pcm16 at 16 kHz
_SWAP: Final = sys.byteorder != "little"


class G722Unavailable(RuntimeError):
    """The `G722` wheel is not installed; G.722 must not have been negotiated."""


def _new_codec() -> Any:
    if _lib is None:
        raise G722Unavailable("G.722 needs the 'G722' package (pip install G722)")
    return _lib.G722(SAMPLE_RATE_HZ, BIT_RATE)


class G722Encoder:
    """Encodes 16 kHz pcm16 (little-endian) to G.722 at 64 kbit/s: 4 bits per input sample
    pair, so 640 bytes (20 ms) become 160 bytes."""

    __slots__ = ("_codec",)

    def __init__(self) -> None:
        self._codec = _new_codec()

    def encode(self, pcm16: bytes) -> bytes:
        """Encodes a whole number of sample pairs; raises ValueError otherwise (G.722's QMF
        consumes two input samples per output code)."""
        if len(pcm16) % 4:
            raise ValueError(f"G.722 encodes sample pairs: {len(pcm16)} bytes is not 4n")
        samples = array("h")
        samples.frombytes(pcm16)
        if _SWAP:  # pragma: no cover - big-endian hosts only
            samples.byteswap()
        out: bytes = self._codec.encode(samples)
        return out


class G722Decoder:
    """Decodes G.722 at 64 kbit/s to 16 kHz pcm16 (little-endian): 160 bytes give 640."""

    __slots__ = ("_codec",)

    def __init__(self) -> None:
        self._codec = _new_codec()

    def decode(self, data: bytes) -> bytes:
        samples: array[int] = self._codec.decode(data)
        if _SWAP:  # pragma: no cover - big-endian hosts only
            samples.byteswap()
        return samples.tobytes()
