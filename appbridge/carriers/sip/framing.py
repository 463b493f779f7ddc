"""Framing SIP over a stream transport: TCP and TLS (RFC 3261 §18.3).

A datagram carries one message; a stream carries many, back to back, each as long as its
Content-Length says. This module cuts the stream into messages for
:func:`~appbridge.carriers.sip.message.parse_message` and refuses what cannot be framed.
"""

from __future__ import annotations

from appbridge.carriers.sip.header_values import (
    parse_content_length,
)
from appbridge.carriers.sip.headers import (
    SipParseError,
)
from appbridge.carriers.sip.message import (
    MAX_MESSAGE_BYTES,
    best_effort,
    find_head_end,
    raw_content_lengths,
)

__all__ = ["SipStreamFramer"]


class SipStreamFramer:
    """Split a stream transport's bytes into single messages (RFC 3261 §18.3).

    ``feed(data)`` returns complete messages (to pass to ``parse_message(datagram=False)``)
    and errors. After a fatal error the stream cannot be resynchronised: the framer returns
    nothing more and the shell closes the connection. A partial message waiting for more bytes
    is ``pending``; a shell closes a connection that stays pending too long (RFC 4475 §3.1.2.2).
    CRLFs between messages are skipped (§7.5, and RFC 5626 §4.4.1 keepalives).
    """

    __slots__ = ("_buf", "_max_size", "broken")

    def __init__(self, max_size: int = MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self._max_size = max_size
        self.broken = False

    @property
    def pending(self) -> int:
        """Octets received that do not yet make a whole message."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes | SipParseError]:
        if self.broken:
            return []
        self._buf += data
        out: list[bytes | SipParseError] = []
        while True:
            skip = 0
            while skip < len(self._buf) and self._buf[skip] in (13, 10):
                skip += 1
            if skip:
                del self._buf[:skip]
            if not self._buf:
                return out
            head_end, body_start = find_head_end(self._buf)
            too_large = SipParseError("Message Too Large", 513, kind="too_large")
            if head_end < 0:
                if len(self._buf) > self._max_size:
                    out.append(self._fail(too_large))
                return out
            if body_start > self._max_size:
                out.append(self._fail(too_large))
                return out
            head = bytes(self._buf[:head_end])
            lengths = raw_content_lengths(head)
            try:
                if len(lengths) != 1:
                    raise SipParseError(
                        "Multiple Content-Length headers"
                        if lengths
                        else "Missing Content-Length header"
                    )
                total = body_start + parse_content_length(lengths[0])
                if total > self._max_size:
                    raise SipParseError("Message Too Large", 513, kind="too_large")
            except SipParseError as exc:
                exc.message = best_effort(head)
                out.append(self._fail(exc))
                return out
            if len(self._buf) < total:
                return out
            out.append(bytes(self._buf[:total]))
            del self._buf[:total]

    def _fail(self, error: SipParseError) -> SipParseError:
        self.broken = True
        self._buf.clear()
        error.fatal = True
        if error.kind == "malformed":
            error.kind = "framing"
        return error
