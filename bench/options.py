"""The command line of ``make bench`` (:mod:`bench.load`): options and their checks."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

#: The repository (``--out`` defaults to bench/out in it).
REPO = Path(__file__).resolve().parent.parent

__all__ = ["build_parser"]


def _calls(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not values or any(v < 1 or v > 5000 for v in values):
        raise argparse.ArgumentTypeError("each step needs 1 to 5000 calls")
    return values


def _cpus(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of CPUs: {text}") from None


def _lifetime(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not LOW,HIGH seconds: {text}") from None
    if not 5.0 <= low <= high:
        raise argparse.ArgumentTypeError(f"need 5 <= LOW <= HIGH: {text}")
    return (low, high)


def build_parser() -> argparse.ArgumentParser:
    two = (os.cpu_count() or 1) >= 2
    parser = argparse.ArgumentParser(
        prog="python -m bench.load",
        description="AppBridge load benchmark (bench/README.md).",
    )
    parser.add_argument(
        "--calls",
        type=_calls,
        default=None,
        help="steps (default: the bounded ramp 50,100,200,300,...,1000, which stops after the "
        "first step that misses a bar; with --soak: 120)",
    )
    parser.add_argument(
        "--until-break",
        action="store_true",
        help="with --calls: stop after the first step that misses a bar, as the default ramp does",
    )
    parser.add_argument(
        "--soak",
        type=float,
        default=None,
        metavar="SECONDS",
        help="soak instead of a ramp: one step of --calls calls (one number), replaced as they "
        "end, kept up SECONDS while the gateway's RSS, fds, threads and tasks are sampled",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with --soak: the first SECONDS are left out of the flatness verdicts (60; the "
        "allocator's pools, the caches and the registry's history of ended calls fill while "
        "the calls churn, e.g. --soak 1200 --warmup 600 judges the last 10 minutes)",
    )
    parser.add_argument(
        "--lifetime",
        type=_lifetime,
        default=(60.0, 120.0),
        metavar="LOW,HIGH",
        help="with --soak: each call lives a random LOW-HIGH seconds (60,120); shorter lives "
        "churn faster (calls/s ~ calls / mean life)",
    )
    parser.add_argument(
        "--sip-share",
        type=float,
        default=0.5,
        help="share of the calls placed over SIP/RTP instead of Twilio (the mix: 0.5; "
        "0 for the Twilio dialect alone)",
    )
    parser.add_argument(
        "--dialect",
        choices=("fonoster", "twilio"),
        default="fonoster",
        help="the apps' protocol: fonoster (the mix) or twilio (the Twilio dialect alone: "
        "every call Twilio-ingress, so --sip-share 0, against Pipecat-style Media Streams apps "
        "sending at 2x real time; bench/pipecat_app.py)",
    )
    parser.add_argument(
        "--overload",
        type=int,
        default=None,
        metavar="CAP",
        help="admission control: the gateway's server.max_calls is CAP and 150 %% of it is "
        "offered in one step; the refused calls are counted, the live ones must keep the bars",
    )
    parser.add_argument(
        "--speak",
        choices=("repeated", "unique"),
        default="repeated",
        help="the apps' speak text: repeated (one sentence, as an IVR prompt: from its third "
        "request on the gateway's utterance cache answers it) or unique (a new sentence every "
        "time, as an LLM's answers: eSpeak NG synthesises every one)",
    )
    parser.add_argument(
        "--stt",
        choices=("none", "local"),
        default="none",
        help="the apps' speech.stt: none (the media path alone) or local (the offline "
        "recogniser transcribes every caller; the step adds its figures, bench/stt_load.py)",
    )
    parser.add_argument(
        "--caller",
        choices=("tone", "speech"),
        default=None,
        help="what the callers send: tone (a 1 s 440 Hz tone every 2 s) or speech (telephone "
        "sentences with 2 s pauses); the default is speech with --stt local, else tone",
    )
    parser.add_argument(
        "--cluster",
        nargs="?",
        const="on",
        choices=("on", "ab"),
        default=None,
        help="the gateway with [cluster] against a redis-server of its own, and the call "
        "directory's cost printed (Redis commands per call and per heartbeat); 'ab' runs every "
        "step twice, without then with, and compares CPU per call (docs/PERFORMANCE.md)",
    )
    parser.add_argument(
        "--slow-http",
        type=int,
        default=0,
        metavar="N",
        help="N clients that send an HTTP request head one byte a second during each hold "
        "window, opened at once (bench/slow_http.py); the bars then show what they cost the calls",
    )
    parser.add_argument(
        "--srtp",
        action="store_true",
        help="the SIP calls offer RTP/SAVP with SDES keys and run SRTP; the gateway's trunk for "
        'them has srtp = "required" (bench/sip_secure.py)',
    )
    parser.add_argument(
        "--sip-transport",
        choices=("udp", "tls"),
        default="udp",
        help="the SIP calls' signalling: udp, or tls to a tls: listener with certificates made "
        "for the run into OUT/pki (bench/sip_secure.py)",
    )
    parser.add_argument("--hold", type=float, default=30.0, help="seconds each step is held (30)")
    parser.add_argument("--workers", type=int, default=1, help="load-generator processes (1)")
    parser.add_argument("--ramp-rate", type=float, default=25.0, help="calls offered per second")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--up-timeout", type=float, default=60.0, help="bound on ramp/hang-up")
    parser.add_argument(
        "--gateway-cpu", type=int, default=1 if two else None, help="the gateway's core (1)"
    )
    parser.add_argument(
        "--load-cpus",
        type=_cpus,
        default=[0] if two else None,
        help="cores for the workers, assigned round-robin (0)",
    )
    parser.add_argument(
        "--gateway-loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the gateway's event loop: uvloop as `appbridge serve` ships, or the stdlib loop",
    )
    parser.add_argument("--gateway-log-level", default="WARNING")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    return parser
