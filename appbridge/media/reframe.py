"""A converter that yields exact 20 ms frames (the gateway sends one binary frame per 20 ms).

``audioop.ratecv`` starts a sample or two short and some carriers send odd sizes, so converted
audio does not always come out in whole frames. In the steady state one input frame gives one
output frame and nothing is copied; the first, slightly short, output is padded at the front
with silence (a sample, inaudible) so the stream is never a frame late; anything else is
re-cut from a small carry-over buffer.
"""

from __future__ import annotations

from typing import Final

from appbridge.media.codecs import AudioFormat, Converter

_PAD_LIMIT_BYTES: Final = 8  # the most a resampler's first output is short by (a few samples)


class FrameConverter:
    def __init__(self, src: AudioFormat, dst: AudioFormat, frame_ms: int = 20) -> None:
        self._conv = Converter(src, dst)
        self.frame_bytes = dst.frame_bytes(frame_ms)
        self._silence = dst.silence(frame_ms)
        self._pending = bytearray()
        self._first = True

    def convert(self, data: bytes) -> list[bytes]:
        out = self._conv.convert(data)
        size = self.frame_bytes
        first, self._first = self._first, False
        if not self._pending:
            if len(out) == size:
                return [out]
            if first and size - _PAD_LIMIT_BYTES <= len(out) < size:
                return [self._silence[: size - len(out)] + out]
        pending = self._pending
        pending += out
        frames = []
        while len(pending) >= size:
            frames.append(bytes(pending[:size]))
            del pending[:size]
        return frames
