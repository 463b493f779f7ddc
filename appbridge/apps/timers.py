"""Sans-I/O timing rules of the app link (docs/protocol-session-v1.md, "Connection and frames").

Every core here takes ``now`` and reports deadlines; the asyncio shell arms one ``loop.call_at`` per
deadline. Tests step a virtual clock and assert exact instants.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
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


# -- reconnecting (docs/protocol-session-v1.md, "Reconnecting") --------------------------------

RECONNECT_FIRST_DELAY_S = 0.1
RECONNECT_MAX_DELAY_S = 2.0
RECONNECT_MAX_ATTEMPTS = 5
RECONNECT_WINDOW_S = 15.0
TAKE_BACK_S = 2.0
LIVED_RESET_S = 5.0


class ReconnectSeries:
    """When to redial a lost app link: one series of at most 5 attempts.

    docs/protocol-session-v1.md, "Reconnecting": the wait before each attempt doubles from
    100 ms up to 2 s and is scaled by a random factor between 0.5 and 1 (``random`` returns a
    number in [0, 1), as :func:`random.random` does); no attempt starts later than 15 s after
    the loss that began the series. A series goes on across a link that was taken back and lost
    again within 5 s (:meth:`lost`), so an app that keeps failing runs out of attempts.
    """

    def __init__(
        self,
        lost_at: float,
        random: Callable[[], float],
        *,
        max_attempts: int = RECONNECT_MAX_ATTEMPTS,
        window_s: float = RECONNECT_WINDOW_S,
    ) -> None:
        self.lost_at = lost_at
        self._random = random
        self.max_attempts = max_attempts
        self.window_s = window_s
        self.attempts = 0
        self._from = lost_at

    @property
    def deadline(self) -> float:
        """No attempt starts after this instant."""
        return self.lost_at + self.window_s

    def delay_s(self, attempt: int) -> float:
        """The wait before attempt number ``attempt`` (1-based), random factor applied."""
        base = min(RECONNECT_MAX_DELAY_S, RECONNECT_FIRST_DELAY_S * 2.0 ** (attempt - 1))
        return base * (0.5 + 0.5 * self._random())

    def next_attempt(self, now: float) -> float | None:
        """When the next attempt starts (counted as made), or None: the series is over."""
        if self.attempts >= self.max_attempts:
            return None
        at = max(now, self._from) + self.delay_s(self.attempts + 1)
        if at > self.deadline:
            return None
        self.attempts += 1
        return at

    def failed(self, now: float) -> None:
        """The attempt failed at ``now``: the next wait counts from here."""
        self._from = now

    def lost(self, now: float, lived_s: float) -> bool:
        """A taken-back link was lost again. True when the series goes on (it lived under 5 s);
        False when a fresh series must start."""
        if lived_s >= LIVED_RESET_S:
            return False
        self._from = now
        return True


class QueueLevel:
    """When to send ``output.queue`` (docs/protocol-session-v1.md, "Queue level").

    A report goes out when the queued audio changed by 200 ms or more since the last report,
    or became 0, and never sooner than 100 ms after the previous one; a change that comes too
    soon is reported at the first :meth:`observe` after the 100 ms.
    """

    def __init__(
        self, *, step_ms: int = 200, min_interval_s: float = 0.1, reported_ms: int = 0
    ) -> None:
        self.step_ms = step_ms
        self.min_interval_s = min_interval_s
        self.reported_ms = reported_ms
        self._last_at: float | None = None

    def observe(self, now: float, queued_ms: int) -> int | None:
        """The level to report now, or None."""
        last = self._last_at
        if last is not None and now - last < self.min_interval_s - 1e-9:
            return None
        reported = self.reported_ms
        if queued_ms == reported:
            return None
        if (queued_ms == 0) or abs(queued_ms - reported) >= self.step_ms:
            self.reported_ms = queued_ms
            self._last_at = now
            return queued_ms
        return None


class TakeBackOutcome(enum.Enum):
    TAKEN = "taken"  # session.update with reconnect: true came first, in time
    REFUSED = "refused"  # anything else came first, or a close: reconnecting ends
    NO_ANSWER = "no_answer"  # nothing in 2 s: the attempt failed


class TakeBack:
    """The 2 s in which an app takes a redialled session back (docs/protocol-session-v1.md,
    "Reconnecting"), from the moment ``session.start`` with ``reconnect`` went out."""

    def __init__(self, offered_at: float, window_s: float = TAKE_BACK_S) -> None:
        self.deadline = offered_at + window_s

    def on_answer(self, now: float, takes_back: bool) -> TakeBackOutcome:
        """The app's first frame (``takes_back``: it is the take-back), or its close."""
        if now > self.deadline:
            return TakeBackOutcome.NO_ANSWER
        return TakeBackOutcome.TAKEN if takes_back else TakeBackOutcome.REFUSED

    def on_timer(self, now: float) -> TakeBackOutcome | None:
        """The shell's timer at :attr:`deadline`: no answer came."""
        return TakeBackOutcome.NO_ANSWER if now >= self.deadline else None
