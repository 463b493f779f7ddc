"""One media clock per process (docs/ARCHITECTURE.md, "The asyncio shell").

A single task wakes every 20 ms on absolute deadlines and gives every live call its tick, with the
tick number and the time of the tick (``now``, read once per tick from the gateway's
:class:`~appbridge.clock.Clock`, so every call of a tick sees the same instant and none reads the
clock again). There is no per-call pacing task: one shared tick costs one wake-up per 20 ms,
however many calls there are.
When the loop falls behind by more than ``RESYNC_AFTER_FRAMES`` frames the schedule is reset to
now instead of firing a burst of catch-up ticks (a burst would only pile audio into the carriers'
buffers).

Lateness (how long after its deadline a tick started) is recorded in a fixed-bucket histogram:
the benchmark and ``/metrics`` read it; nothing in the suite asserts on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from appbridge.clock import Clock, SystemClock
from appbridge.env_knobs import positive_from_env

log = logging.getLogger(__name__)

FRAME_S: Final = 0.020
RESYNC_AFTER_FRAMES: Final = 5

# Bucket upper bounds in ms for the lateness histogram.
LATENESS_BUCKETS_MS: Final[tuple[float, ...]] = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 100, 1e9)


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


#: A subscriber's tick: ``fn(tick, now)``, the tick number and the tick's clock reading. Two plain
#: arguments, the same float object for every subscriber: nothing is made per call and tick.
Tickable = Callable[[int, float], None]
#: A hook run after a tick, or after a slice of one (:class:`MediaClock`).
TickHook = Callable[[], None]


#: Subscribers ticked per loop callback. Between two slices the loop serves the sockets, so a
#: caller packet or an app ``clear`` that arrives during a tick waits for one slice rather than
#: for every call's tick (inbound latency and clear-to-silence, docs/PERFORMANCE.md).
DEFAULT_SLICE_SUBSCRIBERS: Final = 32
SLICE_ENV_VAR: Final = "APPBRIDGE_TICK_SLICE"


def slice_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``APPBRIDGE_TICK_SLICE``: subscribers per slice; ``0`` ticks every call in one go."""
    return positive_from_env(SLICE_ENV_VAR, DEFAULT_SLICE_SUBSCRIBERS, int, environ)


class MediaClock:
    """Calls every registered tick function once per 20 ms frame, with the tick number and the
    tick's ``now``.

    The real-time loop (:meth:`start`) ticks the subscribers in slices of ``slice_size``, each
    slice its own loop callback (module constant's comment); :meth:`run_tick` ticks them all at
    once (the tests drive it by hand). Either way each subscriber is ticked once per tick, in
    subscription order, and not after it unsubscribed, and every slice of a tick passes the same
    ``now``. Work that must follow the ticks has two hooks: :meth:`call_after_tick` (once the
    tick's last slice is done: the paced collection) and :meth:`call_after_slice` (once the
    slice that ticked the caller is done: a SIP leg's packet).

    ``clock`` is the gateway's clock, the one the calls compare their deadlines with; the
    schedule itself runs on the event loop's time, which is what ``asyncio.sleep`` waits on.
    """

    def __init__(
        self, *, slice_size: int | None = DEFAULT_SLICE_SUBSCRIBERS, clock: Clock | None = None
    ) -> None:
        self._subscribers: dict[int, Tickable] = {}
        self._next_key = 0
        self._task: asyncio.Task[None] | None = None
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.tick = 0
        #: The clock's reading at the start of the current (or last) tick.
        self.now = 0.0
        self.lateness = LatenessHistogram()
        self.resyncs = 0
        self.tick_errors = 0
        self.slice_size = slice_size
        self._order: list[tuple[int, Tickable]] = []
        self._pos = 0
        self._after: list[TickHook] = []
        self._after_slice: list[TickHook] = []
        self._ticking = False
        self._loop: asyncio.AbstractEventLoop | None = None

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

    @property
    def in_tick(self) -> bool:
        """A tick has begun and its last slice is not done yet."""
        return self._ticking

    def call_after_tick(self, hook: TickHook) -> None:
        """Run ``hook`` once the current tick is over (its last slice); at once between ticks."""
        if self.in_tick:
            self._after.append(hook)
        else:
            hook()

    def call_after_slice(self, hook: TickHook) -> None:
        """Run ``hook`` in the loop callback that follows the caller's slice, with every other
        hook given during that slice, in order, each its own failure boundary.

        This is a subscriber's end of its tick (a SIP leg sends its packet there, after the
        call's tick handed it the frame: ``carriers/sip/leg.py``). It is per slice, not per
        tick, so that the calls of the first slices do not wait for the last slice to get their
        packets out, and one loop callback serves the whole slice instead of one per leg. The
        callback is scheduled by the slice's first hook, so the next slice (scheduled when the
        slice ends) comes after it; a hook given while the batch runs waits for the next one.
        Without a running clock (tests that tick by hand) the running loop serves it."""
        pending = self._after_slice
        if not pending:
            loop = self._loop
            if loop is None:
                loop = asyncio.get_running_loop()
            loop.call_soon(self._run_after_slice)
        pending.append(hook)

    def _run_after_slice(self) -> None:
        pending, self._after_slice = self._after_slice, []
        for hook in pending:
            try:
                hook()
            except Exception:
                log.exception("media clock: after-slice hook failed")

    def start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="media-clock")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._loop = None

    def run_tick(self) -> None:
        """One tick for every subscriber, all in this call."""
        self.begin_tick()
        self._run_slice(None)

    def begin_tick(self) -> None:
        """Start a tick: a tick still unfinished is finished first (a tick never overlaps the
        next one), then the subscribers are fixed for this tick and the clock is read."""
        if self.in_tick:
            self._run_slice(None)
        self.tick += 1
        self.now = self._clock.now()
        self._order = list(self._subscribers.items())
        self._pos = 0
        self._ticking = True

    def _run_slice(self, size: int | None) -> None:
        """Tick the next ``size`` subscribers (all when None). Each subscriber is its own
        failure boundary; one that failed is removed."""
        order, tick, subscribers = self._order, self.tick, self._subscribers
        # Boxed once per slice: compiled, an int or float argument is boxed at every call.
        tick_arg: Any = tick
        now_arg: Any = self.now
        start = self._pos
        # Without a running clock (stopped mid-tick) there is no loop to come back on: all now.
        whole = size is None or self._loop is None
        end = len(order) if whole else min(len(order), start + size)  # type: ignore[operator]
        self._pos = end  # first: a subscriber that ends the tick early must not re-run these
        for key, fn in order[start:end]:
            if key not in subscribers:
                continue  # unsubscribed since the tick began (a call that ended)
            try:
                fn(tick_arg, now_arg)
            except Exception:
                self.tick_errors += 1
                subscribers.pop(key, None)
                log.exception("media tick failed; the subscriber is removed")
        if self._pos < len(order):
            assert self._loop is not None  # else the slice above took them all
            self._loop.call_soon(self._next_slice, tick)
            return
        self._order = []
        self._pos = 0
        self._ticking = False
        after, self._after = self._after, []
        for hook in after:
            try:
                hook()
            except Exception:
                log.exception("media clock: after-tick hook failed")

    def _next_slice(self, tick: int) -> None:
        if tick == self.tick and self.in_tick:  # else finished already by the next begin_tick
            self._run_slice(self.slice_size)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        next_deadline = loop.time() + FRAME_S
        while True:
            delay = next_deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            late_s = now - next_deadline
            self.lateness.record(late_s * 1000.0)
            self.begin_tick()
            self._run_slice(self.slice_size)
            next_deadline += FRAME_S
            if loop.time() - next_deadline > RESYNC_AFTER_FRAMES * FRAME_S:
                self.resyncs += 1
                next_deadline = loop.time() + FRAME_S
