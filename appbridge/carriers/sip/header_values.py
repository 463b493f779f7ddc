"""The single-valued SIP headers a transaction is matched and framed on: CSeq, Call-ID,
Max-Forwards, Content-Length and Date (RFC 3261 §20.8, §20.14, §20.16, §20.17, §20.22).

Each takes one header value (unfolded by ``message.py``) and returns it parsed, or raises
:class:`~appbridge.carriers.sip.headers.SipParseError` with a fixed reason, like the rest of
``headers.py``. Sans-I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from appbridge.carriers.sip.headers import TOKEN_CLASS, SipParseError

MAX_CSEQ = 2**32 - 1  # RFC 3261 §8.1.1.5: a 32-bit unsigned integer
MAX_FORWARDS_LIMIT = 255  # RFC 3261 §20.22 (the RFC 4475 §3.1.2.4 torture value is 300)

_WORD_RE = re.compile(r"[A-Za-z0-9\-.!%*_+`'~()<>:\\\"/\[\]?{}]+")
_DATE_RE = re.compile(
    r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT"
)


@dataclass(frozen=True, slots=True)
class CSeq:
    """``CSeq: 1*DIGIT LWS Method`` (RFC 3261 §20.16); the number must fit 32 bits (§8.1.1.5,
    RFC 4475 §3.1.2.4)."""

    seq: int
    method: str

    @classmethod
    def parse(cls, text: str) -> CSeq:
        m = re.fullmatch(f"[ \\t]*(\\d{{1,10}})[ \\t]+([{TOKEN_CLASS}]+)[ \\t]*", text)
        if m is None or int(m.group(1)) > MAX_CSEQ:
            raise SipParseError("Malformed CSeq header")
        return cls(int(m.group(1)), m.group(2))

    def __str__(self) -> str:
        return f"{self.seq} {self.method}"


def parse_call_id(text: str) -> str:
    """``Call-ID: word ["@" word]`` (RFC 3261 §20.8)."""
    value = text.strip()
    local, _, host = value.partition("@")
    if not _WORD_RE.fullmatch(local) or ("@" in value and not _WORD_RE.fullmatch(host)):
        raise SipParseError("Malformed Call-ID header")
    return value


def parse_max_forwards(text: str) -> int:
    """``Max-Forwards: 1*DIGIT``, 0 to 255 (RFC 3261 §20.22)."""
    value = text.strip()
    if not value.isascii() or not value.isdigit() or int(value) > MAX_FORWARDS_LIMIT:
        raise SipParseError("Malformed Max-Forwards header")
    return int(value)


def parse_content_length(text: str) -> int:
    """``Content-Length: 1*DIGIT`` (RFC 3261 §20.14). A sign or a non-digit is a framing error
    the parser must never turn into a negative length (RFC 4475 §3.1.2.3)."""
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 10:
        raise SipParseError("Malformed Content-Length header")
    return int(value)


def check_date(text: str) -> None:
    """``Date`` is an RFC 1123 date in GMT only (RFC 3261 §20.17, RFC 4475 §3.1.2.12)."""
    if _DATE_RE.fullmatch(text.strip()) is None:
        raise SipParseError("Malformed Date header")
