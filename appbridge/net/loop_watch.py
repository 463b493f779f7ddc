"""Loop-stall tracer: which code held the event loop when the media clock fell behind.

A diagnostic, off by default, switched on with ``APPBRIDGE_STALL_TRACE_MS=<threshold ms>`` in the
gateway's environment (bench/README.md, "Finding a stall"). The performance bars
(docs/PERFORMANCE.md: pacing max ≤ 20 ms, clear-to-silence max ≤ 40 ms) break whenever one callback
keeps the loop for tens of milliseconds, and a sampling profiler averages those rare callbacks away.
This catches them in the act:

* on the loop, a heartbeat timer stamps ``time.monotonic()`` every ``period_s``;
* a daemon thread wakes every ``period_s / 2``; when the last beat is older than
  ``period_s + threshold_s`` the loop is stalled, and it takes the main thread's Python stack
  (``sys._current_frames``) every time it wakes until the beat comes back;
* when the stall ends it logs one WARNING: its length and the distinct stacks seen.

The thread needs the GIL to sample, so a stall in C code that keeps the GIL shows up as its
length and the stack right after it. Nothing here runs when the variable is unset; when set, the
cost is one timer every 10 ms on the loop and a thread waking every 5 ms.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

from appbridge.env_knobs import positive_from_env

log = logging.getLogger(__name__)

ENV_VAR = "APPBRIDGE_STALL_TRACE_MS"
HEARTBEAT_PERIOD_S = 0.010
MAX_STACKS_PER_STALL = 4
STACK_DEPTH = 14


def threshold_from_env(environ: dict[str, str] | None = None) -> float | None:
    """``APPBRIDGE_STALL_TRACE_MS`` as seconds, or None when unset, empty or not positive."""
    threshold_ms = positive_from_env(ENV_VAR, None, float, environ)
    return None if threshold_ms is None else threshold_ms / 1000.0


class LoopStallWatch:
    """Heartbeat on the loop, watchdog thread off it; see the module docstring."""

    def __init__(self, threshold_s: float, *, period_s: float = HEARTBEAT_PERIOD_S) -> None:
        self.threshold_s = threshold_s
        self.period_s = period_s
        self.stalls = 0
        self.worst_s = 0.0
        self._beat_s = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main_ident = threading.get_ident()
        self._main_tid = threading.get_native_id()
        self._gc_started_s = 0.0
        self.gc_passes_over_threshold = 0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A collector pass on the loop's thread is a stall with no Python stack: time it."""
        if threading.get_ident() != self._main_ident:
            return
        if phase == "start":
            self._gc_started_s = time.perf_counter()
            return
        spent_s = time.perf_counter() - self._gc_started_s
        if spent_s > self.threshold_s / 2:
            self.gc_passes_over_threshold += 1
            log.warning(
                "gc generation %d pass: %.0f ms, %d collected, %d tracked in the oldest "
                "generation, %d frozen",
                info["generation"],
                spent_s * 1000.0,
                info["collected"],
                len(gc.get_objects(generation=2)),
                gc.get_freeze_count(),
            )

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._main_ident = threading.get_ident()
        self._main_tid = threading.get_native_id()
        self._beat_s = time.monotonic()
        self._handle = loop.call_later(self.period_s, self._beat)
        self._thread = threading.Thread(
            target=self._watch, name="appbridge-stall-watch", daemon=True
        )
        self._thread.start()
        gc.callbacks.append(self._on_gc)
        log.warning(
            "stall tracing on (%s): loop stalls over %.0f ms are logged with their stacks",
            ENV_VAR,
            self.threshold_s * 1000.0,
        )

    def stop(self) -> None:
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _beat(self) -> None:
        self._beat_s = time.monotonic()
        if self._loop is not None and not self._stop.is_set():
            self._handle = self._loop.call_later(self.period_s, self._beat)

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._main_ident)
        if frame is None:
            return "(no frame: the loop is in C code)"
        return "".join(traceback.format_stack(frame, limit=STACK_DEPTH))

    def _schedstat_ns(self) -> tuple[int, int]:
        """The loop thread's time on a CPU and waiting for one, ns (``/proc/.../schedstat``):
        a stall spent waiting is another process's doing, one spent running is ours."""
        try:
            with open(f"/proc/self/task/{self._main_tid}/schedstat", encoding="ascii") as f:
                on_cpu, waiting = f.read().split()[:2]
            return int(on_cpu), int(waiting)
        except (OSError, ValueError):
            return 0, 0

    def _cpu(self) -> int | None:
        """The CPU the loop thread last ran on (``/proc/.../stat``, field 39)."""
        try:
            with open(f"/proc/self/task/{self._main_tid}/stat", encoding="ascii") as f:
                # The command name (field 2) may hold spaces: count from its closing paren.
                return int(f.read().rsplit(")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            return None

    def _watch(self) -> None:
        stall_beat_s: float | None = None  # the last beat before the current stall
        stacks: dict[str, int] = {}
        sched_at_beat = self._schedstat_ns()
        sched_at_stall = sched_at_beat
        steal_at_beat = steal_at_stall = steal_ms()
        last_beat_s = self._beat_s
        while not self._stop.wait(self.period_s / 2):
            beat_s = self._beat_s
            lag_s = time.monotonic() - beat_s - self.period_s
            if stall_beat_s is None:
                if beat_s != last_beat_s:  # the loop is alive: the counters' new origin
                    last_beat_s = beat_s
                    sched_at_beat = self._schedstat_ns()
                    steal_at_beat = steal_ms()
                if lag_s > self.threshold_s:
                    stall_beat_s = beat_s
                    sched_at_stall = sched_at_beat
                    steal_at_stall = steal_at_beat
                    stacks = {self._stack(): 1}
                continue
            if beat_s == stall_beat_s:  # still stalled
                stack = self._stack()
                if stack in stacks or len(stacks) < MAX_STACKS_PER_STALL:
                    stacks[stack] = stacks.get(stack, 0) + 1
                continue
            length_s = beat_s - stall_beat_s - self.period_s
            on_cpu_ns, waiting_ns = self._schedstat_ns()
            cpu = self._cpu()
            steal_now = steal_ms()
            stolen = "unknown"
            if cpu is not None and cpu < min(len(steal_now), len(steal_at_stall)):
                stolen = f"{steal_now[cpu] - steal_at_stall[cpu]:.0f} ms on CPU {cpu}"
            self.stalls += 1
            self.worst_s = max(self.worst_s, length_s)
            log.warning(
                "loop stall of %.0f ms (loop thread on a CPU %.0f ms, waiting for one %.0f ms; "
                "taken by the hypervisor (steal) %s; %d stack(s) sampled):\n%s",
                length_s * 1000.0,
                (on_cpu_ns - sched_at_stall[0]) / 1e6,
                (waiting_ns - sched_at_stall[1]) / 1e6,
                stolen,
                sum(stacks.values()),
                "\n".join(f"-- seen {n}x:\n{s}" for s, n in stacks.items()),
            )
            stall_beat_s = None
            stacks = {}
            last_beat_s = beat_s
            sched_at_beat = self._schedstat_ns()


_TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def steal_ms() -> list[float]:
    """Per CPU, the time the hypervisor ran something else while this machine's CPU was ready
    to run (``/proc/stat``, ``steal``; 10 ms resolution). A virtual machine sees such time as
    its own thread running: only this counter tells it apart. Empty where there is no
    ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [
        int(fields[8]) * _TICK_MS
        for fields in (line.split() for line in lines)
        if fields and fields[0].startswith("cpu") and fields[0] != "cpu" and len(fields) > 8
    ]


TRACEMALLOC_ENV_VAR = "APPBRIDGE_TRACEMALLOC_S"
HEAP_LOG_ENV_VAR = "APPBRIDGE_HEAP_LOG_S"
GARBAGE_ENV_VAR = "APPBRIDGE_GC_GARBAGE"
TRACEMALLOC_TOP = 12
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _period(environ: dict[str, str], name: str) -> float | None:
    text = environ.get(name, "").strip()
    try:
        period_s = float(text) if text else 0.0
    except ValueError:
        return None
    return period_s if period_s > 0 else None


def rss_bytes() -> int:
    """This process's resident set (``/proc/self/statm``, second field, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def c_heap() -> tuple[int, int, int] | None:
    """The C allocator's view (glibc ``mallinfo2``, all arenas): bytes it took from the system
    (heap arenas plus its own mmaps), bytes in use by the program, bytes free inside its arenas.
    None where the C library has no ``mallinfo2`` (not glibc, or glibc before 2.33). Python's
    small objects live in pymalloc's own mappings, outside these figures."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return info.arena + info.hblkhd, info.uordblks + info.hblkhd, info.fordblks


@functools.cache
def _mallinfo2() -> Any:
    """glibc's ``mallinfo2`` bound once through ctypes, or None where it is missing."""
    import ctypes

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    mallinfo2.restype = _Mallinfo2
    return mallinfo2


class MemoryDiffLog:
    """Where the memory of a long-running gateway goes: a diagnostic for the soak test.

    Off by default. Two strengths, each a period in seconds in the environment:

    * ``APPBRIDGE_HEAP_LOG_S``: cheap; every period one line with the RSS, the C allocator's
      figures (:func:`c_heap`), the blocks the Python allocator holds
      (``sys.getallocatedblocks``), the objects the collector tracks and ``gc.get_count()``.
      RSS that climbs while blocks and objects stay flat is the C side: the C heap in use
      climbing is memory held by C code (a leak below Python), its free part climbing is
      fragmentation.
    * ``APPBRIDGE_TRACEMALLOC_S``: heavy; :mod:`tracemalloc` (one frame per allocation; a
      snapshot stalls the loop for seconds: use it with few calls) and, every period, the
      source lines whose live allocations grew most since the first snapshot, and the tracked
      objects by type. A leak climbs with every ended call.
    """

    def __init__(self, period_s: float, *, trace: bool, garbage: bool = False) -> None:
        self.period_s = period_s
        self.trace = trace
        self.garbage = garbage
        self._baseline: object | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> MemoryDiffLog | None:
        env = dict(os.environ) if environ is None else environ
        traced_s = _period(env, TRACEMALLOC_ENV_VAR)
        if traced_s is not None:
            return cls(traced_s, trace=True)
        light_s = _period(env, HEAP_LOG_ENV_VAR)
        if light_s is None:
            return None
        return cls(light_s, trace=False, garbage=env.get(GARBAGE_ENV_VAR, "") == "1")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.trace:
            import tracemalloc

            tracemalloc.start(1)
        if self.garbage:
            gc.set_debug(gc.DEBUG_SAVEALL)
        self._loop = loop
        self._handle = loop.call_later(self.period_s, self._report)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self.trace:
            import tracemalloc

            tracemalloc.stop()
        if self.garbage:
            gc.set_debug(0)
            gc.garbage.clear()

    def _report(self) -> None:
        tracked = gc.get_objects()
        # What a full pass has to walk: the tracked objects with the most references.
        widest = sorted(
            ((len(gc.get_referents(o)), type(o).__qualname__) for o in tracked), reverse=True
        )[:5]
        references = sum(len(gc.get_referents(o)) for o in tracked)
        heap = c_heap()
        c_side = "C heap unknown"
        if heap is not None:
            system, used, free = (n / 2**20 for n in heap)
            c_side = (
                f"C heap {system:.1f} MB from the system, {used:.1f} MB in use, "
                f"{free:.1f} MB free in its arenas"
            )
        log.warning(
            "heap: rss %.1f MB, %s, %d allocated blocks, %d tracked objects holding %d "
            "references (widest %s), gc counts %s",
            rss_bytes() / 2**20,
            c_side,
            sys.getallocatedblocks(),
            len(tracked),
            references,
            widest,
            gc.get_count(),
        )
        del tracked
        if self.trace:
            self._report_traced()
        if self.garbage:
            self._report_garbage()
        if self._loop is not None:
            self._handle = self._loop.call_later(self.period_s, self._report)

    def _report_garbage(self) -> None:
        """``APPBRIDGE_GC_GARBAGE=1`` (with the heap log): what the collector found unreachable
        since the last report (a full pass included), by type. ``DEBUG_SAVEALL`` keeps it in
        ``gc.garbage`` instead of freeing it; it is counted, then freed here. Objects in
        reference cycles are the ones only a full pass frees, in one batch: the fewer, the
        shorter the passes."""
        # A full pass over everything, still saving: cycles old enough for the oldest
        # generation too, and those the paced passes froze (media/gc_pacer.py) as well.
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        gc.collect()
        kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        total = len(gc.garbage)
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
        if frozen:
            gc.freeze()
        gc.set_debug(gc.DEBUG_SAVEALL)
        log.warning("gc garbage: %d objects in cycles; by type: %s", total, kinds.most_common(25))

    def _report_traced(self) -> None:
        import tracemalloc

        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        if self._baseline is None:
            self._baseline = snapshot
            log.warning("tracemalloc baseline: %.1f MB traced", _traced_mb(snapshot))
            return
        assert isinstance(self._baseline, tracemalloc.Snapshot)
        stats = snapshot.compare_to(self._baseline, "lineno")[:TRACEMALLOC_TOP]
        kinds = Counter(type(o).__qualname__ for o in gc.get_objects())
        log.warning(
            "tracemalloc: %.1f MB traced (baseline %.1f MB); top growth:\n%s\n"
            "tracked objects by type: %s",
            _traced_mb(snapshot),
            _traced_mb(self._baseline),
            "\n".join(f"  {stat}" for stat in stats),
            kinds.most_common(TRACEMALLOC_TOP),
        )


def _traced_mb(snapshot: object) -> float:
    import tracemalloc

    assert isinstance(snapshot, tracemalloc.Snapshot)
    return sum(stat.size for stat in snapshot.statistics("filename")) / 2**20
