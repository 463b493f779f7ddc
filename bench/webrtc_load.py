"""``make bench``'s browser step: what a browser call costs the gateway beside a SIP call.

Usage: ``python -m bench.webrtc_load [--calls 10] [--hold 20] [--codec opus|PCMU] [--no-sip]``.

Two runs of the same N calls, one after the other in this session, each against a fresh gateway
process (``appbridge serve``) pinned to its own core:

- SIP: bench/load.py's step with ``--sip-share 1`` (every call a SIP/RTP caller of
  bench/sip_caller.py against the talking app of bench/talker.py).
- WebRTC: the same talking app (a :mod:`bench.worker` process; only its app is used), and N
  browser calls placed by a separate client process (``--browsers``, this module's child mode:
  aiortc peers of appbridge/testing/webrtc_browser.py, each sending a tone like a caller), so
  the browsers' own CPU is not the gateway's. ``[webrtc] host_addresses = ["127.0.0.1"]`` keeps
  every packet on loopback.

Once every call is up and ``--settle`` seconds passed, the gateway's CPU time (proc(5) utime +
stime) is read over ``--hold`` seconds; the figure is % of one core per held call. The ratio
WebRTC/SIP is printed beside them (method and figures: docs/PERFORMANCE.md, "Browser calls
(WebRTC)"). ``--profile FILE`` runs the WebRTC gateway under cProfile and writes its
statistics there, to see where a browser call's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gateway_proc import (
    GatewayProcess,
    GatewaySpec,
    child_setup,
    free_loopback_port,
    render_config,
    worker_number,
)
from bench.load import (
    ACCOUNT_SID,
    REPO,
    WorkerProc,
    _gateway_executable,
    run_step,
    stop_all,
    worker_env,
)
from bench.options import build_parser
from bench.sip_secure import prepare

TOKEN_ENV = "BENCH_WEBRTC_TOKEN"
#: The browsers' tone, as the SIP callers' (bench/talker.py ``CALLER_TONE_HZ``).
CALLER_TONE_HZ = 440.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.webrtc_load",
        description="Gateway CPU per browser (WebRTC) call beside a SIP call (bench/README.md).",
    )
    parser.add_argument("--calls", type=int, default=10, help="calls of each kind (10)")
    parser.add_argument("--hold", type=float, default=20.0, help="measured seconds (20)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--codec", choices=("opus", "PCMU", "PCMA"), default="opus")
    parser.add_argument("--no-sip", action="store_true", help="the WebRTC run alone")
    parser.add_argument("--profile", default=None, help="cProfile the WebRTC gateway into FILE")
    parser.add_argument("--gateway-cpu", type=int, default=1, help="the gateway's core (1)")
    parser.add_argument("--load-cpu", type=int, default=0, help="the peers' core (0)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    # The child mode: N browser calls, driven over stdin/stdout (module doc).
    parser.add_argument("--browsers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--to", default=None, help=argparse.SUPPRESS)
    return parser


# ---------------------------------------------------------------------- the browsers' process
async def _browsers(args: argparse.Namespace) -> int:
    """Place ``--browsers`` calls, say how many are up, hold them until told, hang up."""
    from appbridge.carriers.webrtc.host_addresses import use_host_addresses
    from appbridge.testing.webrtc_browser import BrowserPeer

    use_host_addresses(["127.0.0.1"])
    token = os.environ[TOKEN_ENV]
    peers = [
        BrowserPeer(args.base_url, token=token, codec=args.codec, tone_hz=CALLER_TONE_HZ)
        for _ in range(args.browsers)
    ]
    errors: list[str] = []
    up = 0
    for peer in peers:  # one at a time, as browsers arrive: the SDP work is the gateway's
        resp = await peer.call(args.to, timeout_s=30)
        if resp.status_code == 201:
            up += 1
        else:
            errors.append(f"{resp.status_code} {resp.text[:200]}")
    await asyncio.gather(
        *(p.wait_channel_open() for p in peers if p.call_ref), return_exceptions=True
    )
    _reply({"ok": True, "up": up, "errors": errors[:5], "cpu_s": time.process_time()})
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    heard = [len(p.heard) // 640 for p in peers if p.call_ref]
    cpu_s = time.process_time()
    await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    _reply({"ok": True, "heard_frames_min": min(heard, default=0), "cpu_s": cpu_s})
    return 0


def _reply(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


class BrowsersProc:
    """The child that plays N browsers (module doc), pinned to the peers' core."""

    def __init__(self, args: argparse.Namespace, base_url: str, env: dict[str, str], log: Path):
        self.args, self.base_url, self.env, self.log = args, base_url, env, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "bench.webrtc_load", "--browsers", str(self.args.calls)]
        cmd += ["--base-url", self.base_url, "--to", worker_number(0), "--codec", self.args.codec]
        with self.log.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=REPO,
                preexec_fn=child_setup(self.args.load_cpu),
            )
        return await self._read(30.0 + 3.0 * self.args.calls)

    async def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"the browsers' process exited; see {self.log}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def finish(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"end\n")
        await self.proc.stdin.drain()
        answer = await self._read(60.0)
        await asyncio.wait_for(self.proc.wait(), 30.0)
        return answer

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


# ---------------------------------------------------------------------- the two runs
def _webrtc_config(spec: GatewaySpec) -> str:
    """bench/gateway_proc.py's configuration, with the ``/v1`` token and ``[webrtc]``."""
    return (
        render_config(spec)
        + f'\n[api]\ntokens = ["${{{TOKEN_ENV}}}"]\n'
        + '\n[webrtc]\nhost_addresses = ["127.0.0.1"]\nmax_pending_offers = 64\n'
    )


async def _webrtc_run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    load_args = build_parser().parse_args(["--hold", str(args.hold)])
    env = worker_env(load_args)
    env[TOKEN_ENV] = "bench-" + env["BENCH_APP_SECRET"][:16]
    app = WorkerProc(0, args.load_cpu, env, out_dir / "webrtc-app.log")
    gateway: GatewayProcess | None = None
    browsers: BrowsersProc | None = None
    try:
        await app.start()
        spec = GatewaySpec(
            port=free_loopback_port(),
            rest_base_url=app.hello["rest_base_url"],
            app_urls=(app.hello["app_url"],),
            account_sid=ACCOUNT_SID,
        )
        config_path = out_dir / "gateway-webrtc.toml"
        config_path.write_text(_webrtc_config(spec))
        executable = _gateway_executable()
        gw_env = dict(env, APPBRIDGE_LOG_LEVEL="WARNING")
        if args.profile:
            gw_env["BENCH_PROFILE_OUT"] = args.profile  # made absolute by main()
            executable = str(_profiling_launcher(out_dir))
        gateway = GatewayProcess(
            executable,
            config_path,
            env=gw_env,
            cpu=args.gateway_cpu,
            log_path=out_dir / "gateway-webrtc.log",
        )
        await gateway.start(spec.base_url)
        browsers = BrowsersProc(args, spec.base_url, env, out_dir / "webrtc-browsers.log")
        placed = await browsers.start()
        await asyncio.sleep(args.settle)
        cpu0, t0 = gateway.cpu_seconds(), time.monotonic()
        await asyncio.sleep(args.hold)
        cpu1, t1 = gateway.cpu_seconds(), time.monotonic()
        alive = gateway.alive()
        done = await browsers.finish()
    finally:
        if browsers is not None:
            browsers.kill()
        await stop_all([app], gateway)
    held = int(placed["up"])
    pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    return {
        "mode": f"webrtc ({args.codec})",
        "offered": args.calls,
        "held": held,
        "errors": placed["errors"],
        "gateway_alive": alive,
        "gateway_cpu_pct": round(pct, 1),
        "gateway_cpu_pct_per_call": round(pct / held, 3) if held else None,
        "heard_frames_min": done.get("heard_frames_min"),
    }


def _profiling_launcher(out_dir: Path) -> Path:
    """A script that runs ``appbridge serve`` under cProfile and dumps on SIGINT."""
    launcher = out_dir / "profiled-appbridge"
    launcher.write_text(
        f"#!{sys.executable}\n"
        "import cProfile, os, signal, sys\n"
        "from appbridge.cli import main\n"
        "prof = cProfile.Profile()\n"
        "def dump(*_):\n"
        "    prof.disable(); prof.dump_stats(os.environ['BENCH_PROFILE_OUT']); os._exit(0)\n"
        "signal.signal(signal.SIGTERM, dump)\n"
        "prof.enable()\n"
        "try:\n"
        "    sys.exit(main(sys.argv[1:]))\n"
        "finally:\n"
        "    prof.disable(); prof.dump_stats(os.environ['BENCH_PROFILE_OUT'])\n"
    )
    launcher.chmod(0o755)
    return launcher


async def _sip_run(args: argparse.Namespace, out_dir: Path, shim_dir: str) -> dict[str, Any]:
    load_args = build_parser().parse_args(
        [
            *("--calls", str(args.calls), "--hold", str(args.hold), "--sip-share", "1"),
            *("--settle", str(args.settle), "--out", str(out_dir)),
            *("--gateway-cpu", str(args.gateway_cpu), "--load-cpus", str(args.load_cpu)),
        ]
    )
    problem = prepare(load_args)
    if problem is not None:
        raise SystemExit(f"bench: {problem}")
    load_args.shim_dir = shim_dir
    data, _ = await run_step(args.calls, load_args, out_dir)
    return {
        "mode": "sip (PCMU)",
        "offered": args.calls,
        "held": data["held"],
        "gateway_cpu_pct": data["gateway_cpu_pct"],
        "gateway_cpu_pct_per_call": data["gateway_cpu_pct_per_call"],
    }


def _table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'mode':<14} {'held':>5} {'gw CPU%':>8} {'CPU%/call':>10}"]
    for run in runs:
        per_call = run["gateway_cpu_pct_per_call"]
        cell = f"{per_call:.3f}" if per_call is not None else "-"
        lines.append(
            f"{run['mode']:<14} {run['held']:>5} {run['gateway_cpu_pct']:>8.1f} {cell:>10}"
        )
    return "\n".join(lines)


async def _run(args: argparse.Namespace, out_dir: Path) -> int:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="appbridge-bench-") as shim_dir:
        if not args.no_sip:
            print(f"bench webrtc: {args.calls} SIP calls ...", flush=True)
            runs.append(await _sip_run(args, out_dir, shim_dir))
        print(f"bench webrtc: {args.calls} browser calls ({args.codec}) ...", flush=True)
        runs.append(await _webrtc_run(args, out_dir))
    print(_table(runs))
    webrtc = runs[-1]
    if webrtc["errors"]:
        print(f"bench webrtc: refused browser calls, e.g. {webrtc['errors'][0]}")
    if len(runs) == 2 and runs[0]["gateway_cpu_pct_per_call"] and webrtc["held"]:
        ratio = webrtc["gateway_cpu_pct_per_call"] / runs[0]["gateway_cpu_pct_per_call"]
        verdict = "within" if ratio <= 3.0 else "OVER"
        print(f"bench webrtc: a browser call costs {ratio:.1f} SIP calls ({verdict} the bar of 3)")
        webrtc["ratio_to_sip"] = round(ratio, 2)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"bench-webrtc-{stamp}.json"
    path.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2) + "\n")
    print(f"bench webrtc: results in {path}")
    return 0 if webrtc["held"] == args.calls and webrtc["gateway_alive"] else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.browsers is not None:
        return asyncio.run(_browsers(args))
    if not 1 <= args.calls <= 500 or not 0 < args.hold <= 600:
        print("bench webrtc: --calls 1-500, --hold in (0, 600]", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.profile:
        args.profile = os.path.abspath(args.profile)
    return asyncio.run(_run(args, out_dir))


if __name__ == "__main__":
    raise SystemExit(main())
