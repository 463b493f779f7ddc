"""The plaintext ``ws://`` rule for app and listener links, and URL redaction for logs.

App links carry the caller's audio, transcripts and the app's commands, so plaintext is refused off
the private network (docs/configuration.md, "The plaintext `ws://` rule"). A ``ws://`` URL is
accepted only when its host is:

- an IPv4 loopback (127/8), RFC 1918 (10/8, 172.16/12, 192.168/16) or link-local (169.254/16)
  address;
- an IPv6 loopback (``::1``), unique-local (fc00::/7) or link-local (fe80::/10) address; an
  IPv4-mapped address (``::ffff:10.0.0.5``) counts by its IPv4 part; a zone id
  (``fe80::1%25eth0``, RFC 6874) is accepted only on a link-local address, so a zone never makes
  any other address private;
- ``localhost`` or a name under ``.localhost``, ``.internal`` or ``.local``;
- a single-label name without a dot (a Compose or Kubernetes service name). It is accepted with a
  warning: the resolver's search list can turn ``agent`` into ``agent.example.com``.

``wss://`` is always accepted. The rule reads the URL text only and never resolves a name.

Why the host is parsed here rather than trusted to :func:`urllib.parse.urlsplit`: a host that
*looks* like a name may be an IPv4 address in a legacy form that the system resolver
(``inet_aton``) and WHATWG URL parsers both accept: ``ws://0x08080808/`` and ``ws://134744072/``
are 8.8.8.8, although they read as single-label names. Such hosts are decoded the way the WHATWG
URL standard decodes them ("ends in a number" rule) and judged by the address they denote.
Characters that parsers disagree about (backslash, whitespace, controls) make the URL invalid.

Logs and reports show an app URL as ``scheme://host:port`` only (docs/configuration.md) (no
userinfo, path or query, which may hold tokens): :func:`redact_url`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = [
    "PlaintextVerdict",
    "UrlAuthority",
    "check_plaintext",
    "parse_authority",
    "plaintext_allowed",
    "redact_url",
]

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_DEFAULT_PORTS = {"ws": 80, "http": 80, "wss": 443, "https": 443}
_TLS_SCHEMES = frozenset({"wss", "https"})
_PLAINTEXT_SCHEMES = frozenset({"ws", "http"})
# Anything a URL parser might read differently from another one, or that no host may contain.
_FORBIDDEN_CHARS_RE = re.compile(r"[\x00-\x20\x7f\\]")
_LABEL_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_ZONE_RE = re.compile(r"[A-Za-z0-9._~-]+")
_PORT_RE = re.compile(r"[0-9]{1,5}")
_HEX_RE = re.compile(r"0x[0-9a-f]*")
_OCTAL_RE = re.compile(r"0[0-7]+")
_DECIMAL_RE = re.compile(r"[0-9]+")

_PRIVATE_V4 = tuple(
    ipaddress.IPv4Network(net)
    for net in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")
)
_LOOPBACK_V6 = ipaddress.IPv6Address("::1")
_UNIQUE_LOCAL_V6 = ipaddress.IPv6Network("fc00::/7")
_LINK_LOCAL_V6 = ipaddress.IPv6Network("fe80::/10")
_PRIVATE_NAME_SUFFIXES = (".localhost", ".internal", ".local")


@dataclass(frozen=True, slots=True)
class UrlAuthority:
    """The parts of a URL that decide where a connection goes.

    ``host`` is lowercased and has no brackets; for an IPv6 literal ``zone`` holds the zone id
    (without the ``%25``) and ``host`` the address alone. ``port`` is ``None`` when the URL
    gives none; :attr:`effective_port` fills in the scheme's default.
    """

    scheme: str
    host: str
    port: int | None
    is_ipv6_literal: bool
    zone: str | None = None

    @property
    def effective_port(self) -> int | None:
        return self.port if self.port is not None else _DEFAULT_PORTS.get(self.scheme)

    @property
    def host_for_url(self) -> str:
        """The host as it is written back into a URL (brackets and ``%25`` zone for IPv6)."""
        if not self.is_ipv6_literal:
            return self.host
        zone = f"%25{self.zone}" if self.zone else ""
        return f"[{self.host}{zone}]"


@dataclass(frozen=True, slots=True)
class PlaintextVerdict:
    """Outcome of the rule: ``reason`` says why a URL was refused, ``warning`` what to log."""

    allowed: bool
    warning: str | None = None
    reason: str | None = None


def parse_authority(url: str) -> UrlAuthority | None:
    """Split ``scheme://[userinfo@]host[:port]`` out of ``url``; ``None`` when it is malformed.

    The authority ends at the first ``/``, ``?`` or ``#`` (RFC 3986 §3.2); userinfo ends at the
    last ``@`` in it, as in :mod:`urllib.parse` (which the websockets client uses), so both read
    the same host.
    """
    if _FORBIDDEN_CHARS_RE.search(url):
        return None
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        return None
    end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            end = min(end, index)
    hostport = rest[:end].rpartition("@")[2]
    zone: str | None = None
    if hostport.startswith("["):
        close = hostport.find("]")
        if close == -1:
            return None
        inside, after = hostport[1:close], hostport[close + 1 :]
        if after and not after.startswith(":"):
            return None
        port_text = after[1:] if after else None
        address, pct, zone_text = inside.partition("%")
        if pct:
            # RFC 6874 writes the zone delimiter as %25; a bare % is accepted as well.
            zone_text = zone_text.removeprefix("25")
            if not _ZONE_RE.fullmatch(zone_text):
                return None
            zone = zone_text
        try:
            host = str(ipaddress.IPv6Address(address))
        except ValueError:
            return None
        is_v6 = True
    else:
        if hostport.count(":") > 1:
            return None
        host, colon, port_part = hostport.partition(":")
        port_text = port_part if colon else None
        host = host.lower()
        is_v6 = False
        if not host:
            return None
    port: int | None = None
    if port_text is not None:
        if not _PORT_RE.fullmatch(port_text) or not 0 < int(port_text) <= 65535:
            return None
        port = int(port_text)
    return UrlAuthority(scheme.lower(), host, port, is_v6, zone)


def redact_url(url: str) -> str:
    """``scheme://host:port`` of ``url``, for logs and reports.

    Userinfo, path, query and fragment may carry credentials, so they never appear; an
    unparseable URL is reported as ``<invalid url>`` rather than echoed.
    """
    authority = parse_authority(url)
    if authority is None:
        return "<invalid url>"
    port = authority.effective_port
    suffix = f":{port}" if port is not None else ""
    return f"{authority.scheme}://{authority.host_for_url}{suffix}"


def plaintext_allowed(url: str) -> tuple[bool, str | None]:
    """``(allowed, warning)`` for an app or listener URL under the ``ws://`` rule.

    ``warning`` is set for an accepted single-label host, to be logged once at start-up.
    """
    verdict = check_plaintext(url)
    return verdict.allowed, verdict.warning


def check_plaintext(url: str) -> PlaintextVerdict:
    """The rule with its reasons (docs/configuration.md, "The plaintext `ws://` rule")."""
    authority = parse_authority(url)
    if authority is None:
        scheme = url.partition("://")[0].lower()
        if scheme in _TLS_SCHEMES:
            return PlaintextVerdict(True)
        return PlaintextVerdict(False, reason="the URL cannot be parsed")
    if authority.scheme in _TLS_SCHEMES:
        return PlaintextVerdict(True)
    if authority.scheme not in _PLAINTEXT_SCHEMES:
        return PlaintextVerdict(False, reason=f"unsupported scheme {authority.scheme}://")
    if authority.is_ipv6_literal:
        return _check_ipv6(ipaddress.IPv6Address(authority.host), authority.zone)
    return _check_name_or_ipv4(authority.host, redact_url(url))


def _check_ipv6(address: ipaddress.IPv6Address, zone: str | None) -> PlaintextVerdict:
    if zone is not None:
        # A zone counts only on a link-local address; a public one stays public.
        if address in _LINK_LOCAL_V6:
            return PlaintextVerdict(True)
        return PlaintextVerdict(
            False, reason=f"a zone id is accepted only on a link-local address, not on {address}"
        )
    mapped = address.ipv4_mapped
    if mapped is not None:
        return _check_ipv4(mapped)
    if address == _LOOPBACK_V6 or address in _UNIQUE_LOCAL_V6 or address in _LINK_LOCAL_V6:
        return PlaintextVerdict(True)
    return PlaintextVerdict(False, reason=f"{address} is not a loopback or private address")


def _check_ipv4(address: ipaddress.IPv4Address) -> PlaintextVerdict:
    if any(address in net for net in _PRIVATE_V4):
        return PlaintextVerdict(True)
    return PlaintextVerdict(False, reason=f"{address} is not a loopback or private address")


def _check_name_or_ipv4(host: str, redacted: str) -> PlaintextVerdict:
    if not host.isascii():
        return PlaintextVerdict(False, reason=f"host {host!r} is not an ASCII host name")
    has_dot = "." in host
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if _ends_in_number(labels):
        v4 = _parse_legacy_ipv4(labels)
        if v4 is None:
            return PlaintextVerdict(False, reason=f"host {host!r} is not a valid IPv4 address")
        return _check_ipv4(v4)
    if len(name) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        return PlaintextVerdict(False, reason=f"host {host!r} is not a valid host name")
    if name == "localhost" or name.endswith(_PRIVATE_NAME_SUFFIXES):
        return PlaintextVerdict(True)
    if not has_dot:
        warning = (
            f"{redacted}: single-label host {host!r} accepted for ws://, but the resolver's "
            "search list can turn it into a public name; prefer its full .internal or .local name"
        )
        return PlaintextVerdict(True, warning=warning)
    return PlaintextVerdict(False, reason=f"{host!r} is not a loopback or private host name")


def _ends_in_number(labels: list[str]) -> bool:
    """WHATWG URL "ends in a number": the last label is decimal digits or ``0x`` hex."""
    last = labels[-1]
    return bool(_DECIMAL_RE.fullmatch(last) or _HEX_RE.fullmatch(last))


def _parse_legacy_ipv4(labels: list[str]) -> ipaddress.IPv4Address | None:
    """Decode 1 to 4 decimal, octal (leading 0) or hex (0x) parts the way ``inet_aton`` does."""
    if not 1 <= len(labels) <= 4:
        return None
    numbers: list[int] = []
    for label in labels:
        number = _parse_ipv4_number(label)
        if number is None:
            return None
        numbers.append(number)
    last = numbers.pop()
    if any(n > 255 for n in numbers) or last >= 256 ** (4 - len(numbers)):
        return None
    value = last
    for index, part in enumerate(numbers):
        value += part << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _parse_ipv4_number(label: str) -> int | None:
    if _HEX_RE.fullmatch(label):
        return int(label[2:], 16) if len(label) > 2 else 0
    if _OCTAL_RE.fullmatch(label):
        return int(label[1:], 8)
    if _DECIMAL_RE.fullmatch(label):
        return int(label, 10)
    return None
