"""Caller and callee numbers of a SIP call, sanitised (docs/sip.md, "Inbound calls").

Theory of operation
-------------------
``session.start`` carries ``from`` and ``to``: the user parts of the INVITE's From header and of
its Request-URI, as sent, E.164 or not. The user part of a SIP URI is free text
the caller chose, so a value is passed on only when, after its ``%HH`` escapes are decoded once
(RFC 3261 §19.1.2; carriers send ``#`` as ``%23``), it is 1 to 64 characters of
``0-9 A-Z a-z + * # . _ -``; otherwise there is no number (``None``), never a cleaned-up guess.

A ``tel:`` URI (RFC 3966) gives its number. With ``user=phone`` (RFC 3261 §19.1.6) the user
part is a telephone-subscriber whose own parameters (``;npdi``, ``;rn=...``, ``;isub=...``)
follow a ``;``: the number is what comes before. A URI without a user part gives no number.
"""

from __future__ import annotations

import re

from appbridge.carriers.sip.headers import NameAddr, SipParseError, SipUri
from appbridge.carriers.sip.message import Request

MAX_NUMBER_CHARS = 64
_ALLOWED_RE = re.compile(rf"[0-9A-Za-z+*#._\-]{{1,{MAX_NUMBER_CHARS}}}")


def sanitize_user_part(user: str | None) -> str | None:
    """``user`` when it is made only of the allowed characters and short enough, else None."""
    if user is None or _ALLOWED_RE.fullmatch(user) is None:
        return None
    return user


def number_from_uri(uri: SipUri) -> str | None:
    """The sanitised number or user of a sip:, sips: or tel: URI."""
    if uri.scheme == "tel":
        return sanitize_user_part(uri.user)
    if not uri.is_sip:
        return None
    user = uri.user_unescaped
    if user is not None and (uri.param("user") or "").lower() == "phone":
        user = user.split(";", 1)[0]
    return sanitize_user_part(user)


def caller_number(invite: Request) -> str | None:
    """``from`` of session.start: the From header's user part."""
    try:
        return number_from_uri(invite.from_.uri)
    except SipParseError:
        return None


def called_number(invite: Request) -> str | None:
    """``to`` of session.start and the routing key: the Request-URI's user part."""
    return number_from_uri(invite.uri)


def to_header_number(request: Request) -> str | None:
    """The To header's user part (``session.start``'s ``to`` comes from the Request-URI instead)."""
    try:
        return number_from_uri(request.to.uri)
    except SipParseError:
        return None


def from_address_number(value: str) -> str | None:
    """The number of an address given as text (a Referred-By, a P-Asserted-Identity)."""
    try:
        return number_from_uri(NameAddr.parse(value).uri)
    except SipParseError:
        return None
