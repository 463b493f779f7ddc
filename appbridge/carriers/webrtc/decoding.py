"""A browser's Opus decoded straight to mono (docs/webrtc.md, "Media").

aiortc's receiver decodes Opus to 48 kHz stereo, which the leg then mixes down to mono. libopus
decodes any stream to mono or stereo, whatever it was encoded as (RFC 6716 §2, RFC 7587 §3.1.1),
so asking it for mono saves half the decoder's output and the mix (docs/PERFORMANCE.md,
"Browser calls (WebRTC)"); FFmpeg's libopus decoder always answers at 48 kHz, so the leg still
resamples to its 16 kHz. aiortc
chooses decoders through ``aiortc.rtcrtpreceiver.get_decoder`` and has no option for this, so
:func:`decode_opus_to_mono` wraps that one function; this and carriers/webrtc/host_addresses.py
are the only places that touch aiortc's internals (docs/ARCHITECTURE.md).

The wrapper is process-wide, as the function is: every peer connection of the process then
decodes Opus to mono; other codecs keep aiortc's decoders.
"""

from __future__ import annotations

import fractions
from collections.abc import Callable
from typing import Any, Final

import aiortc.rtcrtpreceiver
import av

OPUS_RATE_HZ: Final = 48_000  # what FFmpeg's libopus decoder gives, whatever is asked
_RTP_TIME_BASE: Final = fractions.Fraction(1, 48_000)
_RECEIVER: Any = aiortc.rtcrtpreceiver  # the module whose name the receiver looks up
_ORIGINAL: Callable[[Any], Any] = _RECEIVER.get_decoder


class MonoOpusDecoder:
    """aiortc's decoder interface (``decode(encoded_frame) -> frames``) on libopus, mono; runs
    in aiortc's decoder thread."""

    def __init__(self) -> None:
        codec: Any = av.CodecContext.create("libopus", "r")
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = OPUS_RATE_HZ
        self.codec = codec

    def decode(self, encoded_frame: Any) -> list[Any]:
        packet = av.Packet(encoded_frame.data)
        packet.pts = encoded_frame.timestamp
        packet.time_base = _RTP_TIME_BASE
        return list(self.codec.decode(packet))


def _get_decoder(codec: Any) -> Any:
    if str(codec.mimeType).lower() == "audio/opus":
        return MonoOpusDecoder()
    return _ORIGINAL(codec)


def decode_opus_to_mono() -> None:
    """From now on, peer connections of this process decode Opus to mono."""
    _RECEIVER.get_decoder = _get_decoder
