"""SDES keys for SRTP: the SDP ``a=crypto`` attribute (RFC 4568) and which line a call uses.

Grammar (RFC 4568 §9.1, SRTP key parameters of §6.1)::

    a=crypto:<tag> <crypto-suite> inline:<base64 master key||salt>[|<lifetime>][|<MKI>:<len>]
             [<session-param> ...]

`parse_crypto` reads one attribute value and raises `SdesError` for anything this gateway cannot
use; `usable_crypto` keeps the usable lines of a media section, in their order (the offerer's
preference, RFC 4568 §7.1.1), and skips the others, so one line we cannot honour never fails a
call that has a usable one. Usable means (docs/sip.md, "SRTP (SDES)"):

- suite ``AES_CM_128_HMAC_SHA1_80`` or ``AES_CM_128_HMAC_SHA1_32`` (RFC 4568 §6.2);
- exactly one ``inline:`` key of 30 bytes (16-byte master key, 14-byte salt) in base64;
- no MKI (libsrtp is driven with one master key per direction) and a lifetime, when given, of
  at least 2^31 packets: a call never reaches it, so no rekeying is needed to honour it;
- no session parameters but ``WSH`` (a replay window hint, RFC 4568 §6.3.6):
  ``UNENCRYPTED_SRTP``, ``KDR`` and the rest are refused.

Which line a call uses, per ``srtp`` policy (the table in docs/sip.md, "SRTP (SDES)"):
`answer_choice` when we answer, `offer_profile`/`offer_lines` and `answered_line` when we offer.
A refusal raises `SrtpRefused`, whose text goes into the 488's Warning (RFC 3261 §20.43).

`SrtpKeys` is what one offer/answer agreed: the suite and tag, the key we protect our packets
with and the peer's key for theirs. Keys never appear in a repr, and `redact_sdp` blanks the
``inline:`` values of a body before it reaches a log.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "KEY_SALT_BYTES",
    "SUITES",
    "CryptoLine",
    "SdesError",
    "SrtpKeys",
    "SrtpPolicy",
    "SrtpRefused",
    "answer_choice",
    "answered_line",
    "new_key",
    "offer_lines",
    "offer_profile",
    "parse_crypto",
    "redact_sdp",
    "usable_crypto",
]

#: The suites we run, in the order we offer them (RFC 4568 §6.2.1 and §6.2.2).
SUITES: Final[tuple[str, ...]] = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
#: Master key (128 bits) and master salt (112 bits), RFC 3711 §4.3 and RFC 4568 §6.2.1.
KEY_SALT_BYTES: Final = 30
#: The shortest key lifetime we accept: 2^31 packets (RFC 4568 §6.1; about 1.3 years at 50 pps).
MIN_LIFETIME: Final = 1 << 31
#: The longest one a suite allows (RFC 4568 §6.2.1: 2^48 SRTP packets).
MAX_LIFETIME: Final = 1 << 48
_TAG_RE: Final = re.compile(r"[0-9]{1,9}")
_LIFETIME_RE: Final = re.compile(r"(2\^)?([0-9]{1,15})")
_INLINE_RE: Final = re.compile(r"(inline:)[^\s;|]+", re.IGNORECASE)

#: Per call: a trunk's ``srtp`` key (docs/configuration.md), or ``follow`` for calls with no
#: trunk (loopback), which use SRTP exactly when the offer's profile is RTP/SAVP.
SrtpPolicy = Literal["off", "optional", "required", "follow"]


class SdesError(ValueError):
    """An ``a=crypto`` line this gateway cannot use; the message says why (no key in it)."""


class SrtpRefused(ValueError):
    """The call's ``srtp`` policy refuses this description; the message says why."""


@dataclass(frozen=True, slots=True)
class CryptoLine:
    """One usable ``a=crypto`` line: its tag, suite and master key||salt (never in a repr)."""

    tag: int
    suite: str
    key: bytes = field(repr=False)

    def value(self) -> str:
        """The attribute value as we send it (no lifetime, no MKI: the defaults)."""
        inline = base64.b64encode(self.key).decode("ascii")
        return f"{self.tag} {self.suite} inline:{inline}"


@dataclass(frozen=True, slots=True)
class SrtpKeys:
    """The SRTP of one offer/answer (RFC 4568 §6.1): `send_key` protects what we send (it is
    in our description), `receive_key` checks what the peer sends (in theirs)."""

    suite: str
    tag: int
    send_key: bytes = field(repr=False)
    receive_key: bytes = field(repr=False)


def new_key() -> bytes:
    """A fresh master key and salt from the system's CSPRNG (RFC 4568 §6.1, RFC 3711 §4.3)."""
    return secrets.token_bytes(KEY_SALT_BYTES)


def _lifetime(text: str) -> int:
    match = _LIFETIME_RE.fullmatch(text)
    if match is None:
        raise SdesError("a malformed key lifetime")
    number = int(match.group(2))
    if match.group(1):
        if number > 48:
            raise SdesError("a key lifetime over 2^48")
        return 1 << number
    return number


def _key_info(info: str) -> bytes:
    """``<base64>[|lifetime][|MKI:length]`` (RFC 4568 §6.1) to the 30-byte key and salt."""
    b64, *params = info.split("|")
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SdesError("the inline key is not base64") from exc
    if len(key) != KEY_SALT_BYTES:
        raise SdesError(f"the inline key has {len(key)} bytes, not {KEY_SALT_BYTES}")
    if len(params) > 2:
        raise SdesError("too many key parameters")
    for param in params:
        if ":" in param:
            raise SdesError("an MKI, which this gateway does not use")
        lifetime = _lifetime(param)
        if lifetime < MIN_LIFETIME or lifetime > MAX_LIFETIME:
            raise SdesError("a key lifetime outside 2^31..2^48 packets")
    return key


def parse_crypto(value: str) -> CryptoLine:
    """One ``a=crypto`` value (RFC 4568 §9.1); raises `SdesError` when we cannot use it."""
    parts = value.split()
    if len(parts) < 3:
        raise SdesError("a crypto line needs a tag, a suite and key parameters")
    tag_text, suite, key_params, *session_params = parts
    if _TAG_RE.fullmatch(tag_text) is None:
        raise SdesError("the tag is not 1 to 9 digits")
    if suite not in SUITES:
        raise SdesError(f"the suite {suite[:40]!r} is not supported")
    keys = key_params.split(";")
    if len(keys) != 1:
        raise SdesError("more than one key (keys with MKIs)")
    method, sep, info = keys[0].partition(":")
    if not sep or method.lower() != "inline":
        raise SdesError("the key method is not inline")
    key = _key_info(info)
    for param in session_params:
        if not param.upper().startswith("WSH="):
            raise SdesError(f"the session parameter {param.split('=')[0][:24]!r}")
    return CryptoLine(int(tag_text), suite, key)


def usable_crypto(values: list[str]) -> list[CryptoLine]:
    """The usable lines among a media section's ``a=crypto`` values, first tag wins (tags are
    unique in a media section, RFC 4568 §9.1)."""
    out: list[CryptoLine] = []
    tags: set[int] = set()
    for value in values:
        try:
            line = parse_crypto(value)
        except SdesError:
            continue
        if line.tag not in tags:
            tags.add(line.tag)
            out.append(line)
    return out


def redact_sdp(body: bytes | str) -> str:
    """An SDP body fit for a log: every ``inline:`` key blanked (docs/sip.md, "SRTP (SDES)")."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return _INLINE_RE.sub(r"\1<redacted>", text)


SAVP: Final = "RTP/SAVP"
AVP: Final = "RTP/AVP"


def answer_choice(policy: SrtpPolicy, proto: str, lines: list[CryptoLine]) -> CryptoLine | None:
    """The offered line we answer with (SRTP), None for plain RTP, or `SrtpRefused`.

    An RTP/SAVP offer needs a usable line whatever the policy but ``off``, which refuses it
    rather than run SRTP the operator turned off (an RTP/AVP answer to it would be invalid,
    RFC 3264 §6). An RTP/AVP offer with crypto lines is best-effort SRTP, common practice
    beyond RFC 4568 (which defines the attribute for RTP/SAVP): ``optional`` and ``required``
    take it, ``off`` and ``follow`` answer plain RTP and the offerer falls back to it.
    """
    savp = proto == SAVP
    if policy == "off":
        if savp:
            raise SrtpRefused("SRTP is off for this trunk")
        return None
    if savp or policy in ("optional", "required"):
        if lines:
            return lines[0]
        if savp:
            raise SrtpRefused("no usable a=crypto line (AES_CM_128_HMAC_SHA1_80/32 via SDES)")
    if policy == "required":
        raise SrtpRefused("SRTP is required on this trunk: RTP/SAVP with a=crypto")
    return None


def offer_profile(policy: SrtpPolicy) -> str:
    """``required`` offers RTP/SAVP; ``optional`` RTP/AVP with crypto lines (best-effort SRTP,
    which a peer without SRTP still answers), the rest plain RTP/AVP."""
    return SAVP if policy == "required" else AVP


def offer_lines(policy: SrtpPolicy) -> list[CryptoLine]:
    """The crypto lines of a new offer: both suites, each with a fresh key (RFC 4568 §7.1.1)."""
    if policy not in ("optional", "required"):
        return []
    return [CryptoLine(tag, suite, new_key()) for tag, suite in enumerate(SUITES, 1)]


def answered_line(
    policy: SrtpPolicy, proto: str, values: list[str], offered: list[CryptoLine]
) -> tuple[CryptoLine, CryptoLine] | None:
    """(our offered line, the peer's answer line) when the answer to our offer takes SRTP,
    None for plain RTP; `SrtpRefused` when ``required`` got no SRTP, or the answer's crypto is
    none we offered (RFC 4568 §7.1.2: the answer echoes one offered tag and its suite)."""
    if not offered:
        return None
    by_tag = {line.tag: line for line in offered}
    for line in usable_crypto(values):
        ours = by_tag.get(line.tag)
        if ours is not None and ours.suite == line.suite:
            return ours, line
    if values:
        raise SrtpRefused("the answer's a=crypto matches none of the offered lines")
    if policy == "required" or proto == SAVP:
        raise SrtpRefused("SRTP is required and the answer has no a=crypto")
    return None
