"""Checking that a connection really comes from the gateway (docs/protocol-session-v1.md,
"Connection and frames").

Every connection request carries ``X-Fonoster-Timestamp`` (Unix seconds) and
``X-Fonoster-Signature``, the lowercase hex HMAC-SHA256 of ``<timestamp>.<url>`` keyed with the
app's signing secret, where ``<url>`` is the app's URL exactly as configured at the gateway, query
string included. The app refuses a mismatch, or a timestamp more than 300 s from its clock.

The MAC and the comparison are :func:`appbridge.protocol.signing.verify_fonoster`'s (constant
time, every secret tried, so a list of secrets rotates without a gap). What this module adds is
*which URL* to check: the one the gateway signed.

- With ``public_url`` set (recommended, and needed behind a reverse proxy that rewrites the
  path or terminates TLS) the signature must cover exactly that URL.
- Without it, the URL is rebuilt from the request: ``ws://`` (``wss://`` when the server itself
  speaks TLS), the ``Host`` header, then the path and query as requested. That matches what the
  gateway signs when it dials the app directly, as on a developer machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from appbridge.protocol.signing import (
    FONOSTER_SIGNATURE_HEADER,
    FONOSTER_TIMESTAMP_HEADER,
    FONOSTER_TOLERANCE_S,
    verify_fonoster,
)

__all__ = ["Verifier", "request_url"]


def request_url(scheme: str, host: str | None, path_and_query: str) -> str:
    """The URL a direct connection was made to: ``scheme://host/path?query``."""
    return f"{scheme}://{host or ''}{path_and_query}"


class Verifier:
    """Decides whether a connection request is signed by the gateway.

    ``secrets`` is one secret or a list (rotation: deploy the new one next to the old one, then
    drop the old). ``None`` turns verification off, which is only sensible for an app the
    gateway dials on loopback without a secret (the embedded demo); every request is accepted.
    """

    def __init__(
        self,
        secrets: str | Sequence[str] | None,
        *,
        public_url: str | None = None,
        tolerance_s: int = FONOSTER_TOLERANCE_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if secrets is not None:
            listed = [secrets] if isinstance(secrets, str) else list(secrets)
            if not listed or any(not s for s in listed):
                raise ValueError("secrets must be non-empty strings (or None to not verify)")
            self._secrets: list[str] | None = listed
        else:
            self._secrets = None
        self.public_url = public_url
        self.tolerance_s = tolerance_s
        self._wall_clock = wall_clock

    @property
    def enabled(self) -> bool:
        return self._secrets is not None

    def url_for(self, requested_url: str) -> str:
        """The URL whose signature is checked: ``public_url`` if set, else the requested one."""
        return self.public_url if self.public_url is not None else requested_url

    def check(self, requested_url: str, headers: Mapping[str, str]) -> str | None:
        """``None`` when the request may proceed, else a short reason to refuse it with 401.

        ``headers`` must look names up case-insensitively (both websockets' and Starlette's
        header maps do). The reason never says which part of the signature was wrong.
        """
        if self._secrets is None:
            return None
        timestamp = headers.get(FONOSTER_TIMESTAMP_HEADER)
        signature = headers.get(FONOSTER_SIGNATURE_HEADER)
        if timestamp is None or signature is None:
            return "missing signing headers"
        ok = verify_fonoster(
            self._secrets,
            self.url_for(requested_url),
            timestamp,
            signature,
            self._wall_clock(),
            self.tolerance_s,
        )
        return None if ok else "invalid or expired signature"
