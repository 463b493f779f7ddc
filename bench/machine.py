"""Facts about the machine and the checkout that every benchmark report carries.

Split from :mod:`bench.load` (which re-exports them for :mod:`bench.soak`): the commit and the
uncommitted diff the gateway ran with, the CPU model, and per-core use read from ``/proc/stat``
(which share of each core was the gateway, the generator, or other processes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.report import CpuTimes, parse_cpu_times

__all__ = ["_core_shares", "_cpu_times", "_git_commit", "_machine", "_tree_diff"]

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def _tree_diff() -> dict[str, Any]:
    """Which uncommitted edits the gateway ran with: ``git diff HEAD`` by file, and its hash
    (the tree changes under a shared checkout; two runs compare only when these match)."""
    try:
        diff = subprocess.run(
            ["git", "diff", "HEAD"], cwd=REPO, capture_output=True, timeout=30, check=True
        ).stdout
        files = subprocess.run(
            ["git", "status", "--porcelain", "--", "appbridge"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"sha256": hashlib.sha256(diff).hexdigest()[:16], "appbridge_changes": files}


def _machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "memory_mb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20,
        "loadavg": os.getloadavg(),
    }


def _cpu_times() -> dict[int, CpuTimes]:
    return parse_cpu_times(Path("/proc/stat").read_text())


def _core_shares(
    before: dict[int, CpuTimes],
    after: dict[int, CpuTimes],
    window_s: float,
    gateway_cpu: int | None,
    gateway_pct: float,
    workers: list[Any],
    worker_pct: list[float],
) -> dict[int, dict[str, float]]:
    """Per core: busy and steal %, and how much of it was the gateway, the generator, others."""
    out: dict[int, dict[str, float]] = {}
    for cpu, end in after.items():
        if cpu not in before:
            continue
        delta = end.minus(before[cpu])
        busy_pct = 100.0 * delta.busy / CLOCK_TICKS_PER_S / window_s
        gw = gateway_pct if cpu == gateway_cpu else 0.0
        gen = sum(p for w, p in zip(workers, worker_pct, strict=True) if w.cpu == cpu)
        out[cpu] = {
            "busy_pct": round(busy_pct, 1),
            "steal_pct": round(100.0 * delta.steal / CLOCK_TICKS_PER_S / window_s, 1),
            "gateway_pct": round(gw, 1),
            "generator_pct": round(gen, 1),
            "others_pct": round(max(0.0, busy_pct - gw - gen), 1),
        }
    return out
