"""The level of one audio frame in dBFS, for the console's meters (docs/operations.md,
"The console and the softphone").

The console samples the last frame seen in each direction about four times a second, so this
runs a few times a second per call, never per frame. A frame is decoded from the leg's codec
(G.711 µ-law or A-law, ITU-T G.711; or linear pcm16) and its RMS taken with audioop's C loop.
G.722 frames are ADPCM steps that only a decoder with the stream's history can read, so they
are not measured.
"""

from __future__ import annotations

import math
import warnings
from typing import Final

from appbridge.media.codecs import alaw_to_pcm16, ulaw_to_pcm16

with warnings.catch_warnings():
    # Deprecated in 3.11/3.12; `audioop-lts` keeps the module name on 3.13 (media/codecs.py).
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

#: What silence (and a direction with no audio) reads as.
SILENCE_DBFS: Final = -100.0
FULL_SCALE: Final = 32768.0


def dbfs(frame: bytes, codec: str) -> float:
    """The frame's RMS level relative to full scale, rounded to 0.1 dB; -100 for silence."""
    if not frame:
        return SILENCE_DBFS
    if codec == "pcmu":
        pcm = ulaw_to_pcm16(frame)
    elif codec == "pcma":
        pcm = alaw_to_pcm16(frame)
    elif codec == "pcm16":
        pcm = frame[: len(frame) & ~1]
    else:
        return SILENCE_DBFS
    if not pcm:
        return SILENCE_DBFS
    rms = audioop.rms(pcm, 2)
    if rms <= 0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, round(20.0 * math.log10(rms / FULL_SCALE), 1))
