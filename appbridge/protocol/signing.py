"""Request signatures: the gateway's own (``X-Fonoster-*``) and Twilio's (``X-Twilio-Signature``).

Fonoster (docs/protocol-session-v1.md, "Connection and frames"): every connection the gateway opens
to an app or a listener carries ``X-Fonoster-Timestamp`` (Unix seconds) and
``X-Fonoster-Signature``, the lowercase hex HMAC-SHA256 of ``<timestamp>.<url>`` keyed with the
app's signing secret, where ``<url>`` is the URL exactly as configured, query included. A receiver
rejects a mismatch or a timestamp more than 300 s from its clock. The timestamp is inside the MAC,
so a captured request cannot be replayed after the window.

Twilio (docs/protocol-twilio.md, "`X-Twilio-Signature`"): base64 HMAC-SHA1, keyed with the auth
token, of the full URL followed by every form parameter as name then value, names sorted and each
name's values sorted. Validators also accept the URL with the default port added or removed, because
Twilio signs inconsistently. The WebSocket upgrade is signed with empty params; a JSON body is
signed with empty params and its SHA-256 travels in the ``bodySHA256`` query parameter.

Every comparison goes through :func:`hmac.compare_digest`, so timing does not leak how many
leading characters of a forged signature were right. Pure functions: the clock is an argument.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = [
    "FONOSTER_SIGNATURE_HEADER",
    "FONOSTER_TIMESTAMP_HEADER",
    "FONOSTER_TOLERANCE_S",
    "TWILIO_SIGNATURE_HEADER",
    "fonoster_headers",
    "fonoster_signature",
    "twilio_body_hash_matches",
    "twilio_signature",
    "twilio_url_variants",
    "verify_fonoster",
    "verify_twilio",
]

FONOSTER_TIMESTAMP_HEADER = "X-Fonoster-Timestamp"
FONOSTER_SIGNATURE_HEADER = "X-Fonoster-Signature"
TWILIO_SIGNATURE_HEADER = "X-Twilio-Signature"
FONOSTER_TOLERANCE_S = 300
"""Reject a timestamp more than 300 seconds from the receiver's clock."""

# Unix seconds as plain ASCII digits: no sign, no spaces, no underscores (which int() would take).
_TIMESTAMP_RE = re.compile(r"[0-9]{1,15}")
_DEFAULT_PORTS = {"https": 443, "wss": 443, "http": 80, "ws": 80}

TwilioParams = Mapping[str, str | Sequence[str]]


def fonoster_signature(secret: str, url: str, timestamp: int) -> str:
    """Lowercase hex HMAC-SHA256 of ``f"{timestamp}.{url}"`` keyed with ``secret``."""
    message = f"{timestamp}.{url}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def fonoster_headers(secret: str, url: str, timestamp: int) -> dict[str, str]:
    """The two headers the gateway sends when it dials ``url`` (an app or a listener)."""
    return {
        FONOSTER_TIMESTAMP_HEADER: str(timestamp),
        FONOSTER_SIGNATURE_HEADER: fonoster_signature(secret, url, timestamp),
    }


def verify_fonoster(
    secrets: str | Sequence[str],
    url: str,
    timestamp_header: str | None,
    signature_header: str | None,
    now_s: float,
    tolerance_s: int = FONOSTER_TOLERANCE_S,
) -> bool:
    """Check a signed connection request the way docs/protocol-session-v1.md tells apps to.

    ``secrets`` may list several secrets (an app that accepts both sides of a rotation); every
    one is tried, without stopping at the first match, so the time taken does not tell which
    matched. A missing, non-numeric or stale timestamp fails before any MAC is computed: that
    branch depends only on public data.
    """
    if timestamp_header is None or signature_header is None:
        return False
    if not _TIMESTAMP_RE.fullmatch(timestamp_header):
        return False
    timestamp = int(timestamp_header)
    if abs(now_s - timestamp) > tolerance_s:
        return False
    candidate = signature_header.strip().lower().encode("utf-8", "replace")
    secret_list = [secrets] if isinstance(secrets, str) else list(secrets)
    matched = False
    for secret in secret_list:
        expected = fonoster_signature(secret, url, timestamp).encode()
        matched |= hmac.compare_digest(expected, candidate)
    return matched


def twilio_signature(auth_token: str, url: str, params: TwilioParams | None) -> str:
    """Base64 HMAC-SHA1 of the URL plus the sorted form parameters."""
    pieces = [url]
    for name in sorted(params or {}):
        value = (params or {})[name]
        values = [value] if isinstance(value, str) else sorted(value)
        pieces.extend(f"{name}{item}" for item in values)
    digest = hmac.new(auth_token.encode(), "".join(pieces).encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def twilio_url_variants(url: str) -> list[str]:
    """``url`` as given, then with its scheme's default port removed or added.

    Twilio sometimes signs ``https://host:443/path`` and sometimes ``https://host/path`` for the
    same request, so validators try both (docs/protocol-twilio.md). A non-default port is kept as
    is.
    """
    variants = [url]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return variants
    default = _DEFAULT_PORTS.get(parts.scheme.lower())
    if default is None or not parts.hostname:
        return variants
    userinfo, at, hostport = parts.netloc.rpartition("@")
    prefix = f"{userinfo}{at}"
    if port is None:
        other_netloc = f"{prefix}{hostport}:{default}"
    elif port == default:
        other_netloc = f"{prefix}{hostport.rpartition(':')[0]}"
    else:
        return variants
    variants.append(urlunsplit(parts._replace(netloc=other_netloc)))
    return variants


def verify_twilio(
    auth_token: str, url: str, params: TwilioParams | None, signature: str | None
) -> bool:
    """Constant-time check of ``X-Twilio-Signature`` over ``url`` (either port form) and params."""
    if not signature:
        return False
    candidate = signature.strip().encode("utf-8", "replace")
    matched = False
    for variant in twilio_url_variants(url):
        expected = twilio_signature(auth_token, variant, params).encode()
        matched |= hmac.compare_digest(expected, candidate)
    return matched


def twilio_body_hash_matches(url: str, body: bytes) -> bool:
    """For a JSON body: the URL's ``bodySHA256`` query parameter is the body's SHA-256 (hex).

    Twilio signs such a request with empty params, so :func:`verify_twilio` covers the URL (and
    the hash in it) and this check ties the body to that URL.
    """
    values = parse_qs(urlsplit(url).query, keep_blank_values=True).get("bodySHA256", [])
    if len(values) != 1:
        return False
    expected = hashlib.sha256(body).hexdigest().encode()
    return hmac.compare_digest(expected, values[0].strip().lower().encode("utf-8", "replace"))
