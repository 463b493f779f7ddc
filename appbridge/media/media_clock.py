"""One media clock per process (DESIGN.md, "The media path").

A single task wakes every 20 ms on absolute deadlines and gives every live call its tick. There is
no per-call pacing task: one shared tick costs one wake-up per 20 ms, however many calls there are.
When the loop falls behind by more than ``RESYNC_AFTER_FRAMES`` frames the schedule is reset to
now instead of firing a burst of catch-up ticks (a burst would only pile audio into the carriers'
buffers).

Lateness (how long after its deadline a tick started) is recorded in a fixed-bucket histogram:
the benchmark and ``/metrics`` read it; nothing in the suite asserts on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

FRAME_S = 0.020
RESYNC_AFTER_FRAMES = 5

# Bucket upper bounds in ms for the lateness histogram.
LATENESS_BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 100, 1e9)


class LatenessHistogram:
    def __init__(self) -> None:
        self.counts = [0] * len(LATENESS_BUCKETS_MS)
        self.total = 0
        self.max_ms = 0.0
        self.sum_ms = 0.0

    def record(self, late_ms: float) -> None:
        for i, bound in enumerate(LATENESS_BUCKETS_MS):
            if late_ms <= bound:
                self.counts[i] += 1
                break
        self.total += 1
        self.sum_ms += late_ms
        if late_ms > self.max_ms:
            self.max_ms = late_ms

    def snapshot(self) -> dict[str, object]:
        return {
            "buckets_ms": list(LATENESS_BUCKETS_MS),
            "counts": list(self.counts),
            "total": self.total,
            "max_ms": self.max_ms,
            "sum_ms": self.sum_ms,
        }


Tickable = Callable[[int], None]


class MediaClock:
    """Calls every registered tick function once per 20 ms frame, with the tick number."""

    def __init__(self) -> None:
        self._subscribers: dict[int, Tickable] = {}
        self._next_key = 0
        self._task: asyncio.Task[None] | None = None
        self.tick = 0
        self.lateness = LatenessHistogram()
        self.resyncs = 0
        self.tick_errors = 0

    def subscribe(self, fn: Tickable) -> int:
        key = self._next_key
        self._next_key += 1
        self._subscribers[key] = fn
        return key

    def unsubscribe(self, key: int) -> None:
        self._subscribers.pop(key, None)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="media-clock")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def run_tick(self) -> None:
        """One tick for every subscriber. Each subscriber is its own failure boundary."""
        self.tick += 1
        tick = self.tick
        for key, fn in list(self._subscribers.items()):
            try:
                fn(tick)
            except Exception:
                self.tick_errors += 1
                self._subscribers.pop(key, None)
                log.exception("media tick failed; the subscriber is removed")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_deadline = loop.time() + FRAME_S
        while True:
            delay = next_deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            late_s = now - next_deadline
            self.lateness.record(late_s * 1000.0)
            self.run_tick()
            next_deadline += FRAME_S
            if loop.time() - next_deadline > RESYNC_AFTER_FRAMES * FRAME_S:
                self.resyncs += 1
                next_deadline = loop.time() + FRAME_S
