"""WAV reading and writing (appbridge.media.wav)."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appbridge.media.codecs import alaw_to_pcm16, ulaw_to_pcm16
from appbridge.media.wav import DecodedAudio, WavError, parse_wav, write_wav

_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


def _stdlib_wav(frames: bytes, *, width: int, channels: int = 1, rate_hz: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate_hz)
        w.writeframes(frames)
    return buf.getvalue()


def _chunk(chunk_id: bytes, body: bytes) -> bytes:
    pad = b"\x00" if len(body) & 1 else b""
    return chunk_id + struct.pack("<I", len(body)) + body + pad


def _fmt(code: int, channels: int, rate_hz: int, bits: int, extra: bytes = b"") -> bytes:
    block_align = channels * bits // 8
    body = struct.pack("<HHIIHH", code, channels, rate_hz, rate_hz * block_align, block_align, bits)
    return _chunk(b"fmt ", body + extra)


def _extensible_fmt(sub_code: int, channels: int, rate_hz: int, bits: int) -> bytes:
    extra = struct.pack("<HHI", 22, bits, 0x4) + struct.pack("<H", sub_code) + _GUID_TAIL
    return _fmt(0xFFFE, channels, rate_hz, bits, extra)


def _riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _pcm16(*samples: int) -> bytes:
    return struct.pack(f"<{len(samples)}h", *samples)


def _samples(audio: DecodedAudio) -> list[int]:
    return list(struct.unpack(f"<{len(audio.pcm16) // 2}h", audio.pcm16))


# -- round trips and stdlib-made files ------------------------------------------------------


def test_write_then_parse_round_trip() -> None:
    pcm = _pcm16(0, 1, -1, 32767, -32768, 1234)
    out = parse_wav(write_wav(pcm, 16000))
    assert out == DecodedAudio(pcm16=pcm, rate_hz=16000)


def test_write_wav_is_readable_by_stdlib() -> None:
    pcm = _pcm16(*range(-50, 50))
    with wave.open(io.BytesIO(write_wav(pcm, 24000)), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.readframes(1000) == pcm


def test_write_wav_rejects_odd_length_and_bad_rate() -> None:
    with pytest.raises(ValueError):
        write_wav(b"\x00", 8000)
    with pytest.raises(ValueError):
        write_wav(b"", 0)


def test_duration_ms() -> None:
    assert parse_wav(write_wav(b"\x00\x00" * 8000, 16000)).duration_ms == 500


def test_pcm8_is_unsigned() -> None:
    audio = parse_wav(_stdlib_wav(bytes([128, 255, 0, 129]), width=1))
    assert _samples(audio) == [0, 127 << 8, -32768, 1 << 8]


def test_pcm16_mono() -> None:
    pcm = _pcm16(5, -5, 30000)
    audio = parse_wav(_stdlib_wav(pcm, width=2, rate_hz=44100))
    assert audio.rate_hz == 44100
    assert audio.pcm16 == pcm


def test_pcm24_keeps_top_16_bits() -> None:
    values = [0x123456, -0x123456, 0x7FFFFF, -0x800000]
    frames = b"".join(struct.pack("<i", v)[:3] for v in values)
    audio = parse_wav(_stdlib_wav(frames, width=3))
    assert _samples(audio) == [v >> 8 for v in values]


def test_pcm32_keeps_top_16_bits() -> None:
    values = [0x12345678, -0x12345678, 0x7FFFFFFF, -0x80000000]
    audio = parse_wav(_stdlib_wav(struct.pack("<4i", *values), width=4, rate_hz=48000))
    assert _samples(audio) == [v >> 16 for v in values]
    assert audio.rate_hz == 48000


def test_stereo_is_averaged_to_mono() -> None:
    frames = _pcm16(1000, 3000, -2000, -4000, 32767, 32767)
    audio = parse_wav(_stdlib_wav(frames, width=2, channels=2, rate_hz=22050))
    assert _samples(audio) == [2000, -3000, 32767]


def test_many_channels_are_averaged_to_mono() -> None:
    frames = _pcm16(1000, 2000, 6000, -300, -300, -300)
    audio = parse_wav(_stdlib_wav(frames, width=2, channels=3))
    assert _samples(audio) == [3000, -300]


# -- hand-built files -------------------------------------------------------------------------


def test_mulaw() -> None:
    codes = bytes([0xFF, 0x00, 0x80, 0x7F, 0x10])
    audio = parse_wav(_riff(_fmt(7, 1, 8000, 8), _chunk(b"data", codes)))
    assert audio == DecodedAudio(ulaw_to_pcm16(codes), 8000)


def test_alaw() -> None:
    codes = bytes([0xD5, 0x55, 0x2A, 0xAA])
    audio = parse_wav(_riff(_fmt(6, 1, 8000, 8), _chunk(b"data", codes)))
    assert audio == DecodedAudio(alaw_to_pcm16(codes), 8000)


@pytest.mark.parametrize(("bits", "dtype"), [(32, "<f4"), (64, "<f8")])
def test_ieee_float(bits: int, dtype: str) -> None:
    values = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -7.0, np.nan, np.inf], dtype=dtype)
    audio = parse_wav(_riff(_fmt(3, 1, 16000, bits), _chunk(b"data", values.tobytes())))
    assert _samples(audio) == [0, 16384, -16384, 32767, -32767, 32767, -32767, 0, 32767]


def test_extensible_pcm16_stereo() -> None:
    frames = _pcm16(100, 300, -100, -300)
    audio = parse_wav(_riff(_extensible_fmt(1, 2, 16000, 16), _chunk(b"data", frames)))
    assert audio == DecodedAudio(_pcm16(200, -200), 16000)


def test_extensible_float_and_mulaw() -> None:
    floats = np.array([0.25, -0.25], dtype="<f4").tobytes()
    audio = parse_wav(_riff(_extensible_fmt(3, 1, 8000, 32), _chunk(b"data", floats)))
    assert _samples(audio) == [8192, -8192]
    codes = bytes([0x00, 0x80])
    audio = parse_wav(_riff(_extensible_fmt(7, 1, 8000, 8), _chunk(b"data", codes)))
    assert audio.pcm16 == ulaw_to_pcm16(codes)


def test_extensible_with_unknown_guid_is_refused() -> None:
    extra = struct.pack("<HHI", 22, 16, 0x4) + b"\x01\x00" + b"\x00" * 14
    data = _riff(_fmt(0xFFFE, 1, 8000, 16, extra), _chunk(b"data", b"\x00\x00"))
    with pytest.raises(WavError, match="sub-format"):
        parse_wav(data)


def test_unknown_chunks_and_odd_padding_are_skipped() -> None:
    pcm = _pcm16(7, 8, 9)
    data = _riff(
        _chunk(b"JUNK", b"abc"),  # odd size: one pad byte follows
        _fmt(1, 1, 8000, 16),
        _chunk(b"LIST", b"INFOISFT\x05\x00\x00\x00test\x00"),  # odd size too
        _chunk(b"data", pcm),
        _chunk(b"id3 ", b"trailer"),
    )
    assert parse_wav(data).pcm16 == pcm


def test_data_chunk_before_fmt_chunk() -> None:
    pcm = _pcm16(1, 2)
    assert parse_wav(_riff(_chunk(b"data", pcm), _fmt(1, 1, 8000, 16))).pcm16 == pcm


def test_streamed_wav_with_oversized_data_chunk() -> None:
    pcm = _pcm16(*range(100))
    data = _riff(_fmt(1, 1, 8000, 16)) + b"data" + struct.pack("<I", 0xFFFFFFFF) + pcm
    data = data[:4] + struct.pack("<I", 0xFFFFFFFF) + data[8:]  # RIFF size unknown as well
    assert parse_wav(data).pcm16 == pcm


def test_truncated_download_keeps_whole_frames() -> None:
    frames = _pcm16(10, 20, 30, 40)
    data = _riff(_fmt(1, 2, 8000, 16), _chunk(b"data", frames))[:-3]
    assert _samples(parse_wav(data)) == [15]


def test_empty_data_chunk_gives_empty_audio() -> None:
    assert parse_wav(_riff(_fmt(1, 1, 8000, 16), _chunk(b"data", b""))).pcm16 == b""


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a RIFF/WAVE file"),
        (b"ID3\x04\x00\x00\x00\x00\x00\x00" * 4, "not a RIFF/WAVE file"),
        (b"RIFF\x00\x00\x00\x00AVI LIST", "not a RIFF/WAVE file"),
        (b"RF64\xff\xff\xff\xffWAVEds64", "RF64"),
        (_riff(_chunk(b"data", b"\x00\x00")), "no fmt chunk"),
        (_riff(_fmt(1, 1, 8000, 16)), "no data chunk"),
        (_riff(_chunk(b"fmt ", b"\x01\x00\x01\x00"), _chunk(b"data", b"")), "too short"),
        (_riff(_fmt(0x55, 2, 44100, 0), _chunk(b"data", b"")), r"format code 85 \(MPEG Layer 3\)"),
        (_riff(_fmt(0x11, 1, 8000, 4), _chunk(b"data", b"")), r"format code 17 \(IMA ADPCM\)"),
        (_riff(_fmt(0x1234, 1, 8000, 16), _chunk(b"data", b"")), "format code 4660"),
        (_riff(_fmt(1, 1, 8000, 12), _chunk(b"data", b"")), "12-bit"),
        (_riff(_fmt(3, 1, 8000, 16), _chunk(b"data", b"")), "16-bit"),
        (_riff(_fmt(1, 0, 8000, 16), _chunk(b"data", b"")), "channel count 0"),
        (_riff(_fmt(1, 1, 0, 16), _chunk(b"data", b"")), "sample rate 0 Hz"),
        (_riff(_fmt(1, 1, 8000, 16), _chunk(b"data", b""))[:-20], "fmt chunk is too short"),
    ],
)
def test_bad_files_raise_wav_error(data: bytes, message: str) -> None:
    with pytest.raises(WavError, match=message):
        parse_wav(data)


def test_inconsistent_block_align_is_refused() -> None:
    body = struct.pack("<HHIIHH", 1, 2, 8000, 32000, 2, 16)  # stereo 16-bit needs 4
    with pytest.raises(WavError, match="block align"):
        parse_wav(_riff(_chunk(b"fmt ", body), _chunk(b"data", b"\x00" * 8)))


def test_duration_limit_is_checked_before_decoding() -> None:
    two_seconds = write_wav(b"\x00\x00" * 16000, 8000)
    assert parse_wav(two_seconds, max_seconds=2).duration_ms == 2000
    with pytest.raises(WavError, match=r"2\.0 s, more than the limit of 1 s"):
        parse_wav(two_seconds, max_seconds=1)


def test_default_limit_is_600_seconds() -> None:
    header = _riff(_fmt(7, 1, 8000, 8)) + b"data" + struct.pack("<I", 0xFFFFFFFF)
    ok = header + b"\xff" * (8000 * 600)
    assert parse_wav(ok).duration_ms == 600_000
    with pytest.raises(WavError, match="limit of 600 s"):
        parse_wav(ok + b"\xff")


def test_wav_error_is_a_value_error() -> None:
    assert issubclass(WavError, ValueError)


# -- fuzzing ------------------------------------------------------------------------------------


def _parse_or_wav_error(data: bytes) -> None:
    try:
        audio = parse_wav(data, max_seconds=5)
    except WavError as exc:
        assert str(exc)
    else:
        assert len(audio.pcm16) % 2 == 0
        assert audio.rate_hz > 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _parse_or_wav_error(data)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"fmt ", b"data", b"LIST", b"fact", b"\x00\x00\x00\x00"]),
            st.binary(max_size=60),
            st.integers(min_value=0, max_value=0xFFFFFFFF) | st.none(),
        ),
        max_size=5,
    )
)
def test_fuzz_riff_structures(chunks: list[tuple[bytes, bytes, int | None]]) -> None:
    body = b"".join(
        cid + struct.pack("<I", len(b) if size is None else size) + b for cid, b, size in chunks
    )
    _parse_or_wav_error(b"RIFF" + struct.pack("<I", len(body) + 4) + b"WAVE" + body)


_VALID = [
    _riff(_fmt(1, 2, 16000, 16), _chunk(b"data", _pcm16(*range(40)))),
    _riff(_extensible_fmt(3, 1, 8000, 32), _chunk(b"data", b"\x00\x00\x80\x3f" * 10)),
    _riff(_fmt(7, 1, 8000, 8), _chunk(b"LIST", b"xyz"), _chunk(b"data", bytes(range(50)))),
]


@settings(max_examples=500, deadline=None)
@given(
    base=st.sampled_from(_VALID),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 300),
)
def test_fuzz_mutated_valid_files(base: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(base[: max(cut, 12)])
    for pos, value in edits:
        if pos < len(data):
            data[pos] = value
    _parse_or_wav_error(bytes(data))
