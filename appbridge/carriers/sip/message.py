"""SIP messages: parse, validate, serialise, frame; build responses (RFC 3261 §7, §8.2.6, §18).

Theory of operation
-------------------
:func:`parse_message` turns the bytes of one message into a :class:`Request` or
:class:`Response` in two steps. *Splitting* finds the start line, the header section and the
body; it unfolds continuation lines (§7.3.1), expands compact names (§7.3.3) and reads the body
by Content-Length (§18.3: on a datagram a missing Content-Length means "to the end", a larger one
is an error, extra octets are dropped, RFC 4475 §3.1.1.8 / §3.1.2.2). *Validation* then parses
every header the transaction and dialog layers read (Via, From, To, Call-ID, CSeq, Max-Forwards,
Contact, Route, Record-Route, Date, Content-Length), checks that single-valued headers occur
once, and that the CSeq method is the request method (RFC 4475 §3.1.2.17/18). A failure raises
:class:`SipParseError`; when splitting worked, the error carries the raw message so the shell can
still answer 400 (or 505 for another SIP version). Other headers stay raw text, read on demand.

Header values are decoded as UTF-8 with ``surrogateescape``: a stray Latin-1 display name does
not cost a call, and serialising gives back the octets received.

:class:`~appbridge.carriers.sip.framing.SipStreamFramer` cuts a TCP byte stream into messages
(§18.3: Content-Length is mandatory there). It enforces the same 64 KiB limit of docs/sip.md
(``kind="too_large"``, status 513) and reports framing errors as fatal: the shell answers when
it can and closes the connection.

Typed accessors (``msg.vias``, ``msg.cseq``, ``msg.from_``...) parse on each call; they cannot
fail on a message that came out of :func:`parse_message`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator

from appbridge.carriers.sip.header_values import (
    CSeq,
    check_date,
    parse_call_id,
    parse_content_length,
    parse_max_forwards,
)
from appbridge.carriers.sip.headers import (
    NameAddr,
    SipParseError,
    SipUri,
    Via,
    canonical_name,
    is_token,
    parse_name_addr_list,
    split_list,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Headers",
    "Request",
    "Response",
    "SipParseError",
    "apply_received",
    "make_response",
    "new_branch",
    "new_call_id",
    "new_tag",
    "parse_message",
    "response_address",
]

MAX_MESSAGE_BYTES = 65536  # docs/sip.md: over 64 KiB is answered 513 on TCP, dropped on UDP
SIP_VERSION = "SIP/2.0"
# Headers that may appear once (RFC 3261 §7.3.1 and table 2; RFC 4475 §3.3.8, §3.3.9).
_SINGLE = ("From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Length", "Content-Type")
_DIALOG_CREATING = frozenset({"INVITE", "SUBSCRIBE", "REFER"})
_FOLD_RE = re.compile(r"\r?\n[ \t]+")
_VERSION_RE = re.compile(r"SIP/\d+\.\d+", re.IGNORECASE)

# fmt: off
REASON_PHRASES = {  # RFC 3261 §21 and the ones this gateway sends
    100: "Trying", 180: "Ringing", 181: "Call Is Being Forwarded", 182: "Queued",
    183: "Session Progress", 200: "OK", 202: "Accepted", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    407: "Proxy Authentication Required", 408: "Request Timeout",
    413: "Request Entity Too Large", 415: "Unsupported Media Type",
    416: "Unsupported URI Scheme", 420: "Bad Extension", 480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 483: "Too Many Hops",
    486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here",
    491: "Request Pending", 500: "Server Internal Error", 501: "Not Implemented",
    503: "Service Unavailable", 504: "Server Time-out", 505: "Version Not Supported",
    513: "Message Too Large", 600: "Busy Everywhere", 603: "Decline",
}
# fmt: on


def new_branch() -> str:
    """A fresh Via branch with the RFC 3261 magic cookie (§8.1.1.7)."""
    return "z9hG4bK" + secrets.token_hex(10)


def new_tag() -> str:
    """A From/To tag with at least 32 bits of randomness (§19.3)."""
    return secrets.token_hex(8)


def new_call_id(host: str) -> str:
    """A globally unique Call-ID (§8.1.1.4)."""
    return f"{secrets.token_hex(16)}@{host}"


class Headers:
    """Header lines in order, names canonical (long form, usual case), values unfolded.

    ``get``/``get_all`` return the values of header *lines*; ``values`` also splits the
    comma-separated lists of §7.3.1 (a Via line may hold several Via values).
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = [(canonical_name(n), v) for n, v in items]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def copy(self) -> Headers:
        out = Headers()
        out._items = list(self._items)
        return out

    def get(self, name: str) -> str | None:
        key = canonical_name(name).lower()
        for n, v in self._items:
            if n.lower() == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        key = canonical_name(name).lower()
        return [v for n, v in self._items if n.lower() == key]

    def values(self, name: str) -> list[str]:
        return [item for line in self.get_all(name) for item in split_list(line)]

    def add(self, name: str, value: str) -> None:
        self._items.append((canonical_name(name), value))

    def prepend(self, name: str, value: str) -> None:
        self._items.insert(0, (canonical_name(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every line of ``name`` by one, where the first one was (else at the end)."""
        canon = canonical_name(name)
        key = canon.lower()
        out: list[tuple[str, str]] = []
        placed = False
        for n, v in self._items:
            if n.lower() == key:
                if not placed:
                    out.append((canon, value))
                    placed = True
            else:
                out.append((n, v))
        if not placed:
            out.append((canon, value))
        self._items = out

    def replace_first(self, name: str, value: str) -> None:
        """Replace the first line of ``name`` in place (the top Via, say)."""
        key = canonical_name(name).lower()
        for i, (n, _) in enumerate(self._items):
            if n.lower() == key:
                self._items[i] = (n, value)
                return
        self._items.append((canonical_name(name), value))

    def remove(self, name: str) -> None:
        key = canonical_name(name).lower()
        self._items = [(n, v) for n, v in self._items if n.lower() != key]


class _Message:
    """What requests and responses share: headers, body and typed header access."""

    __slots__ = ("body", "headers")

    def __init__(self, headers: Headers | Iterable[tuple[str, str]], body: bytes) -> None:
        self.headers = headers if isinstance(headers, Headers) else Headers(headers)
        self.body = body

    def _first_line(self) -> str:
        raise NotImplementedError

    def serialize(self) -> bytes:
        """The wire form; Content-Length always states the body's length (§20.14)."""
        lines = [self._first_line()]
        length = f"Content-Length: {len(self.body)}"
        for n, v in self.headers:
            if n != "Content-Length":
                lines.append(f"{n}: {v}")
            elif length:
                lines.append(length)
                length = ""
        if length:
            lines.append(length)
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8", "surrogateescape") + self.body

    def __bytes__(self) -> bytes:
        return self.serialize()

    def _required(self, name: str) -> str:
        value = self.headers.get(name)
        if value is None:
            raise SipParseError(f"Missing {name} header")
        return value

    @property
    def vias(self) -> list[Via]:
        return [Via.parse(v) for v in self.headers.values("Via")]

    @property
    def top_via(self) -> Via:
        vias = self.headers.values("Via")
        if not vias:
            raise SipParseError("Missing Via header")
        return Via.parse(vias[0])

    @property
    def from_(self) -> NameAddr:
        return NameAddr.parse(self._required("From"), "From header")

    @property
    def to(self) -> NameAddr:
        return NameAddr.parse(self._required("To"), "To header")

    @property
    def call_id(self) -> str:
        return parse_call_id(self._required("Call-ID"))

    @property
    def cseq(self) -> CSeq:
        return CSeq.parse(self._required("CSeq"))

    @property
    def contacts(self) -> list[NameAddr]:
        return [a for line in self.headers.get_all("Contact") for a in _addresses(line, "Contact")]

    @property
    def routes(self) -> list[NameAddr]:
        return [a for line in self.headers.get_all("Route") for a in _addresses(line, "Route")]

    @property
    def record_routes(self) -> list[NameAddr]:
        return [
            a
            for line in self.headers.get_all("Record-Route")
            for a in _addresses(line, "Record-Route")
        ]

    @property
    def max_forwards(self) -> int | None:
        value = self.headers.get("Max-Forwards")
        return None if value is None else parse_max_forwards(value)

    @property
    def content_type(self) -> str | None:
        value = self.headers.get("Content-Type")
        return None if value is None else value.split(";")[0].strip().lower()


def _addresses(line: str, name: str) -> list[NameAddr]:
    return parse_name_addr_list(line, f"{name} header")


class Request(_Message):
    """A SIP request (RFC 3261 §7.1). ``uri`` is the Request-URI."""

    __slots__ = ("method", "uri")

    def __init__(
        self,
        method: str,
        uri: SipUri,
        headers: Headers | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> None:
        super().__init__(headers, body)
        self.method = method
        self.uri = uri

    def _first_line(self) -> str:
        return f"{self.method} {self.uri} {SIP_VERSION}"

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.uri}>"


class Response(_Message):
    """A SIP response (RFC 3261 §7.2)."""

    __slots__ = ("reason", "status")

    def __init__(
        self,
        status: int,
        reason: str = "",
        headers: Headers | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> None:
        super().__init__(headers, body)
        self.status = status
        self.reason = reason

    def _first_line(self) -> str:
        return f"{SIP_VERSION} {self.status} {self.reason}"

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}>"


def find_head_end(data: bytes | bytearray) -> tuple[int, int]:
    """(end of the header section, start of the body), or (-1, -1): CRLF CRLF, or bare LF LF
    from lenient peers."""
    crlf = data.find(b"\r\n\r\n")
    lf = data.find(b"\n\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, crlf + 4
    if lf >= 0:
        return lf, lf + 2
    return -1, -1


def _split(head_bytes: bytes) -> Request | Response:
    """Start line and raw headers (unfolded, compact names expanded), not yet validated. A bad
    header line or request line still yields the raw request on the error, for the 400."""
    text = head_bytes.decode("utf-8", "surrogateescape")
    lines = _FOLD_RE.sub(" ", text).split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    first, header_lines = lines[0], lines[1:]
    headers = Headers()
    error: SipParseError | None = None
    for line in header_lines:
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not is_token(name):
            error = error or SipParseError("Malformed header line")
            continue
        headers.add(name, value.strip(" \t"))
    message: Request | Response
    if first[:4].upper() == "SIP/":
        message = _status_line(first, headers)
    else:
        message = _request_line(first, headers)
    if error is not None:
        error.message = message
        raise error
    return message


def raw_content_lengths(head_bytes: bytes) -> list[str]:
    """The Content-Length values of a header section, without parsing anything else."""
    text = head_bytes.decode("utf-8", "surrogateescape")
    lines = _FOLD_RE.sub(" ", text).split("\n")[1:]
    pairs = (line.partition(":") for line in lines)
    return [v.strip() for n, _, v in pairs if n.strip().lower() in ("content-length", "l")]


def best_effort(head_bytes: bytes) -> Request | Response | None:
    try:
        return _split(head_bytes)
    except SipParseError as exc:
        return exc.message


def _status_line(line: str, headers: Headers) -> Response:
    """``SIP-Version SP Status-Code SP Reason-Phrase`` (§7.2); a code outside 100-699 makes the
    response unusable (RFC 4475 §3.1.2.19)."""
    version, _, rest = line.partition(" ")
    code, _, reason = rest.partition(" ")
    if version.upper() != SIP_VERSION or not re.fullmatch(r"[1-6]\d\d", code):
        raise SipParseError("Malformed Status-Line")
    return Response(int(code), reason, headers)


def _request_line(line: str, headers: Headers) -> Request:
    """``Method SP Request-URI SP SIP-Version`` with single spaces and nothing after (§7.1,
    RFC 4475 §3.1.2.7 to §3.1.2.11: no ``<>``, no LWS, no escaped headers in the URI). A bad
    line still gives a placeholder request on the error, so the 400 can be sent."""
    parts = line.split(" ")
    method = parts[0] if is_token(parts[0]) else ""
    placeholder = Request(method, SipUri(scheme="invalid", opaque="-"), headers)
    if len(parts) != 3 or not all(parts) or not method:
        raise SipParseError("Malformed Request-Line", message=placeholder)
    uri_text, version = parts[1], parts[2]
    try:
        uri = SipUri.parse(uri_text)
    except SipParseError:
        raise SipParseError("Malformed Request-URI", message=placeholder) from None
    if uri.headers is not None:
        raise SipParseError("Malformed Request-URI", message=placeholder)
    request = Request(method, uri, headers)
    if version.upper() != SIP_VERSION:
        if _VERSION_RE.fullmatch(version):
            raise SipParseError("Version Not Supported", 505, kind="bad_version", message=request)
        raise SipParseError("Malformed Request-Line", message=request)
    return request


def parse_message(
    data: bytes, *, datagram: bool = True, max_size: int = MAX_MESSAGE_BYTES
) -> Request | Response:
    """Parse and validate one message.

    ``datagram=True`` for UDP (§18.3: body to the end without Content-Length; extra octets
    dropped). ``datagram=False`` for what the stream framer returns: Content-Length is
    required and must match. Raises :class:`SipParseError` only.
    """
    if len(data) > max_size:
        raise SipParseError("Message Too Large", 513, kind="too_large")
    start = 0
    while data.startswith(b"\r\n", start):  # §7.5: ignore CRLFs before the start line
        start += 2
    head_end, body_start = find_head_end(data[start:])
    if head_end < 0:
        raise SipParseError("Incomplete header section")
    message = _split(data[start : start + head_end])
    rest = data[start + body_start :]
    try:
        for name in _SINGLE:
            if len(message.headers.get_all(name)) > 1:
                raise SipParseError(f"Multiple {name} headers")
        lengths = message.headers.get_all("Content-Length")
        if lengths:
            length = parse_content_length(lengths[0])
            if length > len(rest):
                raise SipParseError("Content-Length larger than message")
            if not datagram and length != len(rest):
                raise SipParseError("Content-Length does not match body")
            message.body = rest[:length]
        elif datagram:
            message.body = rest
        else:
            raise SipParseError("Missing Content-Length header")
        _validate(message)
    except SipParseError as exc:
        exc.message = message
        raise
    return message


def _validate(message: Request | Response) -> None:
    """Parse every header the transaction and dialog layers rely on (see module docstring)."""
    h = message.headers
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        if h.get(name) is None:
            raise SipParseError(f"Missing {name} header")
    message.vias  # noqa: B018  (parsing is the check)
    message.from_  # noqa: B018
    message.to  # noqa: B018
    message.call_id  # noqa: B018
    cseq = message.cseq
    message.max_forwards  # noqa: B018
    message.contacts  # noqa: B018
    message.routes  # noqa: B018
    message.record_routes  # noqa: B018
    for date in h.get_all("Date"):
        check_date(date)
    if isinstance(message, Request) and cseq.method != message.method:
        raise SipParseError("CSeq method does not match Request-Line")


def make_response(
    request: Request,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
    content_type: str | None = None,
) -> Response:
    """A response to ``request`` (RFC 3261 §8.2.6.2): Via lines, From, To, Call-ID and CSeq
    copied as received (so this works on the raw request of a :class:`SipParseError` too), the
    To tag added when given and absent (§8.2.6.2: not for 100), and Record-Route when the
    response sets up a dialog (§12.1.1). ``headers`` come after them.
    """
    out = Headers()
    copied = ["Via", "From", "To", "Call-ID", "CSeq"]
    if request.method in _DIALOG_CREATING and 100 < status < 300:
        copied.insert(1, "Record-Route")  # §12.1.1: same values, same order
    for name in copied:
        for value in request.headers.get_all(name):
            if name == "To" and to_tag is not None and status != 100:
                value = _with_tag(value, to_tag)
            out.add(name, value)
    for name, value in headers:
        out.add(name, value)
    if body and content_type:
        out.set("Content-Type", content_type)
    return Response(status, reason or REASON_PHRASES.get(status, ""), out, body)


def _with_tag(to_value: str, tag: str) -> str:
    try:
        if NameAddr.parse(to_value).tag is not None:
            return to_value
    except SipParseError:
        pass
    return f"{to_value};tag={tag}"


def apply_received(request: Request, source_host: str, source_port: int) -> None:
    """Stamp the top Via with where the request came from, as a UAS must: ``received`` when
    the sent-by host differs from the source (RFC 3261 §18.2.1), and, when the client asked
    with a bare ``rport``, ``rport=<source port>`` plus ``received`` always (RFC 3581 §4)."""
    lines = request.headers.get_all("Via")
    if not lines:
        return
    vias = Via.parse_list(lines[0])
    top = vias[0]
    if top.rport == "":
        top = top.with_param("received", source_host).with_param("rport", str(source_port))
    elif top.host.strip("[]") != source_host:
        top = top.with_param("received", source_host)
    else:
        return
    request.headers.replace_first("Via", ", ".join([str(top), *map(str, vias[1:])]))


def response_address(via: Via, default_port: int = 5060) -> tuple[str, int]:
    """Where an unreliable-transport response goes (RFC 3261 §18.2.2, RFC 3581 §4): received
    and rport when the client asked for rport, else maddr, else received (or sent-by host) with
    the sent-by port. Over TCP the response goes back on the request's connection instead."""
    host = via.received or via.host
    if via.rport:
        return host, int(via.rport)
    if via.maddr:
        return via.maddr, via.port or default_port
    return host, via.port or default_port
