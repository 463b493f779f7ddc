"""SDP, the Session Description Protocol (RFC 4566): the data model, parsing and serialising.

`SessionDescription.parse` reads any RFC 4566 body (CRLF or bare LF line ends, `type=value`
lines, the session part, then `m=` sections) into dataclasses; `serialize` writes the fields back
in the order of RFC 4566 section 5 with CRLF. Unknown line types and attributes are kept, so a
description survives a round trip. Malformed input raises `SdpError` (a `ValueError`) and nothing
else: the SIP layer answers 400 (docs/sip.md).

The audio codecs we can run are described here too, as RTP carries them: PCMU/0, PCMA/8 and
G722/9 (RTP clock 8000 Hz for 16 kHz audio, RFC 3551 section 4.5.2), at ptime 20 (RFC 4566
section 6). G.722 is offered and accepted only when the codec is installed (`default_codecs`).
What we send and accept in an exchange is :mod:`appbridge.carriers.sip.offer_answer` (RFC 3264).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final, Literal

from appbridge.carriers.sip.sdes import redact_sdp
from appbridge.media import g722

__all__ = [
    "CODECS",
    "G722",
    "PCMA",
    "PCMU",
    "Attribute",
    "Codec",
    "Connection",
    "Direction",
    "MediaDescription",
    "Origin",
    "SdpError",
    "SessionDescription",
    "default_codecs",
]

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
DIRECTIONS: Final[tuple[Direction, ...]] = ("sendrecv", "sendonly", "recvonly", "inactive")
_MAX_SDP_BYTES: Final = 64 * 1024
PTIME_MS: Final = 20


class SdpError(ValueError):
    """The body is not valid SDP (RFC 4566)."""


@dataclass(frozen=True, slots=True)
class Codec:
    """An audio codec as RTP carries it. `rtp_clock_hz` is the timestamp rate; `audio_rate_hz`
    the sampling rate of the audio itself (they differ for G.722)."""

    name: str
    payload_type: int
    rtp_clock_hz: int
    audio_rate_hz: int

    @property
    def frame_units(self) -> int:
        """RTP timestamp units per 20 ms packet."""
        return self.rtp_clock_hz * PTIME_MS // 1000


PCMU: Final = Codec("PCMU", 0, 8000, 8000)
PCMA: Final = Codec("PCMA", 8, 8000, 8000)
G722: Final = Codec("G722", 9, 8000, 16000)
CODECS: Final[dict[str, Codec]] = {c.name: c for c in (PCMU, PCMA, G722)}
# The static payload type assignments of RFC 3551 section 6, for formats without an rtpmap.
STATIC_PAYLOAD_TYPES: Final[dict[int, Codec]] = {c.payload_type: c for c in (PCMU, PCMA, G722)}


def default_codecs() -> tuple[str, ...]:
    """Our preference order: wideband first when the G.722 codec is installed."""
    return ("G722", "PCMU", "PCMA") if g722.AVAILABLE else ("PCMU", "PCMA")


# -- RFC 4566 data model -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Origin:
    username: str
    session_id: str
    session_version: int
    net_type: str = "IN"
    addr_type: str = "IP4"
    address: str = "0.0.0.0"

    def __str__(self) -> str:
        return (
            f"{self.username} {self.session_id} {self.session_version} "
            f"{self.net_type} {self.addr_type} {self.address}"
        )


@dataclass(frozen=True, slots=True)
class Connection:
    net_type: str
    addr_type: str
    address: str

    def __str__(self) -> str:
        return f"{self.net_type} {self.addr_type} {self.address}"

    @property
    def is_hold_address(self) -> bool:
        """c=0.0.0.0: the RFC 2543 way of putting a call on hold (RFC 3264 section 8.4)."""
        return self.address == "0.0.0.0"


@dataclass(frozen=True, slots=True, repr=False)
class Attribute:
    name: str
    value: str | None = None

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}:{self.value}"

    def __repr__(self) -> str:
        """No SRTP key in a repr (RFC 4568 §8: the keys are secrets): ``inline:`` blanked."""
        value = None if self.value is None else redact_sdp(self.value)
        return f"Attribute(name={self.name!r}, value={value!r})"


@dataclass(slots=True)
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: list[str]
    port_count: int | None = None
    info: str | None = None
    connection: Connection | None = None
    bandwidths: list[str] = field(default_factory=list)
    key: str | None = None
    attributes: list[Attribute] = field(default_factory=list)

    def attribute_values(self, name: str) -> list[str]:
        return [a.value or "" for a in self.attributes if a.name == name]

    def has_attribute(self, name: str) -> bool:
        return any(a.name == name for a in self.attributes)

    def rtpmap(self) -> dict[int, tuple[str, int, int]]:
        """Payload type to (encoding name, clock rate, channels) from a=rtpmap (section 6)."""
        out: dict[int, tuple[str, int, int]] = {}
        for value in self.attribute_values("rtpmap"):
            pt_text, _, spec = value.partition(" ")
            parts = spec.strip().split("/")
            try:
                pt = int(pt_text)
                rate = int(parts[1]) if len(parts) > 1 else 0
                channels = int(parts[2]) if len(parts) > 2 else 1
            except ValueError:
                continue  # a broken rtpmap line only loses that format
            if parts[0]:
                out[pt] = (parts[0], rate, channels)
        return out

    def fmtp(self, payload_type: int) -> str | None:
        prefix = f"{payload_type} "
        for value in self.attribute_values("fmtp"):
            if value.startswith(prefix):
                return value[len(prefix) :].strip()
        return None

    def direction(self, default: Direction = "sendrecv") -> Direction:
        for a in self.attributes:
            if a.name in DIRECTIONS:
                return a.name
        return default

    def ptime_ms(self) -> int | None:
        for value in self.attribute_values("ptime"):
            try:
                return int(float(value))
            except (ValueError, OverflowError):
                return None
        return None

    def lines(self) -> list[str]:
        count = f"/{self.port_count}" if self.port_count is not None else ""
        out = [f"m={self.media} {self.port}{count} {self.proto} {' '.join(self.formats)}"]
        if self.info is not None:
            out.append(f"i={self.info}")
        if self.connection is not None:
            out.append(f"c={self.connection}")
        out.extend(f"b={b}" for b in self.bandwidths)
        if self.key is not None:
            out.append(f"k={self.key}")
        out.extend(f"a={a}" for a in self.attributes)
        return out


# Session-level line types in their RFC 4566 section 5 order, for serialization.
_SESSION_ORDER: Final = "vosiuepcbtrzkam"


@dataclass(slots=True)
class SessionDescription:
    origin: Origin
    session_name: str = "-"
    connection: Connection | None = None
    times: list[str] = field(default_factory=lambda: ["0 0"])
    attributes: list[Attribute] = field(default_factory=list)
    media: list[MediaDescription] = field(default_factory=list)
    bandwidths: list[str] = field(default_factory=list)
    #: Other session-level lines (i, u, e, p, r, z, k), kept in order as (type, value).
    other: list[tuple[str, str]] = field(default_factory=list)
    version: int = 0

    def direction(self) -> Direction:
        for a in self.attributes:
            if a.name in DIRECTIONS:
                return a.name
        return "sendrecv"

    # -- parse -------------------------------------------------------------------------

    @classmethod
    def parse(cls, body: bytes | str) -> SessionDescription:
        """Parses an SDP body; raises `SdpError` for anything malformed."""
        if isinstance(body, bytes):
            if len(body) > _MAX_SDP_BYTES:
                raise SdpError("SDP body too large")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SdpError("SDP is not UTF-8") from exc
        else:
            text = body
            if len(text) > _MAX_SDP_BYTES:
                raise SdpError("SDP body too large")
        lines = [ln.rstrip("\r") for ln in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        if not lines or not lines[0].startswith("v="):
            raise SdpError("SDP must start with v=")
        if lines[0] != "v=0":
            raise SdpError(f"unsupported SDP version {lines[0]!r}")
        origin: Origin | None = None
        session = cls(origin=Origin("-", "0", 0))
        session.times = []
        current: MediaDescription | None = None
        for line in lines[1:]:
            if len(line) < 2 or line[1] != "=" or not line[0].isalpha():
                raise SdpError(f"malformed SDP line {line[:40]!r}")
            kind, value = line[0], line[2:]
            if kind == "m":
                current = _parse_media(value)
                session.media.append(current)
            elif current is not None:
                _media_line(current, kind, value)
            elif kind == "o":
                if origin is not None:
                    raise SdpError("more than one o= line")
                origin = _parse_origin(value)
            elif kind == "s":
                session.session_name = value
            elif kind == "c":
                session.connection = _parse_connection(value)
            elif kind == "t":
                session.times.append(value)
            elif kind == "b":
                session.bandwidths.append(value)
            elif kind == "a":
                session.attributes.append(_parse_attribute(value))
            elif kind == "v":
                raise SdpError("v= may only be the first line")
            else:
                session.other.append((kind, value))
        if origin is None:
            raise SdpError("SDP has no o= line (RFC 4566 section 5.2)")
        session.origin = origin
        if not session.times:
            session.times = ["0 0"]
        return session

    # -- serialize ---------------------------------------------------------------------

    def serialize(self) -> bytes:
        out = [f"v={self.version}", f"o={self.origin}", f"s={self.session_name or '-'}"]
        for kind in "iuep":
            out.extend(f"{k}={v}" for k, v in self.other if k == kind)
        if self.connection is not None:
            out.append(f"c={self.connection}")
        out.extend(f"b={b}" for b in self.bandwidths)
        for t in self.times:
            out.append(f"t={t}")
            out.extend(f"r={v}" for k, v in self.other if k == "r")
        for kind, value in self.other:
            if kind not in "iuepr":
                out.append(f"{kind}={value}")
        out.extend(f"a={a}" for a in self.attributes)
        for m in self.media:
            out.extend(m.lines())
        return ("\r\n".join(out) + "\r\n").encode()

    def body_without_origin(self) -> bytes:
        """The description minus its o= version, to tell whether anything changed."""
        return replace(self, origin=replace(self.origin, session_version=0)).serialize()


def _parse_origin(value: str) -> Origin:
    parts = value.split()
    if len(parts) != 6:
        raise SdpError("o= needs six fields")
    try:
        version = int(parts[2])
    except ValueError as exc:
        raise SdpError("o= session version is not a number") from exc
    if not parts[1].isdigit() or version < 0:
        raise SdpError("o= session id and version are numbers")
    return Origin(parts[0], parts[1], version, parts[3], parts[4], parts[5])


def _parse_connection(value: str) -> Connection:
    parts = value.split()
    if len(parts) != 3:
        raise SdpError("c= needs three fields")
    address = parts[2].split("/")[0]  # multicast TTL / count suffixes are not ours to use
    if not address:
        raise SdpError("c= has an empty address")
    return Connection(parts[0], parts[1], address)


def _parse_attribute(value: str) -> Attribute:
    name, sep, rest = value.partition(":")
    if not name:
        raise SdpError("a= with an empty name")
    return Attribute(name, rest if sep else None)


def _parse_media(value: str) -> MediaDescription:
    parts = value.split()
    if len(parts) < 3:
        raise SdpError("m= needs media, port and proto")
    port_text, _, count_text = parts[1].partition("/")
    try:
        port = int(port_text)
        count = int(count_text) if count_text else None
    except ValueError as exc:
        raise SdpError("m= port is not a number") from exc
    if not 0 <= port <= 65535 or (count is not None and count < 1):
        raise SdpError("m= port out of range")
    return MediaDescription(parts[0], port, parts[2], parts[3:], count)


def _media_line(m: MediaDescription, kind: str, value: str) -> None:
    if kind == "c":
        m.connection = _parse_connection(value)
    elif kind == "a":
        m.attributes.append(_parse_attribute(value))
    elif kind == "b":
        m.bandwidths.append(value)
    elif kind == "i":
        m.info = value
    elif kind == "k":
        m.key = value
    else:
        raise SdpError(f"{kind}= is not allowed in a media section")
