"""``--soak SECONDS``: N calls kept up for minutes; do memory, fds, threads and tasks stay flat?

The question: over a 10-minute soak at 80 % of capacity, do memory, file descriptors and task
counts stay flat, and what is their slope? One gateway process (pinned as in :mod:`bench.load`)
carries ``--calls`` calls (120 by default) from :mod:`bench.soak_worker` processes (the lean
peers and ``--dialect`` as the ramp); each call lives 60-120 s and is then replaced, so set-up
and tear-down run all along. Every ``SAMPLE_PERIOD_S`` the orchestrator reads the gateway's
``VmRSS`` and ``Threads`` (``/proc/<pid>/status``), its open file descriptors (entries of
``/proc/<pid>/fd``) and, from ``/metrics``, ``appbridge_calls_live`` and
``appbridge_asyncio_tasks``. Per metric it reports the least-squares slope per minute, the first
and last values, and a verdict (:func:`assess`):

* **memory** is flat when, after the warm-up (``--warmup``, :data:`WARMUP_S` by default:
  allocator pools, caches, first calls), the fitted growth over 10 minutes is below 1 % of the
  fitted value at the end of warm-up;
* **counts** (fds, threads, tasks, calls live) are flat when the median of the last third of the
  samples after warm-up is back within the first third's range (its maximum plus a slack of
  max(2, 5 %)) *and* the fitted growth over 10 minutes is within that slack: the calls churn, so
  one sample can catch a burst of set-ups (a transient), but a leak of one per call ended would
  add hundreds.

Pacing (the gateway's tick-lateness histogram and resyncs, over the whole soak) and the callers'
figures (clear-to-silence, jitter, inbound latency, frames lost, measured per call over its
life) come with it. The pure part (:func:`least_squares_slope`, :func:`assess`) is unit-tested.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_proc import (
    GatewayProcess,
    GatewaySpec,
    worker_number,
)
from bench.load import (
    GENERATOR_CPU_LIMIT_PCT,
    LATENESS_METRIC,
    WorkerProc,
    _split,
    dialect_line,
    report_head,
    start_gateway,
    stop_all,
    worker_env,
)
from bench.machine import _core_shares, _cpu_times
from bench.report import (
    Summary,
    bound_cell,
    format_table,
    histogram_delta,
    paced_collections,
    paced_collections_line,
    parse_histogram,
    parse_metric,
)
from bench.soak_worker import SAMPLE_FIELDS
from bench.speed import probe_core

__all__ = ["SAMPLE_PERIOD_S", "WARMUP_S", "Trend", "assess", "least_squares_slope", "run_soak"]

SAMPLE_PERIOD_S = 10.0
WARMUP_S = 60.0
#: How far the fit is projected for the verdict (the soak's length, bench/README.md).
HORIZON_S = 600.0
MEMORY_TOLERANCE_FRAC = 0.01
COUNT_TOLERANCE_FRAC = 0.05
COUNT_MIN_SLACK = 2.0
#: Which sampled series are memory (relative rule) and which are counts (range rule).
METRICS = {
    "rss_mb": "memory",
    "fds": "count",
    "threads": "count",
    "asyncio_tasks": "count",
    "calls_live": "count",
}


class SoakWorkerProc(WorkerProc):
    module = "bench.soak_worker"


# ---------------------------------------------------------------------- the pure part
def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope (value per second) of the ordinary least-squares line through ``(t_s, value)``.

    None with fewer than two distinct instants (no line is defined).
    """
    n = len(points)
    if n < 2:
        return None
    mean_t = math.fsum(t for t, _ in points) / n
    mean_v = math.fsum(v for _, v in points) / n
    var_t = math.fsum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0.0:
        return None
    return math.fsum((t - mean_t) * (v - mean_v) for t, v in points) / var_t


@dataclass(frozen=True)
class Trend:
    """One metric over the soak: first/last sample, fitted slope after warm-up, verdict."""

    name: str
    kind: str  # "memory" or "count"
    start: float
    end: float
    low: float
    high: float
    slope_per_min: float | None  # fitted over the samples after warm-up
    growth_10min: float | None  # slope projected over HORIZON_S
    allowed_10min: float | None  # what the rule tolerates over HORIZON_S
    flat: bool | None  # None: too few samples after warm-up to say
    rule: str
    #: Fitted over the last third of the samples after warm-up only. Not part of the verdict: it
    #: shows whether a rise has levelled off (the registry's history of ended calls, bounded at
    #: 1000, grows memory until it is full, and a 10-minute soak may end just after that).
    last_third_slope_per_min: float | None = None


def assess(
    name: str,
    kind: str,
    points: Sequence[tuple[float, float]],
    *,
    warmup_s: float = WARMUP_S,
    horizon_s: float = HORIZON_S,
) -> Trend:
    """The verdict for one series of ``(seconds since the soak started, value)`` (module doc)."""
    if not points:
        raise ValueError(f"{name}: no samples")
    values = [v for _, v in points]
    steady = [(t, v) for t, v in points if t >= warmup_s]
    slope_s = least_squares_slope(steady) if len(steady) >= 3 else None
    tail = steady[-max(3, len(steady) // 3) :] if len(steady) >= 3 else []
    tail_slope_s = least_squares_slope(tail) if tail else None
    trend = Trend(
        name=name,
        kind=kind,
        start=values[0],
        end=values[-1],
        low=min(values),
        high=max(values),
        slope_per_min=None if slope_s is None else slope_s * 60.0,
        growth_10min=None if slope_s is None else slope_s * horizon_s,
        allowed_10min=None,
        flat=None,
        rule="fewer than 3 samples after warm-up",
        last_third_slope_per_min=None if tail_slope_s is None else tail_slope_s * 60.0,
    )
    if slope_s is None:
        return trend
    growth = slope_s * horizon_s
    if kind == "memory":
        t_first = steady[0][0]
        mean_t = math.fsum(t for t, _ in steady) / len(steady)
        mean_v = math.fsum(v for _, v in steady) / len(steady)
        fitted_at_warmup = mean_v + slope_s * (t_first - mean_t)
        allowed = MEMORY_TOLERANCE_FRAC * fitted_at_warmup
        return replace(
            trend,
            allowed_10min=allowed,
            flat=growth < allowed,
            rule=f"growth over {horizon_s / 60:g} min after warm-up < "
            f"{MEMORY_TOLERANCE_FRAC:.0%} of the value at warm-up end",
        )
    third = max(1, len(steady) // 3)
    first_high = max(v for _, v in steady[:third])
    last_typical = statistics.median(v for _, v in steady[-third:])
    slack = max(COUNT_MIN_SLACK, COUNT_TOLERANCE_FRAC * first_high)
    return replace(
        trend,
        allowed_10min=slack,
        flat=last_typical <= first_high + slack and growth <= slack,
        rule=f"median of the last third within the first third's max + max({COUNT_MIN_SLACK:g},"
        f" {COUNT_TOLERANCE_FRAC:.0%}), and growth over {horizon_s / 60:g} min within that slack",
    )


def _status_field(status_text: str, field: str) -> int:
    for line in status_text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/<pid>/status")


# ---------------------------------------------------------------------- the run
def _sample_gateway(pid: int, metrics_text: str) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        "rss_mb": round(_status_field(status, "VmRSS") / 1024.0, 2),
        "threads": _status_field(status, "Threads"),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "asyncio_tasks": parse_metric(metrics_text, "appbridge_asyncio_tasks"),
        "calls_live": parse_metric(metrics_text, "appbridge_calls_live"),
        "calls_started": parse_metric(metrics_text, "appbridge_calls_started_total"),
    }


def _worst(summaries: list[dict[str, Any]]) -> Summary:
    """Several workers' p50/p99/max cannot be pooled without the samples: the worst of each."""
    found = [s for s in summaries if s.get("count")]
    if not found:
        return Summary(0, None, None, None)
    return Summary(
        sum(int(s["count"]) for s in found),
        max(float(s["p50"]) for s in found),
        max(float(s["p99"]) for s in found),
        max(float(s["max"]) for s in found),
    )


async def run_soak(args: argparse.Namespace) -> int:
    calls = int(args.calls[0])
    out_dir = Path(args.out)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report: dict[str, Any] = {
        **report_head(args),
        "rules": {
            "warmup_s": args.warmup,
            "sample_period_s": SAMPLE_PERIOD_S,
            "memory": f"flat when the fitted growth over {HORIZON_S:g} s after warm-up is below "
            f"{MEMORY_TOLERANCE_FRAC:.0%} of the value at warm-up end",
            "counts": "flat when the median of the last third of the samples stays under the "
            "first third's "
            f"max + max({COUNT_MIN_SLACK:g}, {COUNT_TOLERANCE_FRAC:.0%}) and the fitted growth "
            f"over {HORIZON_S:g} s is within that slack",
        },
    }
    print(
        f"soak: commit {report['commit']}; {calls} calls for {args.soak:g} s, each living "
        f"{args.lifetime[0]:g}-{args.lifetime[1]:g} s; gateway ({args.gateway_loop}) on CPU "
        f"{args.gateway_cpu}, {args.workers} worker(s) on {args.load_cpus}; "
        f"{dialect_line(args)}",
        flush=True,
    )
    env = worker_env(args)
    load_cpus = args.load_cpus or [None]
    workers: list[WorkerProc] = [
        SoakWorkerProc(k, load_cpus[k % len(load_cpus)], env, out_dir / f"soak-worker-{k}.log")
        for k in range(args.workers)
    ]
    gateway: GatewayProcess | None = None
    failed = False
    probe_before = await asyncio.to_thread(probe_core, args.gateway_cpu)
    try:
        await asyncio.gather(*(w.start() for w in workers))
        gateway, spec = await start_gateway(args, calls, workers, env, out_dir, "gateway-soak")
        report.update(await _soak(calls, args, gateway, spec, workers))
    except Exception as exc:
        failed = True
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(f"soak: failed: {report['error']}", flush=True)
    finally:
        await stop_all(workers, gateway)
    # How fast the gateway's core ran around the soak (bench/speed.py): this VM's speed moves.
    report["core_probe_ms"] = [probe_before, await asyncio.to_thread(probe_core, args.gateway_cpu)]
    print(
        "soak: core speed probe before/after (bench/speed.py; lower is faster): "
        + "/".join("-" if v is None else f"{v:.1f}" for v in report["core_probe_ms"])
        + " ms",
        flush=True,
    )
    path = out_dir / f"soak-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"soak: results in {path}")
    return 1 if failed else 0


async def _soak(
    calls: int,
    args: argparse.Namespace,
    gateway: GatewayProcess,
    spec: GatewaySpec,
    workers: list[WorkerProc],
) -> dict[str, Any]:
    base_url = spec.base_url
    await asyncio.sleep(args.settle)
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:

        async def metrics() -> str:
            return (await client.get(base_url + "/metrics")).text

        idle = _sample_gateway(gateway.pid, await metrics())
        shares = _split(calls, len(workers))
        ramps = await asyncio.gather(
            *(
                w.call(
                    "soak_start",
                    calls / args.ramp_rate + args.up_timeout + 30,
                    base_url=base_url,
                    calls=n,
                    to=worker_number(w.index),
                    rate=args.ramp_rate * n / calls,
                    lifetime_s=list(args.lifetime),
                    sip=None if spec.sip_port is None else ["127.0.0.1", spec.sip_port],
                    sip_share=args.sip_share,
                    up_timeout=args.up_timeout,
                )
                for w, n in zip(workers, shares, strict=True)
                if n > 0
            )
        )
        await asyncio.sleep(args.settle)
        metrics_before = await metrics()
        cores_before = _cpu_times()
        gw_cpu0 = gateway.cpu_seconds()
        gen_before = [await w.call("sample", 30.0) for w in workers]
        t0 = time.monotonic()
        samples: list[dict[str, Any]] = []
        headers = ("t s", "RSS MB", "fds", "threads", "tasks", "live", "up", "placed", "failed")
        print(format_table(headers, []), flush=True)
        while True:
            now = time.monotonic()
            gen = [await w.call("sample", 30.0) for w in workers]
            sample = {
                "t_s": round(now - t0, 2),
                **_sample_gateway(gateway.pid, await metrics()),
                "calls_up_at_apps": sum(int(g["up"]) for g in gen),
                "calls_placed": sum(int(g["placed"]) for g in gen),
                "calls_failed": sum(int(g["failed"]) for g in gen),
                "loadavg_1min": os.getloadavg()[0],
            }
            samples.append(sample)
            row = [sample[k] for k in ("t_s", "rss_mb", "fds", "threads", "asyncio_tasks")]
            row += [sample[k] for k in ("calls_live", "calls_up_at_apps", "calls_placed")]
            row.append(sample["calls_failed"])
            print(format_table(headers, [[f"{v:g}" for v in row]]).splitlines()[-1], flush=True)
            if now - t0 >= args.soak or not gateway.alive():
                break
            await asyncio.sleep(max(0.0, t0 + len(samples) * SAMPLE_PERIOD_S - time.monotonic()))
        gen_after = [await w.call("sample", 30.0) for w in workers]
        t1 = time.monotonic()
        gw_cpu1 = gateway.cpu_seconds()
        cores_after = _cpu_times()
        metrics_after = await metrics()
    finishes = await asyncio.gather(
        *(w.call("soak_finish", 2 * args.up_timeout + 30, timeout=args.up_timeout) for w in workers)
    )
    return _summarise(
        calls, args, samples, idle, ramps, finishes, gen_before, gen_after, workers,
        (t0, t1), (gw_cpu0, gw_cpu1), (cores_before, cores_after),
        (metrics_before, metrics_after),
    )  # fmt: skip


def _summarise(
    calls: int,
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    idle: dict[str, float],
    ramps: list[dict[str, Any]],
    finishes: list[dict[str, Any]],
    gen_before: list[dict[str, Any]],
    gen_after: list[dict[str, Any]],
    workers: list[WorkerProc],
    window: tuple[float, float],
    gw_cpu: tuple[float, float],
    cores: tuple[Any, Any],
    metrics: tuple[str, str],
) -> dict[str, Any]:
    window_s = window[1] - window[0]
    trends = [
        assess(
            name,
            kind,
            [(float(s["t_s"]), float(s[name])) for s in samples],
            warmup_s=args.warmup,
        )
        for name, kind in METRICS.items()
    ]
    gw_pct = 100.0 * (gw_cpu[1] - gw_cpu[0]) / window_s
    gen_pct = [
        100.0 * (a["cpu_s"] - b["cpu_s"]) / window_s
        for b, a in zip(gen_before, gen_after, strict=True)
    ]
    core_use = _core_shares(
        cores[0], cores[1], window_s, args.gateway_cpu, gw_pct, workers, gen_pct
    )
    valid = all(p <= GENERATOR_CPU_LIMIT_PCT for p in gen_pct) and all(
        c["generator_pct"] <= GENERATOR_CPU_LIMIT_PCT for c in core_use.values()
    )
    lateness = histogram_delta(
        parse_histogram(metrics[0], LATENESS_METRIC), parse_histogram(metrics[1], LATENESS_METRIC)
    )
    figs = [f["figures"] for f in finishes]
    caller = {name: _worst([f[name + "_summary"] for f in figs]) for name in SAMPLE_FIELDS}

    def total(key: str) -> int:
        return sum(int(f[key]) for f in figs)

    def counter(name: str) -> float:
        return parse_metric(metrics[1], name) - parse_metric(metrics[0], name)

    noise = (
        core_use.get(args.gateway_cpu, {}).get("others_pct")
        if args.gateway_cpu is not None
        else None
    )
    loads = [float(s["loadavg_1min"]) for s in samples]
    result: dict[str, Any] = {
        "calls": calls,
        "soak_s": round(window_s, 1),
        "idle": idle,
        "ramps": ramps,
        "samples": samples,
        "trends": [asdict(t) for t in trends],
        "all_flat": all(t.flat for t in trends),
        "gateway_cpu_pct": round(gw_pct, 1),
        "generator_cpu_pct": [round(p, 1) for p in gen_pct],
        "valid": valid,
        "cores": core_use,
        "noise_pct": noise,
        "loadavg_1min_min_max": [min(loads), max(loads)],
        "tick_lateness_ms": {
            "bucketed": True,
            "count": lateness.count,
            "p50_le": lateness.quantile_bound(0.50),
            "p99_le": lateness.quantile_bound(0.99),
            "max_le": lateness.max_bound(),
            "cumulative": dict(zip(map(str, lateness.bounds), lateness.cumulative, strict=True)),
        },
        "tick_resyncs": counter("appbridge_media_tick_resyncs_total"),
        "gc": paced_collections(metrics[0], metrics[1]),
        "calls_started": counter("appbridge_calls_started_total"),
        "calls_rejected": counter("appbridge_calls_rejected_total"),
        "app_unreachable": counter("appbridge_app_unreachable_total"),
        "caller": {k: v.as_dict() for k, v in caller.items()},
        "clears_sent": total("clears_sent"),
        "clears_at_caller": total("clears_at_caller"),
        "frames_expected": total("frames_expected"),
        "frames_lost": total("frames_lost"),
        "bursts_silent": total("bursts_silent"),
        "marks_sent": total("marks_sent"),
        "marks_echoed": total("marks_echoed"),
        "marks_duplicated": total("marks_duplicated"),
        "app_protocol_errors": total("app_protocol_errors"),
        "caller_protocol_errors": total("caller_protocol_errors"),
        "dialect": args.dialect,
        "speak": args.speak,
        "workers": [{k: v for k, v in f.items() if k != "figures"} for f in finishes],
    }
    rows = [
        [
            t.name,
            f"{t.start:g}",
            f"{t.end:g}",
            f"{t.low:g}-{t.high:g}",
            "-" if t.slope_per_min is None else f"{t.slope_per_min:+.3f}",
            "-" if t.last_third_slope_per_min is None else f"{t.last_third_slope_per_min:+.3f}",
            "-" if t.growth_10min is None else f"{t.growth_10min:+.2f} (≤{t.allowed_10min:.2f})",
            {True: "flat", False: "GROWING", None: "?"}[t.flat],
        ]
        for t in trends
    ]
    print()
    print(
        format_table(
            (
                "metric",
                "start",
                "end",
                "range",
                "slope/min",
                "last third/min",
                "10-min fit",
                "verdict",
            ),
            rows,
        )
    )
    print(
        f"slopes and verdicts over the samples after the first {args.warmup:g} s (--warmup); "
        "start, end and range over all of them",
        flush=True,
    )
    tick = "/".join(
        bound_cell(v)
        for v in (lateness.quantile_bound(0.5), lateness.quantile_bound(0.99), lateness.max_bound())
    )
    ended = sum(int(f["completed"]) for f in finishes)
    print(
        f"soak {window_s:.0f} s, {calls} calls: tick late p50/p99/max {tick} ms (bucketed), "
        f"resyncs {result['tick_resyncs']:g}; clear→silence {caller['clear_to_silence_ms'].cell()} "
        f"ms, clears at caller {result['clears_at_caller']}/{result['clears_sent']}; caller jitter "
        f"{caller['jitter_ms'].cell()} ms; inbound {caller['inbound_latency_ms'].cell()} ms; "
        f"frames lost {result['frames_lost']}/{result['frames_expected']}; marks echoed "
        f"{result['marks_echoed']}/{result['marks_sent']}; calls started "
        f"{result['calls_started']:g}, ended by the soak {ended}, failed "
        f"{sum(int(f['failed']) for f in finishes)}, dropped "
        f"{sum(int(f['dropped']) for f in finishes)}; gw CPU {gw_pct:.1f} %, gen CPU "
        f"{'+'.join(f'{p:.0f}' for p in gen_pct)} % ({'valid' if valid else 'INVALID'}); "
        f"noise {noise} %, load avg {min(loads):.1f}-{max(loads):.1f}",
        flush=True,
    )
    print(paced_collections_line(result["gc"]), flush=True)
    return result
