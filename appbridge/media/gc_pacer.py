"""Full garbage collections in small regular batches, between media ticks (issue 7).

Why: every ended call leaves some hundred objects in reference cycles (uvicorn's per-connection
protocol objects and bound methods, httpx response streams, websockets frames; measured with
``APPBRIDGE_GC_GARBAGE=1``, docs/PERFORMANCE.md). Only a full (oldest-generation) pass frees
them, and CPython runs one only when the oldest generation has grown by a quarter, so under
call churn the garbage piles up for a minute and is then freed in one batch: 17,800-28,500
objects, 43-120 ms with the loop stopped, at 120 calls and ~3 calls/s. Those passes were
the longest stalls the gateway itself caused in the churn soak, and the garbage they free
raises the process's high-water RSS in the meantime.

What: automatic full passes are switched off (``gc.set_threshold(t0, t1, FULL_PASS_OFF)``: the
young generations are collected as before) and the media clock triggers one every ``period_s``
(10 s) right after a tick's last slice (``MediaClock.call_after_tick``), so the pass has the
rest of the 20 ms frame to itself. A pass walks every live object but the frozen start-up ones
(server.py): its cost follows the live calls, not the garbage (7-10 ms at 150 calls, 10-19 ms
at 200, measured with ``APPBRIDGE_STALL_TRACE_MS``), and the loop then needs as long again to
serve what arrived meanwhile. Every 2 s (the first setting) that put one caller frame in a
hundred behind such a stall and was the main source of the p99 tails at 150-200 calls; every
10 s it is one in five hundred, while ten seconds of churn add little to a pass (about 80
objects per ended call) and hold a few megabytes at most. ``APPBRIDGE_GC_PERIOD_S`` sets the
period; ``0`` keeps CPython's own schedule.

The decision is sans-I/O (:class:`GcPacer`: time is an argument); :class:`GcPacerShell` wires it
to the media clock and the ``gc`` module.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from appbridge.env_knobs import positive_from_env

__all__ = [
    "DEFAULT_PERIOD_S",
    "ENV_VAR",
    "FULL_PASS_OFF",
    "GcPacer",
    "GcPacerShell",
    "period_from_env",
]

ENV_VAR = "APPBRIDGE_GC_PERIOD_S"
DEFAULT_PERIOD_S = 10.0
#: A third threshold no gen-1 count reaches: CPython never starts a full pass by itself.
FULL_PASS_OFF = 1_000_000_000


def period_from_env(environ: dict[str, str] | None = None) -> float | None:
    """The pacing period in seconds; None means "leave CPython's schedule alone" (``0``)."""
    return positive_from_env(ENV_VAR, DEFAULT_PERIOD_S, float, environ)


@dataclass
class GcPacer:
    """When the next full pass is due, and what the passes cost (for /metrics and the log)."""

    period_s: float = DEFAULT_PERIOD_S
    next_due_s: float | None = None
    passes: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    collected: int = 0

    def due(self, now: float) -> bool:
        """Whether a pass is due at ``now``; the first call only starts the schedule."""
        if self.next_due_s is None:
            self.next_due_s = now + self.period_s
            return False
        return now >= self.next_due_s

    def ran(self, now: float, spent_s: float, collected: int) -> None:
        """A pass ended at ``now`` after ``spent_s``; the next is a period later (not earlier
        than that even if this one was late: passes never bunch up)."""
        self.passes += 1
        self.total_s += spent_s
        self.max_s = max(self.max_s, spent_s)
        self.collected += collected
        self.next_due_s = now + self.period_s


class GcPacerShell:
    """Runs :class:`GcPacer`'s passes off the media clock's ticks (module doc)."""

    def __init__(self, pacer: GcPacer, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.pacer = pacer
        self._clock = clock
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
        self._loop = None

    def on_tick(self, tick: int) -> None:
        """A media clock subscriber: when a pass is due, run it right after this tick."""
        if self._loop is None or self._pending or not self.pacer.due(self._clock()):
            return
        self._pending = True
        if self._after_tick is not None:
            self._after_tick(self._collect)
        else:
            self._loop.call_soon(self._collect)

    def _collect(self) -> None:
        self._pending = False
        started = time.perf_counter()
        collected = gc.collect(2)
        self.pacer.ran(self._clock(), time.perf_counter() - started, collected)
