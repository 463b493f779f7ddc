"""The login sessions of the browser pages (docs/operations.md, "The console and the
softphone"): opaque random keys that ``POST /login`` hands out as a cookie, never the token.

In memory and bounded (the oldest is evicted first), so a restart logs everyone out; the gateway
owns one store (``Gateway.web_sessions``), and http/web_auth.py checks requests against it.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Final

SESSION_LIFETIME_S: Final = 12 * 3600.0
MAX_SESSIONS: Final = 1000


class SessionStore:
    """Session keys and their expiry (monotonic seconds), oldest first; at most ``limit``."""

    def __init__(self, limit: int = MAX_SESSIONS, lifetime_s: float = SESSION_LIFETIME_S) -> None:
        self.limit = limit
        self.lifetime_s = lifetime_s
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def open(self, now: float) -> str:
        key = secrets.token_urlsafe(32)
        self._expiry[key] = now + self.lifetime_s
        while len(self._expiry) > self.limit:
            self._expiry.popitem(last=False)
        return key

    def valid(self, key: str, now: float) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if now >= expiry:
            del self._expiry[key]
            return False
        return True

    def close(self, key: str) -> None:
        self._expiry.pop(key, None)

    def __len__(self) -> int:
        return len(self._expiry)
