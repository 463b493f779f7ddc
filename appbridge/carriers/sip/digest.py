"""HTTP digest authentication for SIP requests (RFC 3261 §22.4, RFC 2617, RFC 7616, RFC 8760).

Theory of operation
-------------------
An outbound INVITE through a trunk may be answered 401 (WWW-Authenticate) or 407
(Proxy-Authenticate). :meth:`DigestChallenge.from_response` reads the challenge (preferring
SHA-256 over MD5 when the server offers both, RFC 8760 §2.4), and :func:`authorization` computes
the credentials to put on the retried request, whose CSeq is one higher (§22.2):

    HA1 = H(username ":" realm ":" password)         ; "-sess": H(HA1 ":" nonce ":" cnonce)
    HA2 = H(method ":" digest-uri)                   ; "auth-int": H(method ":" uri ":" H(body))
    response = H(HA1 ":" nonce ":" nc ":" cnonce ":" qop ":" HA2)   ; without qop: H(HA1:nonce:HA2)

The digest-uri is the Request-URI as sent. ``nc`` counts requests made with one nonce; a new
challenge (new nonce) starts again at 1. Pure functions: the cnonce is random unless given (tests
pass the RFC's). Secrets are never part of a repr or an error message.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from appbridge.carriers.sip.auth_header import AuthHeader, format_auth
from appbridge.carriers.sip.headers import SipParseError
from appbridge.carriers.sip.message import Response

__all__ = ["DigestChallenge", "DigestError", "authorization", "digest_response"]


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_HASHES: dict[str, Callable[[bytes], str]] = {"MD5": _md5, "SHA-256": _sha256}
_PREFERENCE = ("SHA-256", "SHA-256-SESS", "MD5", "MD5-SESS")


class DigestError(ValueError):
    """A challenge this client cannot answer (unknown scheme or algorithm, no realm/nonce)."""


@dataclass(frozen=True, slots=True)
class DigestChallenge:
    """One ``Digest`` challenge (RFC 7616 §3.3). ``proxy`` when it came in a 407."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False
    userhash: bool = False
    proxy: bool = False

    @classmethod
    def parse(cls, value: str, *, proxy: bool = False) -> DigestChallenge:
        try:
            header = AuthHeader.parse(value)
        except SipParseError as exc:
            raise DigestError("malformed challenge") from exc
        if header.scheme.lower() != "digest":
            raise DigestError("not a Digest challenge")
        realm, nonce = header.get("realm"), header.get("nonce")
        if realm is None or nonce is None:
            raise DigestError("challenge without realm or nonce")
        algorithm = (header.get("algorithm") or "MD5").upper()
        if algorithm.removesuffix("-SESS") not in _HASHES:
            raise DigestError("unsupported digest algorithm")
        qop = tuple(q.strip().lower() for q in (header.get("qop") or "").split(",") if q.strip())
        return cls(
            realm=realm,
            nonce=nonce,
            algorithm=algorithm,
            qop=qop,
            opaque=header.get("opaque"),
            stale=(header.get("stale") or "").lower() == "true",
            userhash=(header.get("userhash") or "").lower() == "true",
            proxy=proxy,
        )

    @classmethod
    def from_response(cls, response: Response) -> DigestChallenge:
        """The best challenge of a 401 or 407 (several may be offered, RFC 7616 §3.7)."""
        proxy = response.status == 407
        name = "Proxy-Authenticate" if proxy else "WWW-Authenticate"
        usable: list[DigestChallenge] = []
        for value in response.headers.get_all(name):
            try:
                usable.append(cls.parse(value, proxy=proxy))
            except DigestError:
                continue
        if not usable:
            raise DigestError("no usable Digest challenge")
        return min(usable, key=lambda c: _PREFERENCE.index(c.algorithm))

    def __repr__(self) -> str:
        return f"DigestChallenge(realm={self.realm!r}, algorithm={self.algorithm!r})"


def digest_response(
    *,
    algorithm: str,
    username: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    qop: str | None,
    nc: str,
    cnonce: str,
    body: bytes = b"",
) -> str:
    """The ``response`` value (RFC 7616 §3.4.1, RFC 2617 §3.2.2.1)."""
    base = algorithm.upper().removesuffix("-SESS")
    h = _HASHES[base]

    def hd(text: str) -> str:
        return h(text.encode("utf-8"))

    ha1 = hd(f"{username}:{realm}:{password}")
    if algorithm.upper().endswith("-SESS"):
        ha1 = hd(f"{ha1}:{nonce}:{cnonce}")
    ha2 = hd(f"{method}:{uri}" + (f":{h(body)}" if qop == "auth-int" else ""))
    if qop:
        return hd(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return hd(f"{ha1}:{nonce}:{ha2}")


def authorization(
    challenge: DigestChallenge,
    *,
    username: str,
    password: str,
    method: str,
    uri: str,
    nc: int = 1,
    cnonce: str | None = None,
    body: bytes = b"",
) -> tuple[str, str]:
    """``(header name, value)`` answering ``challenge`` for a request with this method and
    Request-URI (Authorization for a 401, Proxy-Authorization for a 407, RFC 3261 §22.2-§22.3)."""
    qop = (
        "auth" if "auth" in challenge.qop else ("auth-int" if "auth-int" in challenge.qop else None)
    )
    cnonce = cnonce or secrets.token_hex(8)
    nc_text = f"{nc:08x}"
    shown_user = username
    if challenge.userhash:  # RFC 7616 §3.4.4
        h = _HASHES[challenge.algorithm.removesuffix("-SESS")]
        shown_user = h(f"{username}:{challenge.realm}".encode())
    response = digest_response(
        algorithm=challenge.algorithm,
        username=username,
        realm=challenge.realm,
        password=password,
        method=method,
        uri=uri,
        nonce=challenge.nonce,
        qop=qop,
        nc=nc_text,
        cnonce=cnonce,
        body=body,
    )
    params: list[tuple[str, str, bool]] = [
        ("username", shown_user, True),
        ("realm", challenge.realm, True),
        ("nonce", challenge.nonce, True),
        ("uri", uri, True),
        ("response", response, True),
        ("algorithm", challenge.algorithm, False),
    ]
    if challenge.opaque is not None:
        params.append(("opaque", challenge.opaque, True))
    if qop:
        params += [("qop", qop, False), ("nc", nc_text, False), ("cnonce", cnonce, True)]
    if challenge.userhash:
        params.append(("userhash", "true", False))
    name = "Proxy-Authorization" if challenge.proxy else "Authorization"
    return name, format_auth("Digest", params)
