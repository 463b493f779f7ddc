"""Sans-I/O timing rules of the app link (docs/protocol-session-v1.md, "Connection and frames").

Both cores take ``now`` and report deadlines; the asyncio shell arms one ``loop.call_at`` per
deadline. Tests step a virtual clock and assert exact instants.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

PING_INTERVAL_S = 10.0
DEAD_AFTER_S = 30.0
RETRY_WINDOW_S = 2.5


class KeepaliveAction(enum.Enum):
    NONE = "none"
    PING = "ping"
    DEAD = "dead"


class Keepalive:
    """Ping every 10 s; a socket from which nothing (no pong, no frame) arrived for 30 s is dead.

    Pings go out on a fixed 10 s cadence from the moment the link opened;
    any received frame or pong counts as a sign of life.
    """

    def __init__(
        self,
        now: float,
        ping_interval_s: float = PING_INTERVAL_S,
        dead_after_s: float = DEAD_AFTER_S,
    ) -> None:
        self.ping_interval_s = ping_interval_s
        self.dead_after_s = dead_after_s
        self.last_heard = now
        self.next_ping = now + ping_interval_s
        self.dead = False

    def on_activity(self, now: float) -> None:
        self.last_heard = now

    def next_deadline(self) -> float:
        return min(self.next_ping, self.last_heard + self.dead_after_s)

    def on_timer(self, now: float) -> KeepaliveAction:
        if self.dead:
            return KeepaliveAction.NONE
        if now - self.last_heard >= self.dead_after_s:
            self.dead = True
            return KeepaliveAction.DEAD
        if now >= self.next_ping:
            # Stay on the 10 s grid even when a timer fires late.
            while self.next_ping <= now:
                self.next_ping += self.ping_interval_s
            return KeepaliveAction.PING
        return KeepaliveAction.NONE


@dataclass
class RetryWindow:
    """Retry a refused app URL for about 2.5 s, then give up (the fallback applies).

    docs/protocol-session-v1.md, "Connection and frames": a refusing URL is retried for about 2.5 s
    while the caller hears ringing, then the fallback applies. Delays double from ``first_delay_s``
    up to ``max_delay_s``; an attempt never starts after the window closed, and each attempt is
    bounded by what is left of the window (at least ``min_attempt_s``, so a last attempt can still
    finish a TLS handshake).
    """

    started: float
    window_s: float = RETRY_WINDOW_S
    first_delay_s: float = 0.1
    max_delay_s: float = 0.5
    min_attempt_s: float = 0.5
    max_attempt_s: float = 2.0
    attempts: int = 0

    @property
    def deadline(self) -> float:
        return self.started + self.window_s

    def attempt_timeout(self, now: float) -> float:
        left = self.deadline - now
        return min(self.max_attempt_s, max(self.min_attempt_s, left))

    def on_failure(self, now: float) -> float | None:
        """Record a failed attempt; return when to try again, or None when the window is over."""
        self.attempts += 1
        delay: float = min(self.max_delay_s, self.first_delay_s * 2.0 ** (self.attempts - 1))
        at = now + delay
        if at >= self.deadline:
            return None
        return at
