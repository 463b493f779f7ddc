"""Full garbage collections in small regular batches, between media ticks.

Why: CPython runs a full (oldest-generation) pass only when that generation has grown by a
quarter, and such a pass walks every live object: with many calls live it stops the loop for
longer than a 20 ms frame, the main source of pacing and latency tails (figures in
docs/PERFORMANCE.md).

What:

* Automatic full passes are off (``gc.set_threshold(t0, t1, FULL_PASS_OFF)``; the young
  generations are collected as before) and the media clock triggers one every ``period_s``
  (10 s) right after a tick's last slice (``MediaClock.call_after_tick``), so the pass has the
  rest of the 20 ms frame to itself. ``APPBRIDGE_GC_PERIOD_S`` sets the period; ``0`` keeps
  CPython's own schedule.
* Each pass ends with ``gc.freeze()``: what survived it moves to the permanent generation, which
  no pass walks, so the next pass walks only what is newer than ten seconds, not every live
  call. Frozen objects are still freed by reference counting when their last reference goes;
  what the freeze hides is garbage in reference cycles. An ended call forms none (its parts let
  go of one another as it ends: calls/call.py, net/ws_client.py, net/ws_fastpath.py,
  carriers/sip/; tests/integration/test_teardown_cycles.py proves it per carrier), so this loses
  nothing in the steady state.
* A pass also comes early, once the objects made since the last one are enough to make it long:
  after :data:`GROWTH_PASSES` young (generation-1) collections, each of which moves up to about
  7,000 survivors (CPython's default thresholds, 700 x 10) into the generation the pass walks
  (``gc.get_count()[2]``), and never sooner than :data:`MIN_GAP_S` after the last pass. In the
  steady state calls make few long-lived objects and the period rules; while calls arrive fast
  the budget cuts their objects into passes of at most about 14,000.
* A *deep* pass (``gc.unfreeze()``, a full pass over everything, freeze again) frees whatever
  cycles did get frozen: when no call is live and the heap (``sys.getallocatedblocks()``) is
  :data:`IDLE_SLACK` above its size after the last deep pass (no call to disturb then), or, under
  load, when the heap has grown :data:`DEEP_GROWTH` times since then (a leak of cycles cannot
  grow without bound; a deep pass walks every live call, so it must stay rare).

The decision is sans-I/O (:class:`GcPacer`: time and sizes are arguments); :class:`GcPacerShell`
wires it to the media clock and the ``gc`` module.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from appbridge.env_knobs import positive_from_env

log = logging.getLogger(__name__)

__all__ = [
    "DEEP_GROWTH",
    "DEFAULT_PERIOD_S",
    "ENV_VAR",
    "FULL_PASS_OFF",
    "GROWTH_PASSES",
    "IDLE_SLACK",
    "MIN_GAP_S",
    "GcPacer",
    "GcPacerShell",
    "period_from_env",
]

ENV_VAR = "APPBRIDGE_GC_PERIOD_S"
DEFAULT_PERIOD_S = 10.0
#: A third threshold no gen-1 count reaches: CPython never starts a full pass by itself.
FULL_PASS_OFF = 1_000_000_000
#: Under load, a deep pass once the heap has grown this many times since the last one.
DEEP_GROWTH = 2.0
#: With no call live, a deep pass once the heap is this much above its size after the last one.
IDLE_SLACK = 0.10
#: A pass is due early after this many young (generation-1) collections since the last one.
GROWTH_PASSES = 2
#: ... but never sooner than this after the last pass.
MIN_GAP_S = 1.0


def period_from_env(environ: dict[str, str] | None = None) -> float | None:
    """The pacing period in seconds; None means "leave CPython's schedule alone" (``0``)."""
    return positive_from_env(ENV_VAR, DEFAULT_PERIOD_S, float, environ)


@dataclass
class GcPacer:
    """When the next full pass is due, whether it must be deep, and what the passes cost (for
    /metrics and the log)."""

    period_s: float = DEFAULT_PERIOD_S
    growth_passes: int = GROWTH_PASSES
    min_gap_s: float = MIN_GAP_S
    next_due_s: float | None = None
    #: When the last pass ended, or the schedule started (the gap counts from it).
    last_pass_s: float = 0.0
    passes: int = 0
    #: Those of :attr:`passes` the growth budget brought forward (module doc).
    early_passes: int = 0
    deep_passes: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    collected: int = 0
    #: The heap (allocated blocks) right after the last deep pass, or at the first pass.
    heap_after_deep: int | None = None

    def due(self, now: float, grown: int = 0) -> bool:
        """Whether a pass is due at ``now``, ``grown`` young collections after the last one
        (``gc.get_count()[2]``); the first call only starts the schedule."""
        if self.next_due_s is None:
            self.next_due_s = now + self.period_s
            self.last_pass_s = now
            return False
        if now >= self.next_due_s:
            return True
        return grown >= self.growth_passes and now >= self.last_pass_s + self.min_gap_s

    def deep_due(self, heap: int, idle: bool) -> bool:
        """Whether the pass about to run must also walk the frozen objects (module doc)."""
        base = self.heap_after_deep
        if base is None:
            self.heap_after_deep = heap
            return False
        if idle:
            return heap > base * (1.0 + IDLE_SLACK)
        return heap >= base * DEEP_GROWTH

    def ran(
        self,
        now: float,
        spent_s: float,
        collected: int,
        *,
        deep: bool = False,
        heap: int | None = None,
    ) -> None:
        """A pass ended at ``now`` after ``spent_s``; the next is a period later (not earlier
        than that even if this one was late: passes never bunch up). A deep pass gives the
        heap size the next deep pass is measured against."""
        self.passes += 1
        if self.next_due_s is not None and now < self.next_due_s:
            self.early_passes += 1
        self.total_s += spent_s
        self.max_s = max(self.max_s, spent_s)
        self.collected += collected
        self.next_due_s = now + self.period_s
        self.last_pass_s = now
        if deep:
            self.deep_passes += 1
            if heap is not None:
                self.heap_after_deep = heap


class GcPacerShell:
    """Runs :class:`GcPacer`'s passes off the media clock's ticks (module doc).

    ``clock`` is the media clock's own clock (the gateway's): a tick's ``now`` decides whether a
    pass is due, and the same clock says when the pass ended."""

    def __init__(
        self,
        pacer: GcPacer,
        *,
        clock: Callable[[], float] = time.monotonic,
        idle: Callable[[], bool] = lambda: False,
        heap: Callable[[], int] = sys.getallocatedblocks,
        grown: Callable[[], int] = lambda: gc.get_count()[2],
    ) -> None:
        self.pacer = pacer
        self._clock = clock
        self._idle = idle
        self._heap = heap
        self._grown = grown
        self._froze = False
        self._saved_threshold: tuple[int, int, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._after_tick: Callable[[Callable[[], None]], None] | None = None
        self._pending = False

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        after_tick: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """``after_tick`` runs a hook once the media clock's current tick is over (its last
        slice, ``MediaClock.call_after_tick``); without it the pass follows with ``call_soon``."""
        self._loop = loop
        self._after_tick = after_tick
        self._saved_threshold = gc.get_threshold()
        young, middle, _ = self._saved_threshold
        gc.set_threshold(young, middle, FULL_PASS_OFF)

    def stop(self) -> None:
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
        if self._froze:
            # Give CPython's collector back everything these passes froze (an embedding process,
            # a test suite, goes on without the pacer).
            gc.unfreeze()
            self._froze = False
        self._loop = None

    def on_tick(self, tick: int, now: float) -> None:
        """A media clock subscriber: when a pass is due at the tick's ``now``, run it right
        after this tick."""
        if self._loop is None or self._pending:
            return
        if not self.pacer.due(now, self._grown()):
            return
        self._pending = True
        if self._after_tick is not None:
            self._after_tick(self._collect)
        else:
            self._loop.call_soon(self._collect)

    def _collect(self) -> None:
        self._pending = False
        started = time.perf_counter()
        deep = self.pacer.deep_due(self._heap(), self._idle())
        if deep:
            gc.unfreeze()
        collected = gc.collect(2)
        gc.freeze()
        self._froze = True
        spent_s = time.perf_counter() - started
        self.pacer.ran(
            self._clock(), spent_s, collected, deep=deep, heap=self._heap() if deep else None
        )
        if deep:
            log.info(
                "gc: deep pass (frozen objects included): %d collected in %.1f ms",
                collected,
                spent_s * 1e3,
            )
