from __future__ import annotations

from appbridge.media.codecs import PCM16_16K, PCMU_8K, AudioFormat
from appbridge.media.reframe import FrameConverter


def test_every_output_frame_is_exactly_20_ms_and_none_is_late() -> None:
    conv = FrameConverter(PCMU_8K, PCM16_16K)
    for _ in range(50):
        frames = conv.convert(b"\x7f" * 160)
        assert [len(f) for f in frames] == [640]  # one in, one out: never a frame late


def test_odd_input_sizes_are_recut_without_loss() -> None:
    conv = FrameConverter(PCMU_8K, AudioFormat("pcm16", 8000))
    sizes = [100, 250, 10, 300, 140]  # 800 bytes of µ-law = 5 frames of pcm16 at 8 kHz
    frames = [f for n in sizes for f in conv.convert(b"\x7f" * n)]
    assert [len(f) for f in frames] == [320] * 5


def test_identity_passes_frames_through() -> None:
    conv = FrameConverter(PCMU_8K, PCMU_8K)
    frame = bytes(range(160))
    assert conv.convert(frame) == [frame]
