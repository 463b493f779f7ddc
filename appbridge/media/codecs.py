"""Audio formats and streaming conversion between them.

Why this module exists: every call has two audio formats, the carrier's (G.711 µ-law at 8 kHz on
Twilio, docs/protocol-twilio.md, and on most SIP trunks) and the app's (docs/protocol-session-v1.md,
`session.start`: `pcm16` at 8, 16 or 24 kHz, or `pcmu` at 8 kHz). Prompts fetched by `play` arrive
at any rate (docs/protocol-session-v1.md, `play`: WAV files of any rate are converted to the call's
format). Conversion runs once per 20 ms frame for every live call, in both directions, so it
uses audioop's C loops only (no numpy, no per-sample Python) and keeps the resampler state
between calls: a stream cut into arbitrary pieces converts to exactly the bytes of the whole.

Codecs: `pcm16` is signed 16-bit little-endian linear PCM, `pcmu` is G.711 µ-law and `pcma` is
G.711 A-law (ITU-T G.711; RFC 3551 section 4.5.14 for their use as RTP payloads 0 and 8). `g722`
is ITU-T G.722 at 64 kbit/s (RFC 3551 section 4.5.2, RTP payload 9): 16 kHz audio, 4 bits per
sample, so 160 bytes per 20 ms, the same packet size and RTP timestamp step as G.711 (its RTP
clock is 8000 Hz; `media/g722.py` explains the quirk). All audio is mono.

G.722 is sub-band ADPCM: encoder and decoder carry state from byte to byte, so unlike G.711 a
G.722 stream can only be decoded by one decoder that has seen all of it, in order. A `Converter`
owns its own encoder or decoder (one stream per converter, never shared), and a stream spliced
from two encoders makes the far end's decoder produce a burst of noise for tens of milliseconds
(measured in tests/unit/test_codecs_g722.py), so the caller-bound direction wants one encoder for
the whole call.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Final

with warnings.catch_warnings():
    # audioop is deprecated in 3.11/3.12 and removed in 3.13, where the `audioop-lts` package
    # provides the same module name; the warning is noise either way.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

from appbridge.media.antialias import LowpassFilter, lowpass_for
from appbridge.media.resample import RatecvState, ratecv

__all__ = [
    "CODECS",
    "G722_16K",
    "PCM16_8K",
    "PCM16_16K",
    "PCM16_24K",
    "PCMA_8K",
    "PCMU_8K",
    "AudioFormat",
    "Converter",
    "alaw_to_pcm16",
    "pcm16_to_alaw",
    "pcm16_to_ulaw",
    "ulaw_to_pcm16",
]

_PCM16: Final = "pcm16"
_PCMU: Final = "pcmu"
_PCMA: Final = "pcma"
_G722: Final = "g722"

#: Bits per sample of each supported codec. Adding a codec means adding it here, to
#: `_SILENCE_BYTE`, and to the decode/encode steps of `Converter`.
_BITS_PER_SAMPLE: Final[dict[str, int]] = {_PCM16: 16, _PCMU: 8, _PCMA: 8, _G722: 4}

#: The byte value of silence: 0 for linear PCM, 0xFF for µ-law (+0, G.711 table 2a), 0xD5 for
#: A-law (+0 with the even-bit inversion of G.711 table 1a). G.722 has no code for "zero": its
#: codes are ADPCM steps. 0xFC (high band 11, low band 111100: the smallest steps) decodes to
#: exact zeros from a fresh decoder and to about -60 dBFS of DC after speech, the quietest of the
#: 256 byte values (measured with libg722 1.2.8; tests/unit/test_codecs_g722.py holds the bound).
_SILENCE_BYTE: Final[dict[str, int]] = {_PCM16: 0x00, _PCMU: 0xFF, _PCMA: 0xD5, _G722: 0xFC}

#: Codecs bound to one sample rate: G.722 at 64 kbit/s samples at 16 kHz (ITU-T G.722 §1).
_FIXED_RATE_HZ: Final[dict[str, int]] = {_G722: 16_000}

CODECS: Final[frozenset[str]] = frozenset(_BITS_PER_SAMPLE)

#: Highest sample rate accepted. WAV files at 384 kHz exist; nothing above is plausible audio.
_MAX_RATE_HZ: Final = 384_000


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """A mono audio format: a codec name and a sample rate.

    Frame sizes round down to whole samples (at 22050 Hz a 20 ms frame is 441 samples; at
    11025 Hz it is 220 samples, 19.95 ms), which never matters for the 8/16/24 kHz formats that
    calls use.
    """

    codec: str
    rate_hz: int

    def __post_init__(self) -> None:
        if self.codec not in _BITS_PER_SAMPLE:
            known = ", ".join(sorted(_BITS_PER_SAMPLE))
            raise ValueError(f"unknown codec {self.codec!r} (known: {known})")
        if not 0 < self.rate_hz <= _MAX_RATE_HZ:
            raise ValueError(f"sample rate {self.rate_hz} Hz is out of range")
        fixed = _FIXED_RATE_HZ.get(self.codec)
        if fixed is not None and self.rate_hz != fixed:
            raise ValueError(f"{self.codec} runs at {fixed} Hz only, not {self.rate_hz} Hz")

    @property
    def bits_per_sample(self) -> int:
        return _BITS_PER_SAMPLE[self.codec]

    @property
    def bytes_per_sample(self) -> int:
        """Whole bytes per sample; G.722 packs two samples in a byte and raises ValueError
        (use `bits_per_sample`, `frame_bytes` or `ms_for_bytes`)."""
        bits = _BITS_PER_SAMPLE[self.codec]
        if bits % 8:
            raise ValueError(f"{self.codec} has {bits} bits per sample, not whole bytes")
        return bits // 8

    @property
    def silence_byte(self) -> int:
        return _SILENCE_BYTE[self.codec]

    def samples_for_ms(self, ms: int) -> int:
        return self.rate_hz * ms // 1000

    def frame_bytes(self, frame_ms: int = 20) -> int:
        """Bytes in one frame of `frame_ms` (20 ms is the session's frame time and RFC 3551's
        ptime)."""
        return self.samples_for_ms(frame_ms) * self.bits_per_sample // 8

    def silence(self, ms: int) -> bytes:
        """`ms` of digital silence in this format (what the caller hears after `clear`)."""
        return bytes((self.silence_byte,)) * self.frame_bytes(ms)

    def ms_for_bytes(self, n_bytes: int) -> int:
        """Whole milliseconds of audio in `n_bytes` of this format, rounded down."""
        return n_bytes * 8 // self.bits_per_sample * 1000 // self.rate_hz

    def __str__(self) -> str:
        return f"{self.codec}/{self.rate_hz}"


PCMU_8K: Final = AudioFormat(_PCMU, 8000)
PCMA_8K: Final = AudioFormat(_PCMA, 8000)
PCM16_8K: Final = AudioFormat(_PCM16, 8000)
PCM16_16K: Final = AudioFormat(_PCM16, 16000)
PCM16_24K: Final = AudioFormat(_PCM16, 24000)
G722_16K: Final = AudioFormat(_G722, 16000)


def _require_whole_samples(pcm16: bytes) -> None:
    if len(pcm16) & 1:
        raise ValueError(f"pcm16 audio must have an even length, got {len(pcm16)} bytes")


def ulaw_to_pcm16(data: bytes) -> bytes:
    """Decodes G.711 µ-law to signed 16-bit little-endian PCM (twice as many bytes)."""
    return audioop.ulaw2lin(data, 2)


def pcm16_to_ulaw(pcm16: bytes) -> bytes:
    """Encodes signed 16-bit little-endian PCM to G.711 µ-law; raises ValueError on odd lengths."""
    _require_whole_samples(pcm16)
    return audioop.lin2ulaw(pcm16, 2)


def alaw_to_pcm16(data: bytes) -> bytes:
    """Decodes G.711 A-law to signed 16-bit little-endian PCM."""
    return audioop.alaw2lin(data, 2)


def pcm16_to_alaw(pcm16: bytes) -> bytes:
    """Encodes signed 16-bit little-endian PCM to G.711 A-law; raises ValueError on odd lengths."""
    _require_whole_samples(pcm16)
    return audioop.lin2alaw(pcm16, 2)


def _g722_module() -> Any:
    """The G.722 wrapper, imported on first use: the media layer needs it only for SIP legs
    that negotiated G.722, and importing it lazily keeps this module free of the carriers
    package at import time (no import cycle, whatever `carriers/sip/__init__` grows)."""
    from appbridge.media import g722

    return g722


class Converter:
    """A stateful, streaming converter from one `AudioFormat` to another.

    The pipeline is decode to pcm16, resample with `resample.ratecv` (audioop's linear
    interpolation, compiled; its state is kept between calls, so a stream converts the same
    whatever its chunking), encode. Going down in rate, `antialias.lowpass_for`'s filter runs
    before the interpolation, so that nothing above the new Nyquist frequency folds into the
    band (its history is kept between calls too).
    A pcm16 source chunk with an odd length has its last byte held back and prefixed to the next
    chunk, so apps may send binary frames of any length. G.722 encodes sample pairs (its QMF
    splits two input samples into one code of each sub-band), so a lone trailing sample is held
    back before the encoder the same way.

    One converter serves one stream: do not share it between directions or calls. For G.722 this
    is a matter of correctness, not only of resampler history: the converter owns the ADPCM
    encoder or decoder of its stream (module doc).
    """

    __slots__ = (
        "_carry",
        "_decode",
        "_dst",
        "_encode",
        "_g722_decoder",
        "_g722_encoder",
        "_identity",
        "_lowpass",
        "_pair_carry",
        "_resample",
        "_src",
        "_src_is_pcm16",
        "_state",
    )

    def __init__(self, src: AudioFormat, dst: AudioFormat) -> None:
        self._src = src
        self._dst = dst
        self._identity = src == dst
        self._src_is_pcm16 = src.codec == _PCM16
        self._resample = src.rate_hz != dst.rate_hz
        self._lowpass: LowpassFilter | None = lowpass_for(src.rate_hz, dst.rate_hz)
        self._decode = {_PCMU: audioop.ulaw2lin, _PCMA: audioop.alaw2lin}.get(src.codec)
        self._encode = {_PCMU: audioop.lin2ulaw, _PCMA: audioop.lin2alaw}.get(dst.codec)
        self._g722_decoder: Any = None
        self._g722_encoder: Any = None
        if not self._identity:
            if src.codec == _G722:
                self._g722_decoder = _g722_module().G722Decoder()
            if dst.codec == _G722:
                self._g722_encoder = _g722_module().G722Encoder()
        self._carry = b""
        self._pair_carry = b""
        self._state: RatecvState | None = None

    @property
    def src(self) -> AudioFormat:
        return self._src

    @property
    def dst(self) -> AudioFormat:
        return self._dst

    @property
    def is_identity(self) -> bool:
        return self._identity

    @property
    def pending_bytes(self) -> int:
        """Source bytes held back (an odd trailing byte of pcm16) until the next chunk."""
        return len(self._carry)

    def reset(self) -> None:
        """Forgets the resampler history and anything held back (e.g. after `clear`).

        A G.722 encoder or decoder keeps its ADPCM state: the far end's codec does not reset
        when we do, and staying in step with it is what keeps the stream clean.
        """
        self._carry = b""
        self._pair_carry = b""
        self._state = None
        if self._lowpass is not None:
            self._lowpass.reset()

    def convert(self, data: bytes) -> bytes:
        """Converts the next chunk of the stream; the identity conversion returns `data` itself."""
        if self._identity:
            return data
        if self._src_is_pcm16:
            if self._carry:
                data = self._carry + data
                self._carry = b""
            if len(data) & 1:
                self._carry = data[-1:]
                data = data[:-1]
            pcm = data
        elif self._g722_decoder is not None:
            pcm = self._g722_decoder.decode(data)
        else:
            assert self._decode is not None
            pcm = self._decode(data, 2)
        if self._resample:
            if self._lowpass is not None:
                pcm = self._lowpass.filter(pcm)
            pcm, self._state = ratecv(pcm, self._src.rate_hz, self._dst.rate_hz, self._state)
        if self._g722_encoder is not None:
            return self._encode_g722(pcm)
        if self._encode is None:
            return pcm
        return self._encode(pcm, 2)

    def _encode_g722(self, pcm: bytes) -> bytes:
        if self._pair_carry:
            pcm = self._pair_carry + pcm
            self._pair_carry = b""
        odd_bytes = len(pcm) & 3
        if odd_bytes:
            self._pair_carry = pcm[-odd_bytes:]
            pcm = pcm[:-odd_bytes]
        out: bytes = self._g722_encoder.encode(pcm)
        return out
