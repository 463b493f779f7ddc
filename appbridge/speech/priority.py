"""Speech worker threads run at a lower CPU priority than the event loop.

Why: synthesis (eSpeak NG) and local recognition are CPU-bound C code that runs with the GIL
released, so the operating system, not the interpreter, decides who runs when a worker and the
event loop want the same core. At equal priority the loop waits for the worker's time slice:
caller packets, app frames and media ticks are late by up to a few milliseconds whenever a
``speak`` is being synthesised. That is the case the benchmark measures (one gateway process pinned
to one core), and on a loaded multi-core machine the same contention happens. Speech work is
not time-critical at that scale (its audio is buffered ahead of playout); the media loop is.

What: each worker thread raises its own nice value by :data:`WORKER_NICE_INCREMENT` when it
starts (Linux's ``setpriority(PRIO_PROCESS, tid)`` acts on one thread; threads a library starts
from it inherit the value). Under contention the loop then gets most of the core, and a worker
that wakes does not preempt it. Where the call is refused or not supported the thread keeps the
process's priority and nothing else changes.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = ["WORKER_NICE_INCREMENT", "lower_current_thread_priority"]

log = logging.getLogger(__name__)

#: nice +10: about a tenth of the CPU weight of a nice-0 thread under the Linux scheduler.
WORKER_NICE_INCREMENT = 10


def lower_current_thread_priority(increment: int = WORKER_NICE_INCREMENT) -> bool:
    """Raise the calling thread's nice value by ``increment``; True when it took effect.

    Meant as a ``ThreadPoolExecutor`` ``initializer``: it runs once in each worker thread.
    """
    setpriority = getattr(os, "setpriority", None)
    getpriority = getattr(os, "getpriority", None)
    if setpriority is None or getpriority is None or increment <= 0:
        return False
    tid = threading.get_native_id()
    try:
        current = getpriority(os.PRIO_PROCESS, tid)
        setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError as exc:
        log.debug("speech worker keeps the process's CPU priority: %s", exc)
        return False
    return True
