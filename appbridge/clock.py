"""Time as an argument.

The sans-I/O cores never read a clock: they take ``now`` (seconds, monotonic, float) and report
their next deadline. The asyncio shell reads :class:`Clock` once per event and passes the value
down, so every timing rule of the spec is testable by stepping a :class:`VirtualClock` by hand.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> float:
        """Unix seconds, for wire timestamps only (never for intervals)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when a test says so."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self._now += seconds
