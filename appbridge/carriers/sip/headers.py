"""SIP header values: URIs, name-addr, Via, auth parameters (RFC 3261 §19, §20, §25).

Theory of operation
-------------------
Every function here takes one header *value* (already unfolded by ``message.py``: CRLF + WSP
became a single SP, RFC 3261 §7.3.1) and returns an immutable dataclass, or raises
:class:`SipParseError` with a short fixed reason that a ``400`` response can carry verbatim (it
never echoes peer text). Serialising a parsed value with ``str()`` gives a canonical form; raw
parameter values are kept as written (quotes included) so that nothing is lost on the way through.

The grammar is RFC 3261 §25.1, applied strictly where the RFC 4475 torture tests say a parser must
reject (§3.1.2: empty parameters, unquoted non-token display names, spaces inside ``<>``, a URI
with ``?`` outside ``<>``) and liberally where they say it must accept (§3.1.1: LWS around
``;``/``=``/``/``, tokens with unusual characters, ``%`` escapes, unknown URI schemes kept opaque).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Self
from urllib.parse import unquote

if TYPE_CHECKING:
    from appbridge.carriers.sip.message import Request, Response

Params = tuple[tuple[str, str | None], ...]


class SipParseError(ValueError):
    """A message, or one header of it, that does not follow RFC 3261.

    ``reason`` is fixed text safe for a reason phrase; ``status`` the response a UAS sends when a
    response is possible (400, 505 for another SIP version, 513 when over the size limit). ``kind``
    lets the shell act without string matching: ``malformed``, ``bad_version``, ``too_large``
    (docs/sip.md, "What is supported": 513 on TCP, dropped on UDP) or ``framing`` (a stream can no
    longer be split into messages). ``fatal`` means the stream connection must be closed.
    ``message`` is the raw message when its start line and header section could be split, so the
    shell can build the 400 from its Via/From/To/Call-ID/CSeq (RFC 3261 §8.2.6.2).
    """

    def __init__(
        self,
        reason: str,
        status: int = 400,
        *,
        kind: str = "malformed",
        fatal: bool = False,
        message: Request | Response | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.kind = kind
        self.fatal = fatal
        self.message = message

    @property
    def can_respond(self) -> bool:
        """True when a response can be sent: the message is a request other than ACK (RFC 3261
        §17.2.3: never answer an ACK) with a Via to send it along. A malformed response is
        always dropped (RFC 4475 §3.1.2.5, §3.1.2.19)."""
        from appbridge.carriers.sip.message import Request

        msg = self.message
        if not isinstance(msg, Request) or msg.method == "ACK":
            return False
        if (msg.headers.get("CSeq") or "").split()[-1:] == ["ACK"]:
            return False
        # Via and CSeq are what the client matches a response on (§17.1.3); the other copied
        # headers go back as received, or absent (RFC 4475 §3.3.1 still wants the 400).
        return msg.headers.get("Via") is not None and msg.headers.get("CSeq") is not None

    @property
    def can_respond_on_stream(self) -> bool:
        """True when a response can still go back on the connection the request came in on
        (TCP, RFC 3261 §18.2.2: the stream is the way back), though Via or CSeq is missing."""
        from appbridge.carriers.sip.message import Request

        msg = self.message
        return isinstance(msg, Request) and msg.method != "ACK"


# RFC 3261 §25.1 character classes.
_ALNUM = "A-Za-z0-9"
TOKEN_CLASS = _ALNUM + r"\-.!%*_+`'~"
TOKEN_RE = re.compile(f"[{TOKEN_CLASS}]+")
_ESC = "%[0-9A-Fa-f]{2}"
_UNRESERVED = _ALNUM + r"\-_.!~*'()"
_USER_RE = re.compile(f"(?:[{_UNRESERVED}&=+$,;?/]|{_ESC})+")
_PASSWORD_RE = re.compile(f"(?:[{_UNRESERVED}&=+$,]|{_ESC})*")
_PARAMCHAR_RE = re.compile(f"(?:[{_UNRESERVED}\\[\\]/:&+$]|{_ESC})+")
_HNV_RE = re.compile(f"(?:[{_UNRESERVED}\\[\\]/?:+$]|{_ESC})*")
_HOST_RE = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?\.?)")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):(.*)", re.DOTALL)
_OPAQUE_RE = re.compile(r"[^\s<>\"]+")
_TEL_RE = re.compile(r"[0-9A-Fa-f*#+().\-]+")
_GEN_VALUE_RE = re.compile(f"[{TOKEN_CLASS}\\[\\]:]+")
_TOKEN_DISPLAY_RE = re.compile(f"([{TOKEN_CLASS}]+(?:[ \\t]+[{TOKEN_CLASS}]+)*)[ \\t]*<")
MAGIC_COOKIE = "z9hG4bK"  # RFC 3261 §8.1.1.7

# RFC 3261 §7.3.3 compact forms, plus the registered ones for headers we name (IANA registry).
COMPACT_FORMS = {
    "i": "Call-ID",
    "m": "Contact",
    "e": "Content-Encoding",
    "l": "Content-Length",
    "c": "Content-Type",
    "f": "From",
    "s": "Subject",
    "k": "Supported",
    "t": "To",
    "v": "Via",
    "o": "Event",
    "r": "Refer-To",
    "b": "Referred-By",
    "u": "Allow-Events",
    "x": "Session-Expires",
}
# fmt: off
_KNOWN = (
    "Accept", "Accept-Encoding", "Accept-Language", "Alert-Info", "Allow",
    "Allow-Events", "Authentication-Info", "Authorization", "Call-ID", "Call-Info",
    "Contact", "Content-Disposition", "Content-Encoding", "Content-Language",
    "Content-Length", "Content-Type", "CSeq", "Date", "Diversion", "Error-Info", "Event",
    "Expires", "From", "In-Reply-To", "Max-Forwards", "MIME-Version", "Min-Expires",
    "Min-SE", "Organization", "P-Asserted-Identity", "Priority", "Privacy",
    "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Require", "RAck", "Reason",
    "Record-Route", "Refer-To", "Referred-By", "Reply-To", "Require", "Retry-After",
    "Route", "RSeq", "Server", "Session-Expires", "Subject", "Subscription-State",
    "Supported", "Timestamp", "To", "Unsupported", "User-Agent", "Via", "Warning",
    "WWW-Authenticate",
)
# fmt: on
_CANONICAL = {name.lower(): name for name in _KNOWN}


def canonical_name(name: str) -> str:
    """The long, conventionally capitalised form of a header name (RFC 3261 §7.3.3: compact
    forms are equivalent; §7.3.1: names compare case-insensitively). Unknown names stay as sent."""
    lower = name.lower()
    return COMPACT_FORMS.get(lower) or _CANONICAL.get(lower, name)


def is_token(text: str) -> bool:
    return TOKEN_RE.fullmatch(text) is not None


def quote_string(text: str) -> str:
    """A quoted-string (RFC 3261 §25.1) holding ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unquote_string(text: str) -> str:
    """The content of a quoted-string, or ``text`` itself when it is not quoted."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1], flags=re.DOTALL)
    return text


def split_list(value: str) -> list[str]:
    """Split a comma-separated header value (RFC 3261 §7.3.1) at commas outside quoted strings
    and ``<>``. Empty elements are kept, so that ``a,,b`` can be rejected by the caller."""
    out: list[str] = []
    start = 0
    depth = 0
    quoted = False
    i = 0
    while i < len(value):
        ch = value[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            out.append(value[start:i].strip())
            start = i + 1
        i += 1
    if quoted:
        raise SipParseError("Unterminated quoted string")
    out.append(value[start:].strip())
    return out


class Scanner:
    """A cursor over one header value; every parse error names the header being parsed."""

    __slots__ = ("pos", "text", "what")

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.pos = 0
        self.what = what

    def fail(self) -> SipParseError:
        return SipParseError(f"Malformed {self.what}")

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.fail()
        self.pos += 1

    def match(self, pattern: re.Pattern[str]) -> str:
        m = pattern.match(self.text, self.pos)
        if m is None or m.end() == self.pos:
            raise self.fail()
        self.pos = m.end()
        return m.group(0)

    def quoted(self) -> str:
        """A quoted-string, returned with its quotes (qdtext / quoted-pair, §25.1)."""
        start = self.pos
        self.expect('"')
        while True:
            ch = self.peek()
            if ch == "":
                raise self.fail()
            self.pos += 1
            if ch == '"':
                return self.text[start : self.pos]
            if ch == "\\":
                nxt = self.peek()
                if nxt == "" or nxt in "\r\n":
                    raise self.fail()
                self.pos += 1
            elif (ord(ch) < 0x20 and ch != "\t") or ch == "\x7f":
                raise self.fail()

    def params(self) -> Params:
        """``*( SEMI generic-param )`` to the end of the value (§25.1), with LWS around ``;`` and
        ``=``. An empty parameter (``;;``) is an error (RFC 4475 §3.1.2.1)."""
        out: list[tuple[str, str | None]] = []
        while True:
            self.skip_ws()
            if self.at_end():
                return tuple(out)
            self.expect(";")
            self.skip_ws()
            name = self.match(TOKEN_RE)
            self.skip_ws()
            value: str | None = None
            if self.peek() == "=":
                self.pos += 1
                self.skip_ws()
                value = self.quoted() if self.peek() == '"' else self.match(_GEN_VALUE_RE)
            out.append((name, value))


def _find_param(params: Params, name: str) -> tuple[bool, str | None]:
    lower = name.lower()
    for key, value in params:
        if key.lower() == lower:
            return True, value
    return False, None


def _set_param(params: Params, name: str, value: str | None) -> Params:
    lower = name.lower()
    if any(key.lower() == lower for key, _ in params):
        return tuple((k, value) if k.lower() == lower else (k, v) for k, v in params)
    return (*params, (name, value))


def _format_params(params: Params) -> str:
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params)


class _HasParams:
    """Parameter access shared by URIs, addresses and Via values (names case-insensitive)."""

    __slots__ = ()
    params: Params

    def param(self, name: str) -> str | None:
        return _find_param(self.params, name)[1]

    def has_param(self, name: str) -> bool:
        return _find_param(self.params, name)[0]

    def with_param(self, name: str, value: str | None = None) -> Self:
        return replace(self, params=_set_param(self.params, name, value))  # type: ignore[type-var]


@dataclass(frozen=True, slots=True)
class SipUri(_HasParams):
    """A ``sip:``/``sips:`` URI (RFC 3261 §19.1), a ``tel:`` URI (RFC 3966: ``user`` holds the
    number) or any other absolute URI kept ``opaque`` (RFC 4475 §3.3.2: such a message parses;
    the application answers 416). Components stay escaped as sent; see :attr:`user_unescaped`."""

    scheme: str
    user: str | None = None
    password: str | None = None
    host: str = ""
    port: int | None = None
    params: Params = ()
    headers: str | None = None
    opaque: str | None = None

    @classmethod
    def parse(cls, text: str) -> SipUri:
        m = _SCHEME_RE.fullmatch(text)
        if m is None:
            raise SipParseError("Malformed URI")
        scheme, rest = m.group(1).lower(), m.group(2)
        if scheme in ("sip", "sips"):
            return cls._parse_sip(scheme, rest)
        if scheme == "tel":
            number, _, tail = rest.partition(";")
            if not _TEL_RE.fullmatch(number):
                raise SipParseError("Malformed URI")
            params = Scanner(";" + tail, "URI").params() if tail else ()
            return cls(scheme="tel", user=number, params=params)
        if not _OPAQUE_RE.fullmatch(rest):
            raise SipParseError("Malformed URI")
        return cls(scheme=scheme, opaque=rest)

    @classmethod
    def _parse_sip(cls, scheme: str, rest: str) -> SipUri:
        user = password = None
        at = rest.find("@")
        if at >= 0:
            user, colon, pw = rest[:at].partition(":")
            password = pw if colon else None
            if not _USER_RE.fullmatch(user):
                raise SipParseError("Malformed URI")
            if password is not None and not _PASSWORD_RE.fullmatch(password):
                raise SipParseError("Malformed URI")
            rest = rest[at + 1 :]
        rest, qmark, headers = rest.partition("?")
        hostport, semi, tail = rest.partition(";")
        if hostport.startswith("["):
            close = hostport.find("]")
            host, port_text = hostport[: close + 1], hostport[close + 1 :]
        else:
            host, colon, port_text = hostport.partition(":")
            port_text = ":" + port_text if colon else ""
        if not _HOST_RE.fullmatch(host):
            raise SipParseError("Malformed URI")
        port = None
        if port_text:
            if not re.fullmatch(r":\d{1,5}", port_text) or int(port_text[1:]) > 65535:
                raise SipParseError("Malformed URI")
            port = int(port_text[1:])
        params: list[tuple[str, str | None]] = []
        if semi:
            for item in tail.split(";"):
                name, eq, value = item.partition("=")
                if not _PARAMCHAR_RE.fullmatch(name) or (eq and not _PARAMCHAR_RE.fullmatch(value)):
                    raise SipParseError("Malformed URI")
                params.append((name, value if eq else None))
        if qmark:
            for item in headers.split("&"):
                name, eq, value = item.partition("=")
                if not eq or not name or not _HNV_RE.fullmatch(name + value):
                    raise SipParseError("Malformed URI")
        return cls(
            scheme=scheme,
            user=user,
            password=password,
            host=host,
            port=port,
            params=tuple(params),
            headers=headers if qmark else None,
        )

    def __str__(self) -> str:
        if self.opaque is not None:
            return f"{self.scheme}:{self.opaque}"
        if self.scheme == "tel":
            return f"tel:{self.user}{_format_params(self.params)}"
        out = self.scheme + ":"
        if self.user is not None:
            out += self.user
            if self.password is not None:
                out += ":" + self.password
            out += "@"
        out += self.host
        if self.port is not None:
            out += f":{self.port}"
        out += _format_params(self.params)
        if self.headers is not None:
            out += "?" + self.headers
        return out

    @property
    def user_unescaped(self) -> str | None:
        """The user part with ``%HH`` escapes decoded (RFC 3261 §19.1.2, applied once: RFC 4475
        §3.1.1.3); undecodable octets become U+FFFD."""
        return None if self.user is None else unquote(self.user, errors="replace")

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")


@dataclass(frozen=True, slots=True)
class NameAddr(_HasParams):
    """``[display-name] <addr-spec> *(;param)`` or ``addr-spec *(;param)`` (RFC 3261 §20.10,
    §25.1): the value of From, To, Contact, Route, Record-Route, Refer-To. ``display_name`` is
    unquoted; ``star`` is the ``Contact: *`` of REGISTER (§10.2.2)."""

    uri: SipUri
    display_name: str | None = None
    params: Params = ()
    star: bool = False

    @classmethod
    def parse(cls, text: str, what: str = "address") -> NameAddr:
        s = Scanner(text.strip(), what)
        if s.text == "*":
            return cls(uri=SipUri(scheme="*"), star=True)
        display: str | None = None
        if s.peek() == '"':
            display = unquote_string(s.quoted())
            s.skip_ws()
        elif s.peek() != "<":
            # Either a token display name before "<" or a bare addr-spec.
            m = _TOKEN_DISPLAY_RE.match(s.text)
            if m:
                display = m.group(1).strip()
                s.pos = m.end() - 1
        if s.peek() == "<":
            s.pos += 1
            close = s.text.find(">", s.pos)
            if close < 0:
                raise s.fail()
            uri_text, s.pos = s.text[s.pos : close], close + 1
        elif display is not None:
            raise s.fail()
        else:
            # addr-spec form: the URI ends at the first ";" and may not hold "?" or ","
            # (RFC 3261 §20.10; RFC 4475 §3.1.2.13).
            end = s.text.find(";")
            end = len(s.text) if end < 0 else end
            uri_text, s.pos = s.text[:end].rstrip(), end
            if "?" in uri_text or "," in uri_text:
                raise s.fail()
        try:
            uri = SipUri.parse(uri_text)
        except SipParseError:
            raise s.fail() from None
        return cls(uri=uri, display_name=display, params=s.params())

    def __str__(self) -> str:
        if self.star:
            return "*"
        out = f"<{self.uri}>"
        if self.display_name:
            name = self.display_name
            out = (name if is_token(name) else quote_string(name)) + " " + out
        return out + _format_params(self.params)

    @property
    def tag(self) -> str | None:
        return self.param("tag")

    def without_params(self) -> NameAddr:
        return replace(self, params=())


def parse_name_addr_list(value: str, what: str) -> list[NameAddr]:
    """A comma-separated list of addresses (Contact, Route, Record-Route)."""
    items = split_list(value)
    if any(not item for item in items):
        raise SipParseError(f"Malformed {what}")
    return [NameAddr.parse(item, what) for item in items]


_VIA_HEAD_RE = re.compile(
    f"([{TOKEN_CLASS}]+)[ \\t]*/[ \\t]*([{TOKEN_CLASS}]+)[ \\t]*/[ \\t]*([{TOKEN_CLASS}]+)"
    r"[ \t]+(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(?:[ \t]*:[ \t]*(\d{1,5}))?"
)


@dataclass(frozen=True, slots=True)
class Via(_HasParams):
    """One Via value (RFC 3261 §20.42, §18.2.1; RFC 3581 ``rport``). ``rport`` is ``""`` when
    present without a value (a request asking for it) and ``None`` when absent."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()
    protocol: str = "SIP/2.0"

    @classmethod
    def parse(cls, text: str) -> Via:
        s = Scanner(text.strip(), "Via header")
        m = _VIA_HEAD_RE.match(s.text)
        if m is None:
            raise s.fail()
        name, version, transport, host, port = m.groups()
        if port is not None and int(port) > 65535:
            raise s.fail()
        s.pos = m.end()
        params = s.params()
        ttl = _find_param(params, "ttl")[1]
        if ttl is not None and (not ttl.isdigit() or int(ttl) > 255):
            raise s.fail()
        rport = _find_param(params, "rport")
        if rport[1] is not None and (not rport[1].isdigit() or int(rport[1]) > 65535):
            raise s.fail()
        return cls(
            transport=transport.upper(),
            host=host,
            port=None if port is None else int(port),
            params=params,
            protocol=f"{name.upper()}/{version}",
        )

    @classmethod
    def parse_list(cls, value: str) -> list[Via]:
        items = split_list(value)
        if any(not item for item in items):
            raise SipParseError("Malformed Via header")
        return [cls.parse(item) for item in items]

    def __str__(self) -> str:
        port = "" if self.port is None else f":{self.port}"
        return f"{self.protocol}/{self.transport} {self.host}{port}{_format_params(self.params)}"

    @property
    def sent_by(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"

    @property
    def branch(self) -> str | None:
        return self.param("branch")

    @property
    def received(self) -> str | None:
        return self.param("received")

    @property
    def rport(self) -> str | None:
        found, value = _find_param(self.params, "rport")
        return (value or "") if found else None

    @property
    def maddr(self) -> str | None:
        return self.param("maddr")
