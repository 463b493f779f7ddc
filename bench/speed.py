"""How fast the gateway's core runs right now: a fixed piece of CPU-bound Python, timed.

Why: this machine is a virtual machine whose host is shared, and the speed it gives a vCPU
moves by far more than the changes the benchmark is meant to show, with the machine otherwise
idle and no steal time reported (docs/PERFORMANCE.md, "Method"). A figure is only comparable with
another taken at the same speed, so every step now says what the speed was.

What: a child process pinned to the core runs :data:`REFERENCE` (dict, tuple, bytes slicing and
int work: the kind of work the per-frame path does) several times and reports the fastest run
in milliseconds, right before the step's processes start and right after they stop, with
nothing else of the benchmark running. Lower is faster; the same checkout and machine give the
same figure in a quiet period (about 25 ms here), and a probe well above it marks a step
measured while the host was busy.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["REFERENCE", "probe_core"]

REFERENCE = """
import os, sys, time
cpu = int(sys.argv[1])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
def work():
    table = {}
    acc = 0
    data = bytes(range(256)) * 2
    for i in range(60000):
        table[i & 1023] = (i, data[i & 255])
        acc += len(data[i & 127 : (i & 127) + 160])
        acc ^= hash((i, acc & 0xFFFF))
    return acc
best = None
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    work()
    spent = time.perf_counter() - started
    best = spent if best is None else min(best, spent)
print(f"{best * 1e3:.2f}")
"""


def probe_core(cpu: int | None, repeats: int = 5, timeout_s: float = 30.0) -> float | None:
    """The fastest of ``repeats`` runs of :data:`REFERENCE` on ``cpu`` (any core when None), in
    ms; None when the probe could not run (it never fails a benchmark)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", REFERENCE, str(-1 if cpu is None else cpu), str(repeats)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        return float(done.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
