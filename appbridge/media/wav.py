"""Reading and writing WAV files.

Why: `play` fetches WAV files from the app's URL (docs/protocol-session-v1.md, ``play``: WAV files,
PCM or µ-law at any rate, are converted to the call's format), and recordings and tests need to
write them. A fetched file is untrusted input, so the parser never trusts a length field: it walks
the RIFF chunks within the bytes it was given, bounds the decoded duration before it decodes, and
turns every malformed or unsupported file into `WavError` with a message fit for the app's
`play_fetch_failed` error.

Format references: the RIFF/WAVE layout of Microsoft's "Multimedia Programming Interface and
Data Specifications 1.0" (chunks padded to even sizes, `fmt ` and `data` chunks), format codes
from RFC 2361 appendix A, and WAVE_FORMAT_EXTENSIBLE (0xFFFE) whose sub-format GUID carries the
real format code in its first two bytes (KSDATAFORMAT_SUBTYPE_*).
"""

from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass
from typing import Final

import numpy as np

from appbridge.media.codecs import alaw_to_pcm16, ulaw_to_pcm16

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = ["DecodedAudio", "WavError", "parse_wav", "write_wav"]

FORMAT_PCM: Final = 0x0001
FORMAT_IEEE_FLOAT: Final = 0x0003
FORMAT_ALAW: Final = 0x0006
FORMAT_MULAW: Final = 0x0007
FORMAT_EXTENSIBLE: Final = 0xFFFE

#: Names for the format codes people actually meet (RFC 2361 appendix A), for error messages.
_FORMAT_NAMES: Final[dict[int, str]] = {
    0x0002: "Microsoft ADPCM",
    0x0011: "IMA ADPCM",
    0x0022: "DSP Group TrueSpeech",
    0x0031: "GSM 6.10",
    0x0040: "G.721 ADPCM",
    0x0050: "MPEG",
    0x0055: "MPEG Layer 3",
    0x0064: "G.726 ADPCM",
    0x0065: "G.722 ADPCM",
    0x0092: "Dolby AC-3 SPDIF",
    0x00FF: "AAC",
    0x0161: "Windows Media Audio",
    0x1610: "HE-AAC",
    0xF1AC: "FLAC",
}

#: The 14 bytes that follow the 16-bit format code in every KSDATAFORMAT_SUBTYPE_* GUID
#: (xxxxxxxx-0000-0010-8000-00aa00389b71).
_EXTENSIBLE_GUID_TAIL: Final = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"

_RIFF_HEADER_BYTES: Final = 12
_CHUNK_HEADER_BYTES: Final = 8
_MIN_FMT_BYTES: Final = 16
_MIN_RATE_HZ: Final = 1000
_MAX_RATE_HZ: Final = 384_000
_MAX_CHANNELS: Final = 32


class WavError(ValueError):
    """The bytes are not a WAV file this gateway can play; the message says why, for humans."""


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    """Mono signed 16-bit little-endian PCM and its sample rate."""

    pcm16: bytes
    rate_hz: int

    @property
    def duration_ms(self) -> int:
        return len(self.pcm16) // 2 * 1000 // self.rate_hz


@dataclass(frozen=True, slots=True)
class _Format:
    code: int
    channels: int
    rate_hz: int
    bits: int


def _format_name(code: int) -> str:
    name = _FORMAT_NAMES.get(code)
    return f"{code} ({name})" if name else str(code)


def _parse_fmt(body: bytes) -> _Format:
    if len(body) < _MIN_FMT_BYTES:
        raise WavError(f"fmt chunk is too short ({len(body)} bytes, need 16)")
    code, channels, rate_hz, _byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", body)
    if code == FORMAT_EXTENSIBLE:
        # WAVEFORMATEXTENSIBLE: cbSize(2) validBits(2) channelMask(4) SubFormat GUID(16).
        if len(body) < 40:
            raise WavError("WAVE_FORMAT_EXTENSIBLE fmt chunk is too short")
        guid = body[24:40]
        if guid[2:] != _EXTENSIBLE_GUID_TAIL:
            raise WavError("WAVE_FORMAT_EXTENSIBLE with an unknown sub-format GUID")
        code = struct.unpack_from("<H", guid)[0]
    if code not in (FORMAT_PCM, FORMAT_IEEE_FLOAT, FORMAT_ALAW, FORMAT_MULAW):
        raise WavError(f"unsupported WAV format code {_format_name(code)}")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise WavError(f"unsupported channel count {channels}")
    if not _MIN_RATE_HZ <= rate_hz <= _MAX_RATE_HZ:
        raise WavError(f"unsupported sample rate {rate_hz} Hz")
    supported_bits = {
        FORMAT_PCM: (8, 16, 24, 32),
        FORMAT_IEEE_FLOAT: (32, 64),
        FORMAT_ALAW: (8,),
        FORMAT_MULAW: (8,),
    }[code]
    if bits not in supported_bits:
        raise WavError(f"unsupported sample size: {bits}-bit {_format_name(code)}")
    if block_align != channels * (bits // 8):
        raise WavError(
            f"inconsistent fmt chunk: block align {block_align} for {channels} channel(s) "
            f"of {bits} bits"
        )
    return _Format(code=code, channels=channels, rate_hz=rate_hz, bits=bits)


def _find_chunks(data: bytes) -> tuple[bytes | None, bytes | None]:
    """Returns the bodies of the first `fmt ` and `data` chunks, skipping every other chunk.

    A data chunk that claims more bytes than remain (a streamed WAV writes 0xFFFFFFFF) is cut to
    what is there, and ends the walk.
    """
    fmt_body: bytes | None = None
    data_body: bytes | None = None
    pos = _RIFF_HEADER_BYTES
    end = len(data)
    while pos + _CHUNK_HEADER_BYTES <= end and (fmt_body is None or data_body is None):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        body_start = pos + _CHUNK_HEADER_BYTES
        body_end = body_start + size
        if chunk_id == b"fmt " and fmt_body is None:
            fmt_body = data[body_start:body_end]
        elif chunk_id == b"data" and data_body is None:
            data_body = data[body_start:body_end]
        # Chunks are padded to an even size (RIFF); the pad byte is not in `size`.
        pos = body_end + (size & 1)
    return fmt_body, data_body


def _to_pcm16_interleaved(fmt: _Format, raw: bytes) -> bytes:
    if fmt.code == FORMAT_MULAW:
        return ulaw_to_pcm16(raw)
    if fmt.code == FORMAT_ALAW:
        return alaw_to_pcm16(raw)
    if fmt.code == FORMAT_IEEE_FLOAT:
        dtype = "<f4" if fmt.bits == 32 else "<f8"
        samples = np.frombuffer(raw, dtype=dtype).astype(np.float64)
        # Clip before scaling: out-of-range values (and infinities) must not overflow; NaN is
        # not audio and becomes silence.
        samples = np.clip(np.nan_to_num(samples, nan=0.0), -1.0, 1.0)
        return np.rint(samples * 32767.0).astype("<i2").tobytes()
    width = fmt.bits // 8
    if width == 1:
        # 8-bit WAV PCM is unsigned (offset 128), unlike every wider size.
        raw = audioop.bias(raw, 1, -128)
    if width == 2:
        return raw
    return audioop.lin2lin(raw, width, 2)


def _downmix(pcm16: bytes, channels: int) -> bytes:
    if channels == 1:
        return pcm16
    if channels == 2:
        return audioop.tomono(pcm16, 2, 0.5, 0.5)
    frames = np.frombuffer(pcm16, dtype="<i2").reshape(-1, channels).astype(np.int32)
    mixed = frames.sum(axis=1) // channels
    out: bytes = mixed.astype("<i2").tobytes()
    return out


#: The longest WAV file decoded (``play``, hold and transfer music, ``appbridge call``).
MAX_WAV_SECONDS: Final = 600


def parse_wav(data: bytes, max_seconds: float = MAX_WAV_SECONDS) -> DecodedAudio:
    """Decodes a WAV file to mono pcm16 at its own rate, or raises `WavError`.

    Supported: PCM at 8/16/24/32 bits, IEEE float at 32/64 bits, A-law, µ-law, and any of these
    inside WAVE_FORMAT_EXTENSIBLE; any number of channels (averaged to mono). Files whose audio
    lasts longer than `max_seconds` are refused before any decoding work is done.
    """
    if len(data) < _RIFF_HEADER_BYTES or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        if data[:4] == b"RF64":
            raise WavError("RF64 (64-bit RIFF) WAV files are not supported")
        raise WavError("not a RIFF/WAVE file")
    fmt_body, data_body = _find_chunks(data)
    if fmt_body is None:
        raise WavError("WAV file has no fmt chunk")
    fmt = _parse_fmt(fmt_body)
    if data_body is None:
        raise WavError("WAV file has no data chunk")
    frame_bytes = fmt.channels * fmt.bits // 8
    n_frames = len(data_body) // frame_bytes
    if n_frames > max_seconds * fmt.rate_hz:
        seconds = n_frames / fmt.rate_hz
        raise WavError(f"audio lasts {seconds:.1f} s, more than the limit of {max_seconds:g} s")
    # A truncated download may end mid-frame: keep whole frames only.
    raw = data_body[: n_frames * frame_bytes]
    pcm16 = _downmix(_to_pcm16_interleaved(fmt, raw), fmt.channels)
    return DecodedAudio(pcm16=pcm16, rate_hz=fmt.rate_hz)


def write_wav(pcm16: bytes, rate_hz: int) -> bytes:
    """Wraps mono signed 16-bit little-endian PCM in a canonical 44-byte-header WAV file."""
    if len(pcm16) & 1:
        raise ValueError(f"pcm16 audio must have an even length, got {len(pcm16)} bytes")
    if not 0 < rate_hz <= _MAX_RATE_HZ:
        raise ValueError(f"sample rate {rate_hz} Hz is out of range")
    channels, bits = 1, 16
    block_align = channels * bits // 8
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(pcm16),
        b"WAVE",
        b"fmt ",
        16,
        FORMAT_PCM,
        channels,
        rate_hz,
        rate_hz * block_align,
        block_align,
        bits,
        b"data",
        len(pcm16),
    )
    return header + pcm16
