"""``make bench``: N concurrent Twilio calls on loopback against fake apps that talk back.

Usage: ``python -m bench.load [--calls 50,100,200 [--until-break]] [--hold 30] [--workers 1]``
(no ``--calls``: the bounded ramp 50, 100, 200, ..., 1000, stopping at the first broken bar)
(``make bench BENCH_ARGS="--calls 50,100 --hold 20"``).

Each step of the ramp gets a fresh gateway, run as its own process (``appbridge serve``) pinned
to one core, and fresh load-generator workers (:mod:`bench.worker`) pinned to the others: they
play Twilio (callers placing calls through ``POST /twilio/voice`` and the Media Stream, and the
REST API) and the apps: fonoster ones, or with ``--dialect twilio`` Pipecat-style Twilio Media
Streams ones (bench/pipecat_app.py), on the lean peers (bench/README.md). Once every
call of the step is up the calls are held for ``--hold`` seconds; every figure of the table is
measured over that window only; then the callers hang up and the gateway is stopped. This
process only orchestrates and samples /proc and ``/metrics``. Method and figures:
docs/PERFORMANCE.md; the columns: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.analysis import CallerFigures
from bench.bars import DEFAULT_RAMP, bar_failures, final_line
from bench.directory_cost import DirectoryProbe, RedisPeer, ab_lines, directory_lines
from bench.gateway_proc import (
    GatewayProcess,
    GatewaySpec,
    child_setup,
    free_loopback_port,
    free_loopback_udp_port,
    free_rtp_range,
    loop_env,
    render_config,
    worker_number,
)
from bench.machine import _core_shares, _cpu_times, _git_commit, _machine, _tree_diff
from bench.options import build_parser
from bench.report import (
    bound_cell,
    format_table,
    histogram_delta,
    number_cell,
    paced_collections,
    parse_histogram,
    parse_metric,
    step_detail_lines,
)
from bench.sip_secure import gateway_fields, prepare, ramp_fields, secure_line
from bench.slow_http import slow_clients
from bench.speed import probe_core
from bench.stt_load import stt_figures, stt_line

ACCOUNT_SID = "AC" + "be" * 16
LATENESS_METRIC = "appbridge_media_tick_lateness_ms"
DROPPED_METRIC = "appbridge_audio_frames_dropped_total"
#: The validity bar: a load generator busier than this (per core) distorts what it measures.
GENERATOR_CPU_LIMIT_PCT = 70.0
#: Other processes using more than this share of the gateway's core make the step noisy.
NOISY_PCT = 10.0
#: ``--soak`` without ``--calls``: about 80 % of what one worker validly drives on the 2-core
#: reference machine (150 calls under the 70 % generator bar, docs/PERFORMANCE.md).
DEFAULT_SOAK_CALLS = 120
REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")

HEADERS = (
    "offered",
    "held",
    "gw CPU%",
    "CPU%/call",
    "RSS MB",
    "RSS KB/call",
    "tick late p50/p99/max ms*",
    "caller jitter p50/p99/max ms",
    "clear→silence p50/p99/max ms",
    "inbound p50/p99/max ms",
    "frames lost",
    "gen CPU%",
    "noise%",
    "valid",
)


# ---------------------------------------------------------------------- the gateway
def _gateway_executable() -> str:
    local = Path(sys.executable).with_name("appbridge")
    if local.exists():
        return str(local)
    found = shutil.which("appbridge")
    if found is None:
        raise SystemExit("bench: the appbridge console script is not installed (make install)")
    return found


def dialect_line(args: argparse.Namespace) -> str:
    """What the apps are and how the calls arrive, for the lines above the table."""
    if args.dialect == "twilio":
        return (
            "dialect twilio: Twilio-ingress callers only, Pipecat-style Media Streams apps "
            "sending at 2x real time"
        )
    return (
        f"dialect fonoster: SIP share {args.sip_share:g}, fonoster apps (pcm16 16 kHz), "
        f"speak {args.speak}, STT {args.stt}, callers {args.caller}; {secure_line(args)}"
    )


# ---------------------------------------------------------------------- workers
class WorkerProc:
    """A :mod:`bench.worker` child, spoken to one JSON line at a time."""

    #: The worker's module (``bench.soak_worker`` for ``--soak``).
    module = "bench.worker"

    def __init__(self, index: int, cpu: int | None, env: dict[str, str], log_path: Path):
        self.index = index
        self.cpu = cpu
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.hello: dict[str, Any] = {}

    async def start(self, timeout_s: float = 30.0) -> None:
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.module,
                str(self.index),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=REPO,
                preexec_fn=child_setup(self.cpu),
                limit=256 * 2**20,
            )
        self.hello = await self._read(timeout_s)

    async def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"worker {self.index} exited; see {self.log_path}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"worker {self.index}: {answer.get('error')}; see {self.log_path}")
        return answer

    async def call(self, cmd: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._read(timeout_s)

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            await self.call("stop", 60.0)
        try:
            await asyncio.wait_for(proc.wait(), 30.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _all(workers: list[WorkerProc], cmd: str, timeout_s: float, **kw: Any) -> list[Any]:
    return list(await asyncio.gather(*(w.call(cmd, timeout_s, **kw) for w in workers)))


# ---------------------------------------------------------------------- one step
def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the workers and the gateway: fresh secrets for every run, and what
    the workers read (bench/worker.py ``DIALECT_ENV``, ``SPEAK_ENV``)."""
    env = dict(os.environ)
    env.update(
        BENCH_TWILIO_TOKEN=secrets.token_hex(16),
        BENCH_APP_SECRET=secrets.token_hex(16),
        BENCH_ACCOUNT_SID=ACCOUNT_SID,
        BENCH_DIALECT=args.dialect,
        BENCH_SPEAK=args.speak,
        BENCH_CALLER=args.caller,
        BENCH_CLUSTER_SECRET=secrets.token_hex(16),
    )
    return env


async def stop_all(workers: list[WorkerProc], gateway: GatewayProcess | None) -> None:
    """Stop the workers, then the gateway (SIGINT, SIGKILL if it lingers); each step and the
    soak end this way whether they measured or failed."""
    await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
    if gateway is not None:
        try:
            await gateway.stop()
        finally:
            gateway.kill_now()


async def start_gateway(
    args: argparse.Namespace,
    calls: int,
    workers: list[WorkerProc],
    env: dict[str, str],
    out_dir: Path,
    name: str,
    redis_url: str | None = None,
) -> tuple[GatewayProcess, GatewaySpec]:
    """Start the gateway process against the workers' fakes (``name``.toml, ``name``.log);
    with ``redis_url``, as a node of a cluster (``--cluster``, bench/directory_cost.py)."""
    spec = GatewaySpec(
        port=free_loopback_port(),
        rest_base_url=workers[0].hello["rest_base_url"],
        app_urls=tuple(w.hello["app_url"] for w in workers),
        account_sid=ACCOUNT_SID,
        max_calls=args.overload if args.overload else max(1000, 2 * calls),
        sip_port=free_loopback_udp_port() if args.sip_share > 0 else None,
        rtp_ports=free_rtp_range(calls),
        dialect=args.dialect,
        cluster_redis_url=redis_url,
        stt=args.stt,
        **gateway_fields(args),
    )
    config_path = out_dir / f"{name}.toml"
    config_path.write_text(render_config(spec))
    gw_env = dict(env, APPBRIDGE_LOG_LEVEL=args.gateway_log_level)
    gateway = GatewayProcess(
        _gateway_executable(),
        config_path,
        env=loop_env(args.gateway_loop, Path(args.shim_dir), gw_env),
        cpu=args.gateway_cpu,
        log_path=out_dir / f"{name}.log",
    )
    await gateway.start(spec.base_url)
    return gateway, spec


async def run_step(
    calls: int, args: argparse.Namespace, out_dir: Path, cluster: bool = False
) -> tuple[dict[str, Any], list[str]]:
    env = worker_env(args)
    load_cpus = args.load_cpus or [None]
    workers = [
        WorkerProc(k, load_cpus[k % len(load_cpus)], env, out_dir / f"worker-{calls}-{k}.log")
        for k in range(args.workers)
    ]
    gateway: GatewayProcess | None = None
    # --cluster: a redis-server of the step's own, on the generator's core.
    peer = RedisPeer(load_cpus[0]) if cluster else None
    probe: DirectoryProbe | None = None
    probe_before = await asyncio.to_thread(probe_core, args.gateway_cpu)
    try:
        await asyncio.gather(*(w.start() for w in workers))
        if peer is not None:
            await peer.start()
            probe = DirectoryProbe(peer)
        name = f"gateway-{calls}" + ("-cluster" if cluster else "")
        redis_url = peer.url if peer is not None else None
        gateway, spec = await start_gateway(args, calls, workers, env, out_dir, name, redis_url)
        data, row = await _measure(calls, args, gateway, spec, workers, probe)
    finally:
        await stop_all(workers, gateway)
        if probe is not None:
            await probe.aclose()
        if peer is not None:
            peer.stop()
    # How fast the gateway's core ran around the step (bench/speed.py): this VM's speed moves.
    data["core_probe_ms"] = [probe_before, await asyncio.to_thread(probe_core, args.gateway_cpu)]
    return data, row


async def _measure(
    calls: int,
    args: argparse.Namespace,
    gateway: GatewayProcess,
    spec: GatewaySpec,
    workers: list[WorkerProc],
    probe: DirectoryProbe | None = None,
) -> tuple[dict[str, Any], list[str]]:
    base_url = spec.base_url
    await asyncio.sleep(args.settle)
    rss_idle = gateway.rss_bytes()
    if probe is not None:
        await probe.mark("run_start")
    shares = _split(calls, len(workers))

    async def ramp(worker: WorkerProc, n: int) -> dict[str, Any]:
        if n == 0:
            return {"placed_ok": 0, "up": 0, "errors": [], "ramp_s": 0.0}
        return await worker.call(
            "ramp",
            calls / args.ramp_rate + 2 * args.up_timeout + 30,
            base_url=base_url,
            calls=n,
            to=worker_number(worker.index),
            rate=args.ramp_rate * n / calls,
            up_timeout=args.up_timeout,
            sip_share=args.sip_share,
            **ramp_fields(args, spec),
        )

    ramps = await asyncio.gather(*(ramp(w, n) for w, n in zip(workers, shares, strict=True)))
    await asyncio.sleep(args.settle)

    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        metrics_before = (await client.get(base_url + "/metrics")).text
        cores_before = _cpu_times()
        gw_cpu0 = gateway.cpu_seconds()
        gw_split0 = gateway.cpu_split_seconds()
        t0 = time.monotonic()
        if probe is not None:
            await probe.mark("window_start")
        starts = await _all(workers, "window_start", 30.0)
        slow = slow_clients(base_url, args.slow_http, args.load_cpus)
        rss_peak = gateway.rss_bytes()
        while time.monotonic() < t0 + args.hold and gateway.alive():
            await asyncio.sleep(min(1.0, max(0.0, t0 + args.hold - time.monotonic())))
            rss_peak = max(rss_peak, gateway.rss_bytes())
        ends = await _all(workers, "window_end", 30.0)
        slow_figures = await slow.stop() if slow is not None else None
        if probe is not None:
            await probe.mark("window_end")
        t1 = time.monotonic()
        gw_cpu1 = gateway.cpu_seconds()
        gw_split1 = gateway.cpu_split_seconds()
        cores_after = _cpu_times()
        rss_end = gateway.rss_bytes()
        metrics_after = (await client.get(base_url + "/metrics")).text
    window_s = t1 - t0
    if probe is not None:
        await probe.sample_entries()
    finishes = await _all(workers, "finish", 120.0, window=[t0, t1], timeout=args.up_timeout)
    if probe is not None:
        await probe.wait_drained()
    figures = CallerFigures()
    by_carrier = {"sip": CallerFigures(), "twilio": CallerFigures()}
    for answer in finishes:
        figures.merge(CallerFigures.from_wire(answer["figures"]))
        for carrier, wire in answer.get("by_carrier", {}).items():
            by_carrier[carrier].merge(CallerFigures.from_wire(wire))

    held = sum(int(e["held"]) for e in ends)
    gw_cpu_pct = 100.0 * (gw_cpu1 - gw_cpu0) / window_s
    gen_pct = [
        100.0 * (e["cpu_s"] - s["cpu_s"]) / window_s for s, e in zip(starts, ends, strict=True)
    ]
    cores = _core_shares(
        cores_before, cores_after, window_s, args.gateway_cpu, gw_cpu_pct, workers, gen_pct
    )
    gen_by_core = {c: v["generator_pct"] for c, v in cores.items()}
    valid = all(v <= GENERATOR_CPU_LIMIT_PCT for v in gen_by_core.values()) and all(
        p <= GENERATOR_CPU_LIMIT_PCT for p in gen_pct
    )
    shared = args.gateway_cpu is not None and any(w.cpu == args.gateway_cpu for w in workers)
    noise = (
        cores.get(args.gateway_cpu, {}).get("others_pct") if args.gateway_cpu is not None else None
    )
    lateness = histogram_delta(
        parse_histogram(metrics_before, LATENESS_METRIC),
        parse_histogram(metrics_after, LATENESS_METRIC),
    )
    rss_added = max(0, rss_end - rss_idle)
    summaries = figures.summaries()

    def counter(name: str, labels: dict[str, str] | None = None) -> float:
        return parse_metric(metrics_after, name, labels) - parse_metric(
            metrics_before, name, labels
        )

    data: dict[str, Any] = {
        "offered": calls,
        "cluster": probe.figures(held) if probe is not None else None,
        "slow_http": slow_figures,
        "offered_sip_share": args.sip_share,
        "dialect": args.dialect,
        "speak": args.speak,
        "srtp": args.srtp,
        "sip_transport": args.sip_transport,
        "max_calls": spec.max_calls,
        "refused": sum(int(r.get("refused", 0)) for r in ramps),
        "refused_sip": sum(int(r.get("refused_sip", 0)) for r in ramps),
        "held_sip": sum(int(e.get("held_sip", 0)) for e in ends),
        "workers": [
            {**w.hello, "calls": n, **r, "cpu_pct": round(p, 1), "rss_max_mb": e["rss_mb"]}
            for w, n, r, p, e in zip(workers, shares, ramps, gen_pct, ends, strict=True)
        ],
        "gateway_affinity": gateway.affinity(),
        "gateway_loop": args.gateway_loop,
        "held": held,
        "window_s": round(window_s, 2),
        "gateway_cpu_pct": round(gw_cpu_pct, 1),
        "gateway_cpu_pct_per_call": round(gw_cpu_pct / held, 3) if held else None,
        # The same CPU split into the process's user and system time (proc(5) utime, stime).
        "gateway_user_sys_pct": [
            round(100.0 * (gw_split1[k] - gw_split0[k]) / window_s, 1) if window_s > 0 else None
            for k in (0, 1)
        ],
        "gateway_rss_idle_mb": round(rss_idle / 2**20, 1),
        "gateway_rss_end_mb": round(rss_end / 2**20, 1),
        "gateway_rss_peak_mb": round(rss_peak / 2**20, 1),
        "gateway_rss_per_call_kb": round(rss_added / 1024 / held, 1) if held else None,
        "tick_lateness_ms": {
            "bucketed": True,
            "count": lateness.count,
            "mean": lateness.mean(),
            "p50_le": lateness.quantile_bound(0.50),
            "p99_le": lateness.quantile_bound(0.99),
            "max_le": lateness.max_bound(),
            "cumulative": dict(zip(map(str, lateness.bounds), lateness.cumulative, strict=True)),
        },
        "tick_resyncs": counter("appbridge_media_tick_resyncs_total"),
        # Frames the gateway itself dropped because a generator's socket backed up: lost
        # frames that are the generator's slowness, not the gateway's fault.
        "gateway_dropped_frames": {
            to: counter(DROPPED_METRIC, {"to": to}) for to in ("app", "carrier")
        },
        "calls_rejected": counter("appbridge_calls_rejected_total"),
        "app_unreachable": counter("appbridge_app_unreachable_total"),
        "gc": paced_collections(metrics_before, metrics_after),
        "stt": stt_figures(metrics_before, metrics_after) if args.stt != "none" else None,
        "generator_cpu_pct": round(sum(gen_pct), 1),
        "cores": cores,
        "generator_shares_gateway_core": shared,
        "valid": valid,
        "rest_requests": sum(int(a.get("rest_requests", 0)) for a in finishes),
        **figures.as_dict(),
        "by_carrier": {
            carrier: {
                key: value
                for key, value in part.as_dict().items()
                if key
                in (
                    "caller_jitter_ms",
                    "clear_to_silence_ms",
                    "inbound_latency_ms",
                    "inbound_latency_loop_ms",
                    "caller_jitter_loop_ms",
                )
                or key in ("frames_lost", "frames_expected", "clears_at_caller", "clears_sent")
            }
            for carrier, part in by_carrier.items()
        },
    }
    tick = "/".join(
        bound_cell(v)
        for v in (lateness.quantile_bound(0.5), lateness.quantile_bound(0.99), lateness.max_bound())
    )
    row = [
        str(calls) + (" dir" if probe is not None else ""),
        str(held),
        number_cell(gw_cpu_pct),
        number_cell(gw_cpu_pct / held, 3) if held else "-",
        number_cell(rss_end / 2**20),
        number_cell(rss_added / 1024 / held, 0) if held else "-",
        tick,
        summaries["caller_jitter_ms"].cell(),
        summaries["clear_to_silence_ms"].cell(),
        summaries["inbound_latency_ms"].cell(),
        f"{figures.frames_lost}/{figures.frames_expected}" if figures.frames_expected else "-",
        "+".join(number_cell(p, 0) for p in gen_pct),
        number_cell(noise, 0),
        ("yes" if valid else "INVALID") + ("/shared" if shared else ""),
    ]
    return data, row


def print_step_details(data: dict[str, Any], log_path: Path) -> None:
    """The lines under a step's row (:func:`bench.report.step_detail_lines`)."""
    for line in step_detail_lines(data):
        print(line, flush=True)
    if data.get("stt"):
        print(stt_line(data["stt"]), flush=True)
    if data.get("cluster"):
        for line in directory_lines(data["cluster"]):
            print(line, flush=True)
    if data["held"] == 0:
        print(f"bench: no call was answered; see {log_path}", flush=True)


# ---------------------------------------------------------------------- the run
def report_head(args: argparse.Namespace) -> dict[str, Any]:
    """What every results JSON (a ramp's, a soak's) starts with: when, which code (the commit
    and a hash of the uncommitted diff), which machine, which options."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "uncommitted": _tree_diff(),
        "machine": _machine(),
        "args": {k: v for k, v in vars(args).items() if k != "shim_dir"},
    }


async def run(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report: dict[str, Any] = {**report_head(args), "steps": []}
    machine = report["machine"]
    print(
        f"bench: commit {report['commit']}, {machine['cpu_model']} x {machine['cpus']}; gateway "
        f"({args.gateway_loop}) on CPU {args.gateway_cpu}, {args.workers} worker(s) on "
        f"{args.load_cpus}; hold {args.hold:g} s; {dialect_line(args)}",
        flush=True,
    )
    rows: list[list[str]] = []
    failed = False
    # --cluster ab: every step without the directory, then with it (bench/directory_cost.py).
    modes = {None: (False,), "on": (True,), "ab": (False, True)}[args.cluster]
    for calls, cluster in [(calls, on) for calls in args.calls for on in modes]:
        print(f"bench: step of {calls} calls{' (cluster)' if cluster else ''} ...", flush=True)
        try:
            step = run_step(calls, args, out_dir, cluster=True) if cluster else None
            data, row = await (step or run_step(calls, args, out_dir))
        except Exception as exc:
            failed = True
            print(f"bench: step of {calls} calls failed: {type(exc).__name__}: {exc}", flush=True)
            report["steps"].append({"offered": calls, "error": f"{type(exc).__name__}: {exc}"})
            if args.until_break:
                break
            continue
        report["steps"].append(data)
        rows.append(row)
        print(format_table(HEADERS, [row]), flush=True)
        print_step_details(data, out_dir / f"gateway-{calls}{'-cluster' if cluster else ''}.log")
        if args.until_break and bar_failures(data) and calls != args.calls[-1]:
            print(f"bench: {calls} calls missed a bar; the ramp stops here", flush=True)
            break
    print()
    print(dialect_line(args))
    print(format_table(HEADERS, rows))
    ran = [s for s in report["steps"] if "error" not in s]
    for step in ran:
        print(
            f"  {step['offered']} offered: {step['held_sip']} of {step['held']} held calls SIP; "
            f"refused {step['refused']} (SIP 503: {step['refused_sip']}, Twilio <Reject>: "
            f"{step['refused'] - step['refused_sip']}); bars missed: "
            f"{', '.join(bar_failures(step)) or 'none'}"
        )
    if args.overload:
        step = ran[-1] if ran else {}
        print(
            f"overload: cap {args.overload}, offered {step.get('offered', '-')}, refused "
            f"{step.get('refused', '-')}, held {step.get('held', '-')}; the live calls "
            + ("kept every bar" if ran and not bar_failures(step) else "missed a bar")
        )
    for step in ran if args.slow_http else ():
        print(f"  {step['offered']} offered, slow HTTP clients: {step['slow_http']}")
    print(final_line(report["steps"]))
    if args.cluster == "ab":
        for line in ab_lines(ran):
            print(line)
    print(
        "* tick lateness comes from the gateway's bucketed /metrics histogram: each figure is the "
        "upper bound of its bucket. gen CPU% is per worker process; noise% is what other "
        "processes used of the gateway's core; 'shared' means a worker ran on the gateway's core."
    )
    path = out_dir / f"bench-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"bench: results in {path}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.calls is None:
        if args.soak is not None:
            args.calls = [DEFAULT_SOAK_CALLS]
        else:
            args.calls, args.until_break = list(DEFAULT_RAMP), True
    if args.soak is not None and (len(args.calls) != 1 or not 0 < args.soak <= 86400):
        print("bench: --soak takes one --calls value and 0 < SECONDS <= 86400", file=sys.stderr)
        return 2
    if args.cluster is not None and args.soak is not None:
        print("bench: --cluster runs ramp steps, not --soak", file=sys.stderr)
        return 2
    if args.overload is not None:
        if not 1 <= args.overload <= 3000 or args.soak is not None:
            print("bench: --overload takes a cap of 1-3000 calls, not with --soak", file=sys.stderr)
            return 2
        args.calls = [round(1.5 * args.overload)]
    if not 0.0 <= args.sip_share <= 1.0:
        print("bench: --sip-share must be within 0-1", file=sys.stderr)
        return 2
    if args.dialect == "twilio":
        args.sip_share = 0.0  # the Twilio dialect alone: every call Twilio-ingress
        if args.stt != "none":
            print(
                "bench: --stt applies to the fonoster apps, not --dialect twilio", file=sys.stderr
            )
            return 2
    if args.caller is None:
        args.caller = "speech" if args.stt != "none" else "tone"
    if not 0 < args.hold <= 3600 or args.ramp_rate <= 0 or not 1 <= args.workers <= 64:
        print(
            "bench: --hold must be in (0, 3600], --ramp-rate > 0, --workers 1-64", file=sys.stderr
        )
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    problem = prepare(args)
    if problem is not None:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    # Where the "asyncio" loop's shim lives: outside the source tree, gone after the run.
    with tempfile.TemporaryDirectory(prefix="appbridge-bench-") as shim_dir:
        args.shim_dir = shim_dir
        try:
            if args.soak is not None:
                from bench.soak import run_soak  # bench.soak imports this module

                return asyncio.run(run_soak(args))
            return asyncio.run(run(args))
        except KeyboardInterrupt:  # the gateway and the workers stop with us (PDEATHSIG)
            print("bench: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
