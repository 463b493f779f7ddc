"""``--cluster``: the same load with the call directory on, and what the directory costs.

With ``--cluster`` every step starts a real ``redis-server`` for its gateway (its own port on
127.0.0.1, its own temporary directory, ``--save "" --appendonly no``, pinned to the load
generator's core so it never takes the gateway's) and gives the gateway a ``[cluster]`` section
(docs/configuration.md; docs/scaling.md). :class:`DirectoryProbe` reads ``INFO commandstats``
at four marks of the step: before the ramp, at both ends of the measured window, and once every
call has ended and left the directory. From those come the Redis commands per call (the whole
run's commands over the calls, and the same without the heartbeats), the commands per
heartbeat (the window holds no call that opens or ends, so what it counts is the heartbeats;
each heartbeat sends one ``SADD``), the directory's bytes per call entry (``MEMORY USAGE``)
and redis-server's own CPU. Commands the probe sends itself are counted and left out.

The arithmetic is pure (:func:`directory_figures`, :func:`directory_lines`) and unit-tested in
tests/unit/test_cluster_bench.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from bench.gateway_proc import BENCH_NODE_ID, child_setup, free_loopback_port
from bench.report import parse_proc_stat_ticks

__all__ = [
    "DirectoryProbe",
    "RedisPeer",
    "commands_delta",
    "directory_figures",
    "directory_lines",
]

#: The heartbeat's pipeline sends one ``SADD`` (cluster/membership.py, ``heartbeat_steps``).
HEARTBEAT_MARKER: Final = "sadd"
#: How long the calls may take to leave the directory once the workers hung up.
DRAIN_TIMEOUT_S: Final = 15.0
START_TIMEOUT_S: Final = 10.0
_CLOCK_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")
#: Commands only the probe sends (the gateway never does): left out of every count.
PROBE_ONLY: Final = frozenset({"info", "memory|usage", "config|resetstat"})


def _redis_server() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if found is None:
        raise SystemExit("bench: --cluster needs redis-server; run deploy/install-test-peers.sh")
    return found


class RedisPeer:
    """One redis-server for one step, killed after it."""

    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        self.port = free_loopback_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="appbridge-bench-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - a fork/exec, it does not block
            [
                _redis_server(),
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", self._dir.name),
                *("--protected-mode", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_setup(self.cpu),
        )
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url, socket_timeout=1.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                try:
                    if await client.ping():
                        return
                except (OSError, aioredis.RedisError):
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        text = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return parse_proc_stat_ticks(text) / _CLOCK_TICKS_PER_S

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        self._dir.cleanup()


def commands_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """Commands run between two ``INFO commandstats`` answers (as redis-py parses them:
    ``cmdstat_<name>`` → ``{"calls": n, ...}``), by command name, zeros left out."""
    out: dict[str, int] = {}
    for key, stats in after.items():
        name = key.removeprefix("cmdstat_")
        old = before.get(key, {}).get("calls", 0)
        count = int(stats.get("calls", 0)) - int(old)
        if count:
            out[name] = count
    return out


class DirectoryProbe:
    """The marks of one step (module doc), on its own Redis connection."""

    def __init__(self, peer: RedisPeer) -> None:
        import redis.asyncio as aioredis

        self.peer = peer
        self.client = aioredis.Redis.from_url(peer.url, decode_responses=True, socket_timeout=2.0)
        self.marks: dict[str, tuple[float, dict[str, Any], float]] = {}
        # What the probe sent that the gateway sends too (``HLEN``), to subtract.
        self.own: Counter[str] = Counter()
        self.entry_bytes: float | None = None

    async def mark(self, name: str) -> None:
        stats = await self.client.info("commandstats")
        self.marks[name] = (time.monotonic(), dict(stats), self.peer.cpu_seconds())

    async def sample_entries(self) -> None:
        """The directory's bytes per call entry, while every call is up (after the window,
        before the hang-ups)."""
        from appbridge.cluster import keys

        key = keys.calls_key(BENCH_NODE_ID)
        size = await self.client.memory_usage(key, samples=0)
        entries = await self.client.hlen(key)
        self.own["hlen"] += 1
        if size and entries:
            self.entry_bytes = size / entries

    async def wait_drained(self) -> None:
        """Until every call has left the directory (bounded), then the last mark."""
        from appbridge.cluster import keys

        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            self.own["hlen"] += 1
            if not await self.client.hlen(keys.calls_key(BENCH_NODE_ID)):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the writer's last batch and the CallSid releases
        await self.mark("run_end")

    def figures(self, calls: int) -> dict[str, Any]:
        own = dict(self.own)
        return directory_figures(self.marks, own, calls, self.entry_bytes)

    async def aclose(self) -> None:
        await self.client.aclose()


def _between(
    marks: Mapping[str, tuple[float, dict[str, Any], float]],
    first: str,
    last: str,
    own: Mapping[str, int],
) -> tuple[float, dict[str, int], float]:
    t0, stats0, cpu0 = marks[first]
    t1, stats1, cpu1 = marks[last]
    counts = commands_delta(stats0, stats1)
    for name, mine in own.items():
        if name in counts:
            counts[name] = max(0, counts[name] - mine)
    counts = {name: n for name, n in counts.items() if n and name not in PROBE_ONLY}
    return t1 - t0, counts, cpu1 - cpu0


def directory_figures(
    marks: Mapping[str, tuple[float, dict[str, Any], float]],
    own: Mapping[str, int],
    calls: int,
    entry_bytes: float | None,
) -> dict[str, Any]:
    """The directory's cost from the four marks (module doc). ``own`` is what the probe sent
    between the first and the last mark, other than :data:`PROBE_ONLY` (nothing inside the
    window)."""
    run_s, run, run_cpu = _between(marks, "run_start", "run_end", own)
    window_s, window, window_cpu = _between(marks, "window_start", "window_end", {})
    beats_window = window.get(HEARTBEAT_MARKER, 0)
    per_beat = sum(window.values()) / beats_window if beats_window else None
    beats_run = run.get(HEARTBEAT_MARKER, 0)
    total = sum(run.values())
    without_beats = total - (per_beat or 0.0) * beats_run
    return {
        "calls": calls,
        "run_s": round(run_s, 2),
        "commands_run": run,
        "commands_total": total,
        "commands_per_call": round(total / calls, 2) if calls else None,
        "commands_per_call_without_heartbeats": round(without_beats / calls, 2) if calls else None,
        "heartbeats_run": beats_run,
        "commands_window": window,
        "heartbeats_window": beats_window,
        "commands_per_heartbeat": round(per_beat, 2) if per_beat is not None else None,
        "commands_per_s_window": round(sum(window.values()) / window_s, 2) if window_s else None,
        "directory_bytes_per_call": round(entry_bytes, 1) if entry_bytes else None,
        "redis_cpu_pct_run": round(100.0 * run_cpu / run_s, 2) if run_s else None,
        "redis_cpu_pct_window": round(100.0 * window_cpu / window_s, 2) if window_s else None,
    }


def directory_lines(fig: Mapping[str, Any]) -> list[str]:
    """The lines printed under a ``--cluster`` step's row."""
    by_command = ", ".join(f"{name} {n}" for name, n in sorted(fig["commands_run"].items()))
    return [
        f"  directory (Redis): {fig['commands_total']} commands over {fig['calls']} calls in "
        f"{fig['run_s']:g} s = {fig['commands_per_call']} per call "
        f"({fig['commands_per_call_without_heartbeats']} without the "
        f"{fig['heartbeats_run']} heartbeats); {fig['commands_per_heartbeat']} commands per "
        f"heartbeat ({fig['heartbeats_window']} in the window, "
        f"{fig['commands_per_s_window']} commands/s)",
        f"  directory (Redis): by command over the run: {by_command}; "
        f"{fig['directory_bytes_per_call']} bytes per call entry; redis-server CPU "
        f"{fig['redis_cpu_pct_run']} % of a core over the run, "
        f"{fig['redis_cpu_pct_window']} % in the window",
    ]


def ab_lines(steps: list[dict[str, Any]]) -> list[str]:
    """``--cluster ab``: CPU per call without and with the directory, per call count, each
    step's figure listed in run order with the core speed probe beside it (bench/speed.py)."""
    lines: list[str] = []
    for offered in sorted({int(s["offered"]) for s in steps}):
        parts = []
        for on in (False, True):
            runs = [s for s in steps if s["offered"] == offered and bool(s.get("cluster")) == on]
            cpu = [s["gateway_cpu_pct_per_call"] for s in runs if s["gateway_cpu_pct_per_call"]]
            if not cpu:
                continue
            each = ", ".join(
                f"{c:.3f} (probe {'/'.join(f'{p:.1f}' for p in s['core_probe_ms'])} ms)"
                for c, s in zip(cpu, runs, strict=False)
            )
            mean = sum(cpu) / len(cpu)
            parts.append(f"{'with' if on else 'without'} the directory {mean:.3f} [{each}]")
        if parts:
            lines.append(f"cluster A/B at {offered} calls, gateway CPU %/call: " + "; ".join(parts))
    return lines
