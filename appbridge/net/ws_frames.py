"""RFC 6455 framing for the per-frame hot paths, beside websockets' sans-I/O protocols.

websockets parses and serialises every frame through a generator-based reader, a ``Frame``
object and a ``BytesIO``: several microseconds per frame, where a media stream carries fifty
frames a second each way. The gateway's two WebSocket ends (the app link's client,
``ws_client.py``, and the fast server routes, ``net/ws_fastpath.py``) therefore cut the common
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
from collections.abc import Callable
from typing import Final

from websockets.protocol import Protocol as SansIoProtocol

try:  # websockets' C helper; its pure-Python twin where the wheel has no speedups
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - every wheel we install ships the C extension
    from websockets.utils import apply_mask

__all__ = [
    "FIN_BINARY",
    "FIN_TEXT",
    "HAND_OVER",
    "INCOMPLETE",
    "FrameCutter",
    "apply_mask",
    "drop_bytes",
    "frame_extent",
    "masked_frame",
    "release_protocol",
    "split_head",
    "text_frame",
]

FIN_TEXT: Final = 0x81  # FIN bit and opcode 1 (RFC 6455 §5.2)
FIN_BINARY: Final = 0x82
#: :func:`frame_extent`: more bytes are needed to know (or hold) the whole frame.
INCOMPLETE: Final = -1
#: :func:`frame_extent`: a header the fast path never takes; websockets must see the rest.
HAND_OVER: Final = -2

_HEAD_16: Final = struct.Struct("!BBH").pack
_HEAD_64: Final = struct.Struct("!BBQ").pack

# RFC 6455 §5.3: every frame a client sends is masked with a fresh key "derived from a strong
# source of entropy". Keys come from the OS's CSPRNG (os.urandom), 4 KiB at a time: one getrandom
# call per 1024 frames instead of one per frame, the same unpredictability.
_KEY_POOL_BYTES: Final = 4096


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


def split_head(data: bytes, limit_bytes: int) -> tuple[bytes, bytes] | None:
    """The opening handshake's HTTP head (through its blank line) and the bytes after it; None
    while the head is incomplete and under ``limit_bytes``. A longer head comes back whole, for
    websockets to refuse. Feeding websockets only the head leaves its frame parser at the first
    frame, whatever the peer sent along."""
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        return data[: end + 4], data[end + 4 :]
    if len(data) <= limit_bytes:
        return None
    return data, b""


class FrameCutter:
    """Cuts the whole, final data frames of one direction of a connection off the byte stream
    and hands every other frame to websockets whole (module doc).

    ``masked``: the frames this side receives are masked (a server's view). ``deliver(text,
    payload)`` gets each cut message; ``to_protocol(data)`` feeds websockets; ``idle()`` says no
    fragmented message is open (a whole message must not cut into one, RFC 6455 §5.4);
    ``is_open()`` says the connection is still OPEN after each frame. Once anything only
    websockets can follow happens (a 64-bit length, an oversized frame, the closing handshake),
    :attr:`enabled` goes False and the owner feeds websockets directly from then on.
    """

    __slots__ = (
        "_connecting",
        "_deliver",
        "_head",
        "_head_limit",
        "_idle",
        "_is_open",
        "_masked",
        "_max_size",
        "_pending",
        "_to_proto",
        "enabled",
    )

    def __init__(
        self,
        *,
        masked: bool,
        max_size: int | None,
        deliver: Callable[[bool, bytes], None],
        to_protocol: Callable[[bytes], None],
        idle: Callable[[], bool],
        is_open: Callable[[], bool],
        connecting: Callable[[], bool],
        head_limit_bytes: int = 16 * 1024,
    ) -> None:
        self._masked = masked
        self._max_size = max_size
        self._deliver = deliver
        self._to_proto = to_protocol
        self._idle = idle
        self._is_open = is_open
        self._connecting = connecting
        self._head_limit = head_limit_bytes
        self._head = b""  # an opening handshake not all here yet
        self._pending = b""  # the start of a frame not all here yet
        self.enabled = True

    def receive(self, data: bytes) -> None:
        """Everything the connection reads, from the opening handshake on."""
        if self.enabled and self._is_open():
            self.feed(data)  # the hot path
            return
        if not self.enabled:
            self._to_proto(data)
            return
        if not self._connecting():
            # Closing or failed: the rest goes to websockets, the start of a frame held here
            # included, and the cutter goes quiet.
            self.feed(data)
            return
        # The opening handshake: only its HTTP head goes to websockets, so that its frame parser
        # starts exactly at the first frame, whatever the peer sent along (a client may not send
        # frames before the 101, RFC 6455 §4.1; a server may send them right behind it).
        data = self._head + data
        split = split_head(data, self._head_limit)
        if split is None:
            self._head = data
            return
        self._head = b""
        head, data = split
        self._to_proto(head)
        if not data:
            return
        if not self._masked and not self._is_open():
            # A client whose handshake was refused (401, 403...): the response's body follows
            # its head, and websockets reads it to report the refusal.
            self._hand_over(data)
            return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        pos, size = 0, len(data)
        masked = self._masked
        while True:
            head, end = frame_extent(data, pos, self._max_size)
            if head == INCOMPLETE:
                break
            if head == HAND_OVER:
                self._hand_over(data[pos:])
                return
            first = data[pos]
            # A 2 or 4 byte header, plus 4 for a masking key: the mask bit must match the side.
            if first in (FIN_TEXT, FIN_BINARY) and (head > 4) == masked and self._idle():
                payload = data[pos + head : end]
                if masked:
                    payload = apply_mask(payload, data[pos + head - 4 : pos + head])
                pos = end
                self._deliver(first == FIN_TEXT, payload)
            else:
                self._to_proto(data[pos:end])
                pos = end
            if not self._is_open():
                # Closing (either side), failed or given up: websockets takes the rest, as it
                # runs the close handshake (the peer's close frame may follow in this buffer).
                self._hand_over(data[pos:])
                return
        if pos < size:
            self._pending = data[pos:]

    def _hand_over(self, rest: bytes) -> None:
        self.enabled = False
        if rest:
            self._to_proto(rest)

    def release(self) -> None:
        """The connection is gone: drop the owner's callbacks. They are the owner's bound
        methods, and the owner holds this cutter, so until then the two form a reference cycle
        that only a full collection frees (media/gc_pacer.py); after this, reference counting
        frees both. Whatever arrives later is dropped."""
        self.enabled = False
        self._deliver = _drop_message
        self._to_proto = drop_bytes
        self._idle = self._is_open = self._connecting = _never
        self._head = self._pending = b""


def _drop_message(text: bool, payload: bytes) -> None:
    pass


def drop_bytes(data: bytes) -> None:
    """A data callback that drops what it is given (a released connection's)."""


def _never() -> bool:
    return False


def release_protocol(proto: SansIoProtocol) -> None:
    """Let go of a websockets sans-I/O protocol whose connection is gone.

    Its frame reader is a generator that holds the protocol (``proto.parser``), and a failed
    read keeps the exception, whose traceback holds the reader's frame (``proto.parser_exc``):
    two reference cycles per connection that only a full collection would free. Closing the
    generator ends its frame; the protocol's state (``state``, ``close_code``...) stays readable.
    """
    proto.parser.close()
    proto.parser_exc = None
