"""Audio between RTP payloads of a browser call and the engine's 20 ms frames, both ways.

The leg (``leg.py``) carries the RTP itself, so this module sees payloads only. Inbound,
:class:`InboundAudio` decodes each payload to mono ``pcm16`` at the leg's rate: Opus through
libopus (PyAV) asked for mono, whatever the browser encoded (RFC 6716 §2, RFC 7587 §3.1.1), then
from its 48 kHz to 16 kHz with the project's :class:`~appbridge.media.codecs.Converter`, whose
low-pass filter keeps what a browser's fullband Opus carries above 8 kHz from folding into the
band (FFmpeg's libopus decoder always answers at 48 kHz; the converter takes 8.7 µs per 20 ms
frame where ``av.AudioResampler``, filtering too, takes 23.6 µs); G.711 with audioop at 8 kHz.
What comes out is cut into exact 20 ms frames for ``on_carrier_audio``.

Outbound, :class:`OutboundAudio` encodes each 20 ms frame of the engine: G.711 with audioop, Opus
with libopus fed the leg's 16 kHz mono directly (RFC 7587 §3.1.1: any input rate, the RTP clock
stays 48 kHz). Once the encoder has settled in silence its last silent packet is sent again
instead of encoding another (:meth:`OutboundAudio.silence`).
"""

from __future__ import annotations

import fractions
import warnings
from typing import Any, Final

import av

from appbridge.media.codecs import PCM16_8K, PCM16_16K, AudioFormat, Converter

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

_OPUS: Final = "opus"
_G711: Final = ("pcmu", "pcma")
FRAME_MS: Final = 20
#: Bits per second of the Opus stream toward the browser (``_opus_encoder``).
OPUS_BIT_RATE: Final = 32_000
#: libopus's complexity (0-10) toward the browser; RFC 7587 §7 leaves it to the sender.
OPUS_COMPLEXITY: Final = 3
#: Silent frames encoded in a row before the encoder counts as settled in silence, after which
#: its last silent packet is sent again instead of encoding another.
SILENCE_SETTLE_FRAMES: Final = 5
#: The RTP clock of Opus, whatever the audio's rate (RFC 7587 §4.1).
OPUS_RTP_CLOCK_HZ: Final = 48_000
#: What FFmpeg's libopus decoder gives, whatever is asked.
OPUS_DECODED_HZ: Final = 48_000


def leg_format(codec: str) -> AudioFormat:
    """The leg's format for a negotiated codec (aiortc's codec name, any case).

    Opus carries wideband speech, and 16 kHz linear PCM keeps what speech recognition uses of it
    at a third of the samples of 48 kHz; G.711 is 8 kHz audio, so 8 kHz linear PCM loses nothing
    and costs no resampling on the way in (docs/protocol-session-v1.md, ``session.start``: the
    engine converts to the app's format either way)."""
    name = codec.lower()
    if name == _OPUS:
        return PCM16_16K
    if name in _G711:
        return PCM16_8K
    raise ValueError(f"a browser leg cannot carry {codec}")


def rtp_clock_hz(codec: str) -> int:
    """The RTP clock of a codec a browser leg carries (RFC 7587 §4.1, RFC 3551 §4.5.14)."""
    return OPUS_RTP_CLOCK_HZ if codec.lower() == _OPUS else 8000


class InboundAudio:
    """RTP payloads of the negotiated codec to 20 ms frames of mono pcm16 (module doc)."""

    __slots__ = ("_decode", "_frame_bytes", "_opus", "_pending", "_to_leg")

    def __init__(self, codec: str, rate_hz: int) -> None:
        name = codec.lower()
        self._frame_bytes = rate_hz * FRAME_MS // 1000 * 2
        self._pending = bytearray()
        self._decode = {"pcmu": audioop.ulaw2lin, "pcma": audioop.alaw2lin}.get(name)
        self._opus: Any = _opus_decoder() if name == _OPUS else None
        self._to_leg: Converter | None = None
        if self._opus is not None and rate_hz != OPUS_DECODED_HZ:
            decoded = AudioFormat("pcm16", OPUS_DECODED_HZ)
            self._to_leg = Converter(decoded, AudioFormat("pcm16", rate_hz))

    def _pcm(self, payload: bytes) -> bytes:
        if self._decode is not None:
            return self._decode(payload, 2)
        data = b"".join(
            bytes(frame.planes[0])[: frame.samples * 2]
            for frame in self._opus.decode(av.Packet(payload))
        )
        if self._to_leg is not None:
            data = self._to_leg.convert(data)
        return data

    def decode(self, payload: bytes) -> list[bytes]:
        """The whole 20 ms frames this payload completes (none, one or a few). A payload the
        decoder refuses is heard as nothing rather than ending the call."""
        try:
            data = self._pcm(payload)
        except (av.FFmpegError, ValueError):
            return []
        size = self._frame_bytes
        pending = self._pending
        if not pending and len(data) == size:
            return [data]
        pending += data
        frames = []
        while len(pending) >= size:
            frames.append(bytes(pending[:size]))
            del pending[:size]
        return frames


class OutboundAudio:
    """The engine's 20 ms pcm16 frames as RTP payloads of the negotiated codec (module doc)."""

    __slots__ = (
        "_encode",
        "_last_pts",
        "_opus",
        "_opus_origin",
        "_pts",
        "_rate",
        "_samples",
        "_silence",
        "_silent_packet",
        "_silent_run",
        "_time_base",
    )

    def __init__(self, audio_format: AudioFormat, codec: str) -> None:
        name = codec.lower()
        self._rate = audio_format.rate_hz
        self._samples = audio_format.samples_for_ms(FRAME_MS)
        self._time_base = fractions.Fraction(1, self._rate)
        self._pts = 0  # the encoder's input clock, in samples
        self._encode = {"pcmu": audioop.lin2ulaw, "pcma": audioop.lin2alaw}.get(name)
        self._opus: Any = _opus_encoder(self._rate) if name == _OPUS else None
        self._opus_origin: int | None = None
        self._silence = bytes(self._samples * 2)
        self._silent_run = 0
        self._silent_packet: bytes | None = None
        self._last_pts = -1  # of the last Opus packet handed out, in samples

    def audio(self, pcm16: bytes) -> bytes | None:
        """This tick's payload for one frame (a short frame is padded with silence); None when
        no packet leaves this tick (libopus holding its first samples back)."""
        self._silent_run = 0
        return self._payload(pcm16)

    def silence(self) -> bytes | None:
        """This tick's payload when the engine has no audio. libopus takes as long to encode
        silence as speech, so once ``SILENCE_SETTLE_FRAMES`` silent frames have been encoded in
        a row the last of their packets is sent again: the browser's decoder then stays in the
        silence the encoder settled in, and the encoder resumes from that state when audio
        comes back (RFC 6716 packets decode on their own; RFC 7587 §3.1)."""
        self._silent_run += 1
        cached = self._silent_packet
        if self._opus is None or self._silent_run <= SILENCE_SETTLE_FRAMES or cached is None:
            payload = self._payload(self._silence)
            if self._opus is not None and payload is not None:
                self._silent_packet = payload
            return payload
        self._pts += self._samples  # the encoder's input clock goes on meanwhile
        self._last_pts += self._samples
        return cached

    def _payload(self, pcm16: bytes) -> bytes | None:
        size = self._samples * 2
        if len(pcm16) != size:
            pcm16 = (pcm16 + bytes(size))[:size]
        pts = self._pts
        self._pts = pts + self._samples
        if self._encode is not None:
            return self._encode(pcm16, 2)
        frame = av.AudioFrame(format="s16", layout="mono", samples=self._samples)
        frame.planes[0].update(pcm16)
        frame.sample_rate = self._rate
        frame.pts = pts
        frame.time_base = self._time_base
        packets = self._opus.encode(frame)
        if not packets:
            return None
        out: av.Packet[Any] = packets[0]
        if self._opus_origin is None:
            self._opus_origin = out.pts or 0  # libopus starts before zero (its look-ahead)
        out_pts = (out.pts or 0) - self._opus_origin
        if out_pts <= self._last_pts:
            return None  # the frame libopus held back when repeated silence took over
        self._last_pts = out_pts
        return bytes(out)


def _opus_encoder(rate_hz: int) -> Any:
    """libopus for mono speech at the leg's rate (RFC 7587 §3.1.1: any input rate, the RTP
    clock stays 48 kHz; §7: 20-32 kbit/s is wideband speech at its best). The complexity is
    below libopus's default of 10, which costs about twice the CPU per frame for speech that
    the app's TTS made (docs/PERFORMANCE.md, "Browser calls (WebRTC)")."""
    ctx: Any = av.CodecContext.create("libopus", "w")
    ctx.format = "s16"
    ctx.layout = "mono"
    ctx.sample_rate = rate_hz
    ctx.bit_rate = OPUS_BIT_RATE
    ctx.time_base = fractions.Fraction(1, rate_hz)
    ctx.options = {"application": "voip", "compression_level": str(OPUS_COMPLEXITY)}
    return ctx


def _opus_decoder() -> Any:
    """libopus decoding to mono: it decodes a stereo stream to mono itself (RFC 6716 §2)."""
    ctx: Any = av.CodecContext.create("libopus", "r")
    ctx.format = "s16"
    ctx.layout = "mono"
    ctx.sample_rate = OPUS_DECODED_HZ
    return ctx
