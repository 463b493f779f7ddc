"""Requests between the nodes of a cluster, signed with ``[cluster] secret`` (docs/scaling.md,
"Requests between nodes").

The header :data:`AUTH_HEADER` is ``t=<unix seconds>,n=<node id>,s=<hex>`` where ``s`` is
HMAC-SHA256 (RFC 2104) over the method, the path, ``t`` and ``n``, one per line. A receiver
accepts it only within :data:`MAX_SKEW_S` of its own clock and compares in constant time, so a
captured request cannot be replayed after a minute nor sent to another path.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import Enum
from typing import Final

AUTH_HEADER: Final = "x-appbridge-cluster-auth"
MAX_SKEW_S: Final = 60.0


class AuthResult(Enum):
    OK = "ok"
    MISSING = "missing"  # no header, or not of the expected form: 401
    REFUSED = "refused"  # a bad signature or a stale timestamp: 403


def _mac(secret: str, method: str, path: str, stamp: str, node_id: str) -> str:
    message = f"{method.upper()}\n{path}\n{stamp}\n{node_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(secret: str, method: str, path: str, node_id: str, wall: float) -> str:
    """The header value for a request from ``node_id`` sent at ``wall`` (Unix seconds)."""
    stamp = str(int(wall))
    return f"t={stamp},n={node_id},s={_mac(secret, method, path, stamp, node_id)}"


def verify(secret: str, method: str, path: str, header: str | None, wall: float) -> AuthResult:
    """Whether ``header`` signs this request with ``secret`` within ±60 s of ``wall``."""
    if not header:
        return AuthResult.MISSING
    fields = dict(part.partition("=")[::2] for part in header.split(","))
    stamp, node_id, mac = fields.get("t", ""), fields.get("n", ""), fields.get("s", "")
    if not stamp.isdigit() or not node_id or not mac:
        return AuthResult.MISSING
    expected = _mac(secret, method, path, stamp, node_id)
    signature_ok = hmac.compare_digest(expected.encode(), mac.encode())
    fresh = abs(wall - int(stamp)) <= MAX_SKEW_S
    return AuthResult.OK if signature_ok and fresh else AuthResult.REFUSED


def sender_of(header: str | None) -> str:
    """The node id a (verified) header names, for the log."""
    for part in (header or "").split(","):
        name, _, value = part.partition("=")
        if name == "n":
            return value
    return ""
