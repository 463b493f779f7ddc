"""Audio between aiortc's frames and the engine's 20 ms frames, both ways.

Inbound, aiortc's decoders hand over ``av.AudioFrame`` objects: Opus as 48 kHz interleaved
stereo ``s16`` (RFC 7587 §4: the RTP clock of Opus is always 48 kHz, and libopus decodes to
stereo), G.711 as 8 kHz mono ``s16``. :class:`InboundAudio` turns them into the leg's format,
mono ``pcm16`` at 16 kHz or 8 kHz, cut into exact 20 ms frames for ``on_carrier_audio``. The
channel mix and the rate change go through audioop and the project's ``media/resample.py``
rather than ``av.AudioResampler``: the same job measures at about half the CPU that way
(docs/PERFORMANCE.md, "Browser calls (WebRTC)"). A frame in another layout or sample format
(not something aiortc produces today) falls back to ``av.AudioResampler``.

Outbound, :class:`OutboundAudio` encodes each 20 ms frame of the engine itself and hands
aiortc's RTP sender an ``av.Packet`` with a running ``pts`` and its ``time_base``, which the
sender packetises as it is (its ``pack`` path): G.711 with audioop, Opus with libopus fed the
leg's 16 kHz mono directly. Given a frame instead, aiortc would resample it to 48 kHz stereo,
encode it in a worker thread and measure its level, for more CPU per call
(docs/PERFORMANCE.md, "Browser calls (WebRTC)").
"""

from __future__ import annotations

import fractions
import warnings
from typing import Any, Final

import av

from appbridge.media.codecs import PCM16_8K, PCM16_16K, AudioFormat
from appbridge.media.resample import RatecvState, ratecv

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

#: The engine format of each codec a browser may negotiate (``leg_format``).
_OPUS: Final = "opus"
_G711: Final = ("pcmu", "pcma")
FRAME_MS: Final = 20
#: Bits per second of the Opus stream toward the browser (``_opus_encoder``).
OPUS_BIT_RATE: Final = 32_000
#: Silent frames encoded in a row before the encoder counts as settled in silence, after which
#: its last silent packet is sent again instead of encoding another.
SILENCE_SETTLE_FRAMES: Final = 5
OPUS_RTP_CLOCK_HZ: Final = 48_000
_OPUS_TIME_BASE: Final = fractions.Fraction(1, OPUS_RTP_CLOCK_HZ)


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


class InboundAudio:
    """aiortc's decoded frames to exact 20 ms frames of mono pcm16 at ``rate_hz`` (module doc)."""

    __slots__ = ("_fallback", "_frame_bytes", "_pending", "_rate", "_state")

    def __init__(self, rate_hz: int) -> None:
        self._rate = rate_hz
        self._frame_bytes = rate_hz * FRAME_MS // 1000 * 2
        self._pending = bytearray()
        self._state: RatecvState | None = None
        self._fallback: av.AudioResampler | None = None

    def _pcm(self, frame: av.AudioFrame) -> bytes:
        """The frame as mono pcm16 at the leg's rate."""
        channels = len(frame.layout.channels)
        if frame.format.name != "s16" or channels > 2:
            return self._resampled(frame)
        data = bytes(frame.planes[0])[: frame.samples * channels * 2]
        if channels == 2:
            data = audioop.tomono(data, 2, 0.5, 0.5)
        if frame.sample_rate != self._rate:
            data, self._state = ratecv(data, frame.sample_rate, self._rate, self._state)
        return data

    def _resampled(self, frame: av.AudioFrame) -> bytes:
        if self._fallback is None:
            self._fallback = av.AudioResampler(format="s16", layout="mono", rate=self._rate)
        return b"".join(
            bytes(out.planes[0])[: out.samples * 2] for out in self._fallback.resample(frame)
        )

    def convert(self, frame: av.AudioFrame) -> list[bytes]:
        """The whole 20 ms frames this decoded frame completes (none, one or a few)."""
        data = self._pcm(frame)
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
    """The engine's 20 ms pcm16 frames as what aiortc's RTP sender takes (module doc)."""

    __slots__ = (
        "_encode",
        "_last_pts",
        "_opus",
        "_opus_origin",
        "_pts",
        "_rate",
        "_rtp_scale",
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
        # Opus packets leave stamped on its 48 kHz RTP clock (RFC 7587 §4.1), so that aiortc's
        # sender need not convert each one with fractions.
        self._rtp_scale = OPUS_RTP_CLOCK_HZ // self._rate if name == _OPUS else 1
        self._pts = 0
        self._encode = {"pcmu": audioop.lin2ulaw, "pcma": audioop.lin2alaw}.get(name)
        self._opus: Any = _opus_encoder(self._rate) if name == _OPUS else None
        self._opus_origin: int | None = None
        self._silence = bytes(self._samples * 2)
        self._silent_run = 0
        self._silent_packet: bytes | None = None
        self._last_pts = -1  # of the last Opus packet handed out

    @property
    def pts(self) -> int:
        """The next frame's timestamp, in samples since the first."""
        return self._pts

    def wrap(self, pcm16: bytes) -> av.Packet[Any] | None:
        """One frame, encoded and stamped with the next ``pts`` (a short frame is padded with
        silence); None while the Opus encoder holds its first samples back."""
        self._silent_run = 0
        return self._wrap(pcm16)

    def wrap_silence(self) -> av.Packet[Any] | None:
        """A tick without audio from the engine. libopus takes as long to encode silence as
        speech, so once ``SILENCE_SETTLE_FRAMES`` silent frames have been encoded in a row the
        last of their packets is sent again, with the next ``pts``: the browser's decoder then
        stays in the silence the encoder settled in, and the encoder resumes from that state
        when audio comes back (RFC 6716 packets decode on their own; RFC 7587 §3.1)."""
        self._silent_run += 1
        cached = self._silent_packet
        if self._opus is None or self._silent_run <= SILENCE_SETTLE_FRAMES or cached is None:
            packet = self._wrap(self._silence)
            if self._opus is not None and packet is not None:
                self._silent_packet = bytes(packet)
            return packet
        self._pts += self._samples  # the encoder's input clock goes on meanwhile
        self._last_pts += self._samples
        packet = av.Packet(cached)
        packet.pts = self._last_pts * self._rtp_scale
        packet.time_base = _OPUS_TIME_BASE
        return packet

    def _wrap(self, pcm16: bytes) -> av.Packet[Any] | None:
        size = self._samples * 2
        if len(pcm16) != size:
            pcm16 = (pcm16 + bytes(size))[:size]
        pts = self._pts
        self._pts = pts + self._samples
        if self._encode is not None:
            packet = av.Packet(self._encode(pcm16, 2))
            packet.pts = pts
            packet.time_base = self._time_base
            return packet
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
        pts = (out.pts or 0) - self._opus_origin
        if pts <= self._last_pts:
            return None  # the frame libopus held back when repeated silence took over
        self._last_pts = pts
        out.pts = pts * self._rtp_scale
        out.time_base = _OPUS_TIME_BASE
        return out


def _opus_encoder(rate_hz: int) -> Any:
    """libopus for mono speech at the leg's rate (RFC 7587 §3.1.1: any input rate, the RTP
    clock stays 48 kHz; §7: 20-32 kbit/s is wideband speech at its best)."""
    ctx: Any = av.CodecContext.create("libopus", "w")
    ctx.format = "s16"
    ctx.layout = "mono"
    ctx.sample_rate = rate_hz
    ctx.bit_rate = OPUS_BIT_RATE
    ctx.time_base = fractions.Fraction(1, rate_hz)
    ctx.options = {"application": "voip"}
    return ctx
