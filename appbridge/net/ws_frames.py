"""RFC 6455 framing for the per-frame hot paths, beside websockets' sans-I/O protocols.

websockets parses and serialises every frame through a generator-based reader, a ``Frame``
object and a ``BytesIO``: several microseconds per frame, where a media stream carries fifty
frames a second each way (issue 7). The gateway's two WebSocket ends (the app link's client,
``ws_client.py``, and the fast server routes, ``http/ws_fastpath.py``) therefore cut the common
frames here:

* out: a whole message as one final frame, header and payload in one buffer (§5.2); a client's
  masked (§5.3) with a key from the OS's CSPRNG.
* in: a whole, final text or binary frame is cut and unmasked here. Everything else (control
  frames, fragments, reserved bits, a wrong mask bit, a 64-bit length) is handed to websockets
  as whole frames, so its parser always stands at a frame boundary and both keep one view of
  the stream; websockets then answers pings, runs the close handshake and fails the connection
  with the right code (1002, 1009).

No extension is negotiated on either end, so the RSV bits are always clear.
"""

from __future__ import annotations

import os
import struct
from typing import Final

try:  # websockets' C helper; its pure-Python twin where the wheel has no speedups
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - every wheel we install ships the C extension
    from websockets.utils import apply_mask

__all__ = [
    "FIN_BINARY",
    "FIN_TEXT",
    "HAND_OVER",
    "INCOMPLETE",
    "apply_mask",
    "frame_extent",
    "masked_frame",
    "text_frame",
]

FIN_TEXT: Final = 0x81  # FIN bit and opcode 1 (RFC 6455 §5.2)
FIN_BINARY: Final = 0x82
#: :func:`frame_extent`: more bytes are needed to know (or hold) the whole frame.
INCOMPLETE: Final = -1
#: :func:`frame_extent`: a header the fast path never takes; websockets must see the rest.
HAND_OVER: Final = -2

_HEAD_16 = struct.Struct("!BBH").pack
_HEAD_64 = struct.Struct("!BBQ").pack

# RFC 6455 §5.3: every frame a client sends is masked with a fresh key "derived from a strong
# source of entropy". Keys come from the OS's CSPRNG (os.urandom), 4 KiB at a time: one getrandom
# call per 1024 frames instead of one per frame, the same unpredictability.
_KEY_POOL_BYTES = 4096


class _MaskKeys:
    __slots__ = ("_pool", "_pos")

    def __init__(self) -> None:
        self._pool = b""
        self._pos = _KEY_POOL_BYTES

    def take(self) -> bytes:
        pos = self._pos
        if pos >= _KEY_POOL_BYTES:
            self._pool = os.urandom(_KEY_POOL_BYTES)
            pos = 0
        self._pos = pos + 4
        return self._pool[pos : pos + 4]


_MASK_KEYS = _MaskKeys()


def _header(first: int, mask_bit: int, length: int) -> bytes:
    if length < 126:
        return bytes((first, mask_bit | length))
    if length < 65536:
        return _HEAD_16(first, mask_bit | 126, length)
    return _HEAD_64(first, mask_bit | 127, length)


def text_frame(data: bytes) -> bytes:
    """One unmasked (server) final text frame carrying ``data`` (UTF-8 already)."""
    return _header(FIN_TEXT, 0, len(data)) + data


def masked_frame(opcode: int, data: bytes) -> bytes:
    """One masked (client) final frame of ``opcode`` (1 text, 2 binary)."""
    key = _MASK_KEYS.take()
    return _header(0x80 | opcode, 0x80, len(data)) + key + apply_mask(data, key)


def frame_extent(buf: bytes, pos: int, max_size: int | None) -> tuple[int, int]:
    """(header bytes, end) of the frame that starts at ``buf[pos]``.

    The header counts the masking key when the MASK bit is set. ``(INCOMPLETE, 0)`` when the
    frame is not all in ``buf`` yet; ``(HAND_OVER, 0)`` for a 64-bit length (over 64 KiB, never
    a media message) or a length over ``max_size``: websockets' parser takes it from there and
    refuses it or reads it.
    """
    size = len(buf)
    if size - pos < 2:
        return INCOMPLETE, 0
    second = buf[pos + 1]
    length = second & 0x7F
    head = 2
    if length == 126:
        if size - pos < 4:
            return INCOMPLETE, 0
        length = (buf[pos + 2] << 8) | buf[pos + 3]
        head = 4
    elif length == 127:
        return HAND_OVER, 0
    if max_size is not None and length > max_size:
        return HAND_OVER, 0
    if second & 0x80:
        head += 4
    end = pos + head + length
    if end > size:
        return INCOMPLETE, 0
    return head, end
