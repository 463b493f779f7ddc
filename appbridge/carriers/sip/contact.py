"""How the gateway names itself in a dialog: its Contact and the top Via of its requests, per
transport (RFC 3261 §8.1.1.7, §19.1.4, §20.42; RFC 5630 for ``sips:``; RFC 5923 ``alias``).

A peer reached over UDP gets a plain ``sip:`` Contact; over TCP and TLS the Contact carries
``;transport=tcp`` or ``;transport=tls`` so requests in the dialog come back over the same kind
of connection (docs/sip.md, "TLS and SRTP trunks"). When a peer's request used a ``sips:``
URI over TLS, our Contact is ``sips:`` too: RFC 5630 §3.1.3 asks that the whole dialog stays on
TLS, and a ``sips:`` URI says so without the deprecated ``;transport=tls`` parameter.
"""

from __future__ import annotations

from appbridge.carriers.sip.headers import NameAddr, SipUri
from appbridge.carriers.sip.message import Request, new_branch

__all__ = ["contact_for", "transport_params", "via_for"]

Params = tuple[tuple[str, str | None], ...]


def transport_params(kind: str) -> Params:
    """``;transport=`` for a URI that must be reached over ``kind``; none for UDP, the default
    (RFC 3261 §19.1.2)."""
    return (("transport", kind),) if kind != "udp" else ()


def contact_for(host: str, kind: str, port: int, request: Request | None = None) -> NameAddr:
    """Our Contact for a dialog over ``kind`` ("udp", "tcp" or "tls"); ``request`` is the
    peer's dialog-creating request when we are the UAS (module doc)."""
    if kind == "tls" and request is not None and request.uri.scheme == "sips":
        return NameAddr(uri=SipUri(scheme="sips", user="appbridge", host=host, port=port))
    params = transport_params(kind)
    return NameAddr(uri=SipUri(scheme="sip", user="appbridge", host=host, port=port, params=params))


def via_for(kind: str, host: str, port: int, branch: str | None = None) -> str:
    """The top Via of a request we send over ``kind``: always ``rport`` (RFC 3581 §3), and
    ``alias`` on TLS so the trunk may send its own requests back on our connection (RFC 5923
    §5: we verified its certificate when we opened it)."""
    value = f"SIP/2.0/{kind.upper()} {host}:{port};branch={branch or new_branch()};rport"
    return value + ";alias" if kind == "tls" else value
