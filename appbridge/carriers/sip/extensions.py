"""SIP extensions a request may require (RFC 3261 §8.2.2.3, §19.2, §20.32).

A request that names in ``Require`` an option tag this gateway does not implement must be
refused with 420 (Bad Extension), listing those tags in ``Unsupported``, so that the client can
retry without them. ACK and CANCEL are never refused for it (§8.2.2.3). The gateway implements
no option tags (no reliable provisional responses, RFC 3262; no session timers, RFC 4028): every
required tag is unsupported. Sans-I/O.
"""

from __future__ import annotations

from typing import Final

from appbridge.carriers.sip.headers import split_list
from appbridge.carriers.sip.message import Request

#: The option tags this gateway implements; none.
SUPPORTED_OPTIONS: Final[frozenset[str]] = frozenset()


def unsupported_required(request: Request) -> list[str]:
    """The option tags ``request`` requires that this gateway does not implement, in order."""
    if request.method in ("ACK", "CANCEL"):
        return []
    tags: list[str] = []
    for value in request.headers.get_all("Require"):
        for tag in split_list(value):
            tag = tag.strip()
            if tag and tag not in SUPPORTED_OPTIONS and tag not in tags:
                tags.append(tag)
    return tags
