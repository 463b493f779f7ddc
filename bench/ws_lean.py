"""Minimal RFC 6455 WebSocket pieces for the benchmark's lean peers (sans-I/O, no clock).

The load generator must stay below 70 % of its core while it plays both ends of hundreds of
calls (bench/README.md, "Lean peers"). websockets' asyncio client and server cost several
callbacks, futures and queue operations per frame; the lean peers (:mod:`bench.lean_twilio`,
:mod:`bench.lean_app`) instead run on plain ``asyncio.Protocol`` and use only what is here:

* the opening handshake, both sides (RFC 6455 §4.1 client request and the server's checks,
  §4.2.2 the ``101`` answer, ``Sec-WebSocket-Accept`` = base64(SHA-1(key + GUID)));
* frame encoding (§5.2), masked for a client (§5.3: a fresh 4-byte key per frame, taken from a
  pool of ``os.urandom`` bytes) and unmasked for a server;
* an incremental frame parser that reassembles fragmented messages (§5.4) and hands control
  frames (close, ping, pong, §5.5) over at once.

No extension is negotiated (no ``permessage-deflate``): the gateway is asked for none.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass, field

__all__ = [
    "OP_BINARY",
    "OP_CLOSE",
    "OP_CONT",
    "OP_PING",
    "OP_PONG",
    "OP_TEXT",
    "FrameParser",
    "HandshakeError",
    "MaskPool",
    "WsProtocolError",
    "accept_key",
    "apply_mask",
    "check_request",
    "check_response",
    "client_request",
    "close_payload",
    "encode_frame",
    "http_error_response",
    "parse_close",
    "parse_head",
    "server_response",
    "split_head",
]

#: RFC 6455 §1.3: appended to the client's key before hashing.
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_CONTROL = frozenset({OP_CLOSE, OP_PING, OP_PONG})
_DATA = frozenset({OP_CONT, OP_TEXT, OP_BINARY})
#: Largest message accepted (the gateway sends 20 ms frames and small JSON).
MAX_MESSAGE_BYTES = 2**22
#: Where the head of an HTTP message ends.
HEAD_END = b"\r\n\r\n"
MAX_HEAD_BYTES = 16384


class WsProtocolError(Exception):
    """The peer broke RFC 6455; ``code`` is the close code to answer with (§7.4.1)."""

    def __init__(self, message: str, code: int = 1002) -> None:
        super().__init__(message)
        self.code = code


class HandshakeError(Exception):
    """The opening handshake failed (bad status, missing or wrong headers)."""


try:  # websockets' C helper (a dependency): 20x faster than the pure-Python XOR below
    from websockets.speedups import apply_mask as _c_apply_mask
except ImportError:  # pragma: no cover - the wheel ships it on Linux
    _c_apply_mask = None  # type: ignore[assignment]


def _py_apply_mask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def apply_mask(data: bytes, mask: bytes) -> bytes:
    """XOR ``data`` with the 4-byte ``mask`` repeated (RFC 6455 §5.3); its own inverse."""
    if _c_apply_mask is not None:
        return bytes(_c_apply_mask(data, mask))
    return _py_apply_mask(data, mask)


class MaskPool:
    """Masking keys for a client's frames, read from ``os.urandom`` 4 KiB at a time.

    §5.3 wants each key unpredictable; one ``getrandom`` call per frame is what the pool saves.
    """

    def __init__(self, pool_bytes: int = 4096) -> None:
        self._pool_bytes = pool_bytes
        self._buf = b""
        self._at = 0

    def next(self) -> bytes:
        at = self._at
        if at + 4 > len(self._buf):
            self._buf = os.urandom(self._pool_bytes)
            at = 0
        self._at = at + 4
        return self._buf[at : at + 4]


def encode_frame(opcode: int, payload: bytes, mask: bytes | None = None) -> bytes:
    """One final frame (FIN set) of ``opcode``; masked with ``mask`` when given (a client's)."""
    n = len(payload)
    first = 0x80 | opcode
    mask_bit = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes((first, mask_bit | n))
    elif n < 65536:
        head = bytes((first, mask_bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, mask_bit | 127)) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + apply_mask(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    """The body of a close frame: 2-byte code then UTF-8 reason (§5.5.1)."""
    return code.to_bytes(2, "big") + reason.encode()


def parse_close(payload: bytes) -> tuple[int, str]:
    """(code, reason) of a close frame; 1005 when it carries no code (§7.1.5)."""
    if len(payload) < 2:
        return 1005, ""
    return int.from_bytes(payload[:2], "big"), payload[2:].decode("utf-8", "replace")


@dataclass
class FrameParser:
    """Incremental frame reader: :meth:`feed` bytes, get whole messages and control frames.

    ``expect_masked`` is True on a server (every client frame is masked, §5.1) and False on a
    client (a server never masks). Returns ``(opcode, payload)`` with the payload unmasked;
    a fragmented message comes out once, with the opcode of its first frame.
    """

    expect_masked: bool
    max_message_bytes: int = MAX_MESSAGE_BYTES
    _buf: bytearray = field(default_factory=bytearray)
    _frag_op: int | None = None
    _frag: list[bytes] = field(default_factory=list)
    _frag_len: int = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not self._buf and self._frag_op is None:
            whole = self._whole(data)
            if whole is not None:
                return [whole]
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        at = 0
        end = len(buf)
        while end - at >= 2:
            b0 = buf[at]
            b1 = buf[at + 1]
            if b0 & 0x70:
                raise WsProtocolError("reserved bits set without an extension")
            opcode = b0 & 0x0F
            masked = bool(b1 & 0x80)
            if masked != self.expect_masked:
                raise WsProtocolError("masked frame from a server" if masked else "unmasked frame")
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if end - at < 4:
                    break
                n = int.from_bytes(buf[at + 2 : at + 4], "big")
                head = 4
            elif n == 127:
                if end - at < 10:
                    break
                n = int.from_bytes(buf[at + 2 : at + 10], "big")
                head = 10
            if n > self.max_message_bytes:
                raise WsProtocolError(f"frame of {n} bytes", 1009)
            key_at = at + head
            if masked:
                head += 4
            if end - at < head + n:
                break
            payload = bytes(buf[at + head : at + head + n])
            if masked:
                payload = apply_mask(payload, bytes(buf[key_at : key_at + 4]))
            at += head + n
            fin = bool(b0 & 0x80)
            self._one(opcode, fin, payload, out)
        if at:
            del buf[:at]
        return out

    def _whole(self, data: bytes) -> tuple[int, bytes] | None:
        """The common case, without buffering: ``data`` is exactly one final text or binary
        frame (one TCP read per frame of the gateway's). None sends it down the general path."""
        if len(data) < 2:
            return None
        b0 = data[0]
        b1 = data[1]
        if b0 not in (0x81, 0x82) or bool(b1 & 0x80) != self.expect_masked:
            return None
        n = b1 & 0x7F
        head = 2
        if n == 126:
            n = int.from_bytes(data[2:4], "big")
            head = 4
        elif n == 127:
            return None
        if self.expect_masked:
            if len(data) != head + 4 + n:
                return None
            return b0 & 0x0F, apply_mask(data[head + 4 :], data[head : head + 4])
        if len(data) != head + n:
            return None
        return b0 & 0x0F, data[head:]

    def _one(self, opcode: int, fin: bool, payload: bytes, out: list[tuple[int, bytes]]) -> None:
        if opcode in _CONTROL:
            if not fin or len(payload) > 125:
                raise WsProtocolError("fragmented or oversized control frame")
            out.append((opcode, payload))
            return
        if opcode not in _DATA:
            raise WsProtocolError(f"unknown opcode {opcode}")
        if opcode == OP_CONT:
            if self._frag_op is None:
                raise WsProtocolError("continuation without a message")
            self._frag.append(payload)
            self._frag_len += len(payload)
        else:
            if self._frag_op is not None:
                raise WsProtocolError("new message inside a fragmented one")
            if fin:
                out.append((opcode, payload))
                return
            self._frag_op, self._frag, self._frag_len = opcode, [payload], len(payload)
        if self._frag_len > self.max_message_bytes:
            raise WsProtocolError("message too big", 1009)
        if fin:
            assert self._frag_op is not None
            out.append((self._frag_op, b"".join(self._frag)))
            self._frag_op, self._frag, self._frag_len = None, [], 0


# ---------------------------------------------------------------------- handshake
def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (§4.2.2 step 5.4)."""
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def client_request(
    host: str, port: int, target: str, headers: dict[str, str], key: str | None = None
) -> tuple[bytes, str]:
    """The opening handshake's GET (§4.1) and the key it carries."""
    key = key or base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        "User-Agent: appbridge-bench",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), key


def split_head(buf: bytes | bytearray) -> tuple[bytes, bytes] | None:
    """(head, rest) once an HTTP head is complete in ``buf``, else None."""
    at = buf.find(HEAD_END)
    if at < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise HandshakeError("HTTP head too long")
        return None
    return bytes(buf[:at]), bytes(buf[at + 4 :])


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """(start line, headers with lowercase names) of an HTTP/1.1 head (no trailing CRLFs)."""
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise HandshakeError(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def check_response(head: bytes, key: str) -> dict[str, str]:
    """The server's answer to :func:`client_request`: 101 with the right accept (§4.2.2)."""
    start, headers = parse_head(head)
    parts = start.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.1"):
        raise HandshakeError(f"not an HTTP/1.1 status line: {start!r}")
    if parts[1] != "101":
        raise HandshakeError(f"status {start[9:]}")
    if headers.get("upgrade", "").lower() != "websocket":
        raise HandshakeError("no Upgrade: websocket")
    if "upgrade" not in headers.get("connection", "").lower():
        raise HandshakeError("no Connection: Upgrade")
    if headers.get("sec-websocket-accept") != accept_key(key):
        raise HandshakeError("wrong Sec-WebSocket-Accept")
    if headers.get("sec-websocket-extensions"):
        raise HandshakeError("an extension we did not ask for")
    return headers


def check_request(head: bytes) -> tuple[str, dict[str, str]]:
    """(request target, headers) of a client's opening GET, checked per §4.2.1."""
    start, headers = parse_head(head)
    parts = start.split(" ")
    if len(parts) != 3 or parts[0] != "GET" or parts[2] != "HTTP/1.1":
        raise HandshakeError(f"not a GET over HTTP/1.1: {start!r}")
    if headers.get("upgrade", "").lower() != "websocket":
        raise HandshakeError("no Upgrade: websocket")
    if "upgrade" not in headers.get("connection", "").lower():
        raise HandshakeError("no Connection: Upgrade")
    if headers.get("sec-websocket-version") != "13":
        raise HandshakeError("Sec-WebSocket-Version is not 13")
    key = headers.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise HandshakeError("Sec-WebSocket-Key is not 16 bytes")
    except ValueError:
        raise HandshakeError("Sec-WebSocket-Key is not base64") from None
    return parts[1], headers


def server_response(key: str) -> bytes:
    """The ``101 Switching Protocols`` answer (§4.2.2), no extension, no subprotocol."""
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n"
    ).encode()


def http_error_response(status: int, reason: str) -> bytes:
    """A plain-text HTTP error that refuses the upgrade (§4.2.1: any status but 101)."""
    body = (reason + "\n").encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
