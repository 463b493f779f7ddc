"""One load-generator process: the lean callers, the lean app they reach, maybe the REST API.

Started by :mod:`bench.load` as ``python -m bench.worker INDEX`` (pinned to a core, dying with its
parent) and driven over stdin/stdout, one JSON object per line, request then answer:

===================  ==========================================================================
``start`` (implied)  the worker starts its app server (and, for worker 0,
                     the :class:`~appbridge.testing.FakeTwilioRest`) and answers with their URLs
``ramp``             place ``calls`` calls to ``to`` at ``rate`` per second; answer when they are
                     up (the app has ``session.start``) or after ``up_timeout`` seconds
``window_start``     the hold window opens: CPU so far, and the collector is parked
``window_end``       the window closes: CPU so far, and how many calls are still up
``finish``           hang up every call, then measure the window (:mod:`bench.analysis`)
``stop``             stop the fakes and exit
===================  ==========================================================================

Several workers let the peers use more than one core (bench/README.md, "Options worth
knowing"). All of them and the parent read ``time.monotonic()``, which is CLOCK_MONOTONIC, one
clock for the whole machine, so instants can be compared across processes.

The peers are the lean ones: :class:`bench.lean_twilio.LeanTwilio` callers, SIP callers
(:class:`bench.sip_caller.SipCaller`) and :class:`bench.lean_app.LeanApp`, which put the
project's test peers' traffic on the wire for about half of the generator's CPU
(bench/README.md, "Lean peers").

The apps speak fonoster by default (``BENCH_DIALECT=fonoster``: :class:`bench.talker.TalkingApp`
scripts them). ``BENCH_DIALECT=twilio`` (``bench.load --dialect twilio``) makes them
Pipecat-style Twilio Media Streams apps, :class:`bench.pipecat_app.TwilioDialectApp`, which
paces every session from one ticker and is its own talker (bench/README.md, "The Twilio
dialect").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import resource
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from appbridge.net.loop_watch import ENV_VAR, LoopStallWatch, threshold_from_env
from appbridge.testing import FakeTwilioRest
from bench.analysis import Caller, CallerFigures, analyse_calls
from bench.lean_app import LeanApp
from bench.lean_twilio import LeanTwilio, LeanTwilioCall
from bench.pipecat_app import TwilioDialectApp
from bench.sip_caller import (
    SIP_CALLER_PREFIX,
    SipCaller,
    SipCallError,
    SipEndpoint,
    sip_caller_number,
)
from bench.sip_secure import open_endpoint
from bench.stt_load import CALLER_ENV, drive_speaker, speech_ulaw
from bench.talker import AppScript, TalkingApp, caller_tone_ulaw, drive_caller

CALLER_TONE_MS = 1000
CALLER_PERIOD_S = 2.0
CALLER_FROM = "+15550001111"
WORKER_STALL_ENV = "BENCH_STALL_TRACE_MS"
#: Phases of the lean Twilio callers' 20 ms ticker (bench/lean_twilio.py TwilioTicker; 4).
TWILIO_SLOTS_ENV = "BENCH_TWILIO_SLOTS"
#: The apps' protocol: "fonoster" (bench/talker.py on the lean app) or "twilio"
#: (bench/pipecat_app.py, Pipecat-style Media Streams apps).
DIALECT_ENV = "BENCH_DIALECT"
DIALECTS = ("fonoster", "twilio")
#: The fonoster apps' speak text: "repeated" (one sentence) or "unique" (bench/talker.py).
SPEAK_ENV = "BENCH_SPEAK"


def is_sip_session(start: dict[str, Any]) -> bool:
    """Whether a ``session.start`` belongs to a SIP call of the bench (its unique caller number)."""
    return str(start.get("from")).startswith(SIP_CALLER_PREFIX)


def self_cpu_s() -> float:
    """User + system CPU of this process (every thread), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def is_sip_slot(k: int, sip_share: float) -> bool:
    """Whether call ``k`` of a worker is a SIP one: spread evenly, ``sip_share`` of them."""
    return math.floor((k + 1) * sip_share) > math.floor(k * sip_share)


def is_refusal(error: str | None) -> bool:
    """A clean refusal by admission control (docs/configuration.md, "Admission control"): SIP
    503 with Retry-After (a 503 without it, e.g. no RTP port left, is a failure), Twilio
    ``<Reject>``."""
    if error is None:
        return False
    return (error.startswith("503") and "Retry-After" in error) or "Reject" in error


@dataclass
class Placed:
    call: Caller | None = None
    error: str | None = None
    driver: asyncio.Task[None] | None = None


class Worker:
    def __init__(
        self,
        index: int,
        *,
        app_secret: str,
        twilio_token: str,
        account_sid: str,
        dialect: str = "fonoster",
        speak: str = "repeated",
        caller: str = "tone",
    ):
        if dialect not in DIALECTS:
            raise ValueError(f"{DIALECT_ENV} must be one of {DIALECTS}, not {dialect!r}")
        self.index = index
        self.account_sid = account_sid
        self.twilio_token = twilio_token
        self.dialect = dialect
        self.talker: TalkingApp | TwilioDialectApp
        self.app: LeanApp
        if dialect == "twilio":
            # The Pipecat-style app paces itself from its own ticker: no handler task.
            self.app = self.talker = TwilioDialectApp(
                secret=app_secret, account_sid=account_sid, seed=1000 + index
            )
        else:
            self.talker = TalkingApp(seed=1000 + index, unique_speak=speak == "unique")
            self.app = LeanApp(secret=app_secret)
            self.app.loudness_if = is_sip_session
            self.app.handler = self.talker.handle
        self.twilio: LeanTwilio | None = None
        self.rest = (
            FakeTwilioRest(account_sid=account_sid, auth_token=twilio_token) if index == 0 else None
        )
        self.placed: list[Placed] = []
        self.tone = caller_tone_ulaw(CALLER_TONE_MS)
        # --caller speech (bench/stt_load.py): sentences in place of the tone.
        self.speech = speech_ulaw() if caller == "speech" else None
        self.webhook_client: httpx.AsyncClient | None = None
        self.sip: SipEndpoint | None = None  # when the gateway listens for SIP
        self.sip_share = 0.0
        self.sip_serial = 0

    # ------------------------------------------------------------------ commands
    async def start(self) -> dict[str, Any]:
        # One webhook client for every call (a new one per call would build a TLS context
        # each time, a stall on the loop that paces the callers); plain HTTP on loopback.
        self.webhook_client = httpx.AsyncClient(trust_env=False, timeout=30.0, verify=False)
        await self.app.start()
        if self.rest is not None:
            await self.rest.start()
        return {
            "app_url": self.app.url,
            "rest_base_url": self.rest.base_url if self.rest is not None else None,
            "pid": os.getpid(),
            "dialect": self.dialect,
            "affinity": sorted(os.sched_getaffinity(0)),
        }

    async def open_sip(
        self, sip: list[Any] | None, sip_share: float, secure: dict[str, Any] | None = None
    ) -> None:
        """Drive ``sip_share`` of the calls over SIP/RTP to ``sip`` = [host, port]; ``secure``
        asks for SRTP and TLS (bench/sip_secure.py)."""
        if sip is None or sip_share <= 0:
            return
        self.sip = open_endpoint((str(sip[0]), int(sip[1])), secure)
        await self.sip.start()
        self.sip_share = sip_share

    async def ramp(
        self,
        base_url: str,
        calls: int,
        to: str,
        rate: float,
        up_timeout: float,
        sip: list[Any] | None = None,
        sip_share: float = 0.0,
        sip_secure: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        await self.open_sip(sip, sip_share, sip_secure)
        self.open_twilio(base_url)
        started = time.monotonic()
        tasks = []
        for i in range(calls):
            slot = Placed()
            self.placed.append(slot)
            tasks.append(asyncio.create_task(self._place(slot, to, is_sip_slot(i, self.sip_share))))
            delay_s = started + (i + 1) / rate - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
        _, pending = await asyncio.wait(tasks, timeout=up_timeout)
        for task in pending:
            task.cancel()
        deadline = time.monotonic() + up_timeout
        while time.monotonic() < deadline and self._sessions_missing():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        errors = sorted({p.error for p in self.placed if p.error and not is_refusal(p.error)})
        up = self._pairs()
        return {
            "placed_ok": sum(1 for p in self.placed if p.call is not None and p.call.has_stream),
            "up": len(up),
            "up_sip": sum(1 for call, _ in up if isinstance(call, SipCaller)),
            "refused": sum(1 for p in self.placed if is_refusal(p.error)),
            "refused_sip": sum(
                1 for p in self.placed if is_refusal(p.error) and str(p.error).startswith("503")
            ),
            "errors": errors[:10],
            "ramp_s": round(time.monotonic() - started, 3),
        }

    def open_twilio(self, base_url: str) -> None:
        """The Twilio that places this worker's Twilio-ingress calls on the gateway."""
        assert self.webhook_client is not None
        self.twilio = LeanTwilio(
            base_url,
            account_sid=self.account_sid,
            auth_token=self.twilio_token,
            client=self.webhook_client,
            slots=int(os.environ.get(TWILIO_SLOTS_ENV) or 4),
            rest=self.rest,
        )

    def window_start(self) -> dict[str, Any]:
        # The recordings grow all through the hold: keep the collector's full passes (which
        # would walk every recorded message) out of the measured window.
        gc.collect()
        gc.freeze()
        gc.disable()
        return {"t": time.monotonic(), "cpu_s": self_cpu_s()}

    def window_end(self) -> dict[str, Any]:
        answer = {"t": time.monotonic(), "cpu_s": self_cpu_s()}
        gc.enable()
        live = [
            call for call, script in self._pairs() if not (call.closed or script.session.closed)
        ]
        answer["held"] = len(live)
        answer["held_sip"] = sum(1 for call in live if isinstance(call, SipCaller))
        answer["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        return answer

    async def finish(self, window: list[float], hangup_timeout: float) -> dict[str, Any]:
        pairs = self._pairs()
        await self._hang_up(hangup_timeout)
        span = (window[0], window[1])
        sip_pairs = [(call, script) for call, script in pairs if isinstance(call, SipCaller)]
        twilio_pairs = [(call, script) for call, script in pairs if not isinstance(call, SipCaller)]
        sip, twilio = analyse_calls(sip_pairs, span), analyse_calls(twilio_pairs, span)
        figures = CallerFigures()
        figures.merge(sip)
        figures.merge(twilio)
        gc.unfreeze()
        return {
            "figures": figures.to_wire(),
            "by_carrier": {"sip": sip.to_wire(), "twilio": twilio.to_wire()},
            "rest_requests": len(self.rest.requests) if self.rest is not None else 0,
        }

    async def stop(self) -> None:
        self.talker.stopping = True
        drivers = [p.driver for p in self.placed if p.driver is not None]
        for task in drivers:
            task.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
        if self.twilio is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.twilio.aclose(), 30.0)
        if self.rest is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.rest.stop(), 10.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.app.stop(), 10.0)
        if self.webhook_client is not None:
            with contextlib.suppress(Exception):
                await self.webhook_client.aclose()
        if self.sip is not None:
            await self.sip.stop()

    # ------------------------------------------------------------------ internals
    async def _place(self, slot: Placed, to: str, sip: bool = False) -> None:
        if sip:
            await self._place_sip(slot, to)
            return
        assert self.twilio is not None
        try:
            call = await self.twilio.place_call(CALLER_FROM, to)
        except Exception as exc:  # a refused webhook is a measurement, not a crash
            slot.error = f"{type(exc).__name__}: {exc}"
            return
        slot.call = call
        if not call.has_stream:
            slot.error = f"webhook {call.webhook_status} {call.twiml_verbs}: {call.stream_error}"
            return
        slot.driver = asyncio.create_task(self._voice(call))

    async def _place_sip(self, slot: Placed, to: str) -> None:
        assert self.sip is not None
        self.sip_serial += 1
        number = sip_caller_number(self.index, self.sip_serial)
        call = SipCaller(self.sip, number, to)
        try:
            await call.place(timeout_s=30.0)
        except SipCallError as exc:
            slot.error = str(exc)
            return
        slot.call = call
        slot.driver = asyncio.create_task(self._voice(call))

    def _voice(self, call: SipCaller | LeanTwilioCall) -> Coroutine[Any, Any, None]:
        """What the caller sends: the tone, or with ``--caller speech`` the sentences."""
        if self.speech is None:
            return drive_caller(call, self.tone, CALLER_PERIOD_S)
        return drive_speaker(call, self.speech, seed=len(self.placed) * 1000 + self.index)

    def _sessions_missing(self) -> int:
        scripts = self.talker.scripts
        return sum(
            1
            for p in self.placed
            if p.call is not None and p.call.has_stream and p.call.call_sid not in scripts
        )

    def _pairs(self) -> list[tuple[Caller, AppScript]]:
        pairs = []
        for slot in self.placed:
            call = slot.call
            if call is None or not call.has_stream:
                continue
            script = self.talker.scripts.get(call.call_sid)
            if script is not None:
                pairs.append((call, script))
        return pairs

    async def _hang_up(self, timeout_s: float) -> None:
        """Every caller hangs up (Twilio ``stop``, then close); bounded; then the apps end."""
        self.talker.stopping = True
        hangups = [asyncio.create_task(p.call.hangup()) for p in self.placed if p.call is not None]
        if hangups:
            _, pending = await asyncio.wait(hangups, timeout=timeout_s)
            for task in pending:
                task.cancel()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(  # noqa: ASYNC110 - polls many sessions
            not s.session.closed for s in self.talker.scripts.values()
        ):
            await asyncio.sleep(0.1)


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


W = TypeVar("W", bound="Worker")


def start_stall_watch() -> LoopStallWatch | None:
    """``BENCH_STALL_TRACE_MS``: trace the worker's own loop stalls (and its collector's passes)
    to its log, as ``APPBRIDGE_STALL_TRACE_MS`` does for the gateway (bench/README.md)."""
    threshold_s = threshold_from_env({ENV_VAR: os.environ.get(WORKER_STALL_ENV, "")})
    if threshold_s is None:
        return None
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(message)s")
    watch = LoopStallWatch(threshold_s)
    watch.start(asyncio.get_running_loop())
    return watch


def worker_from_env(cls: type[W], index: int) -> W:
    return cls(
        index,
        app_secret=os.environ["BENCH_APP_SECRET"],
        twilio_token=os.environ["BENCH_TWILIO_TOKEN"],
        account_sid=os.environ["BENCH_ACCOUNT_SID"],
        dialect=os.environ.get(DIALECT_ENV) or "fonoster",
        speak=os.environ.get(SPEAK_ENV) or "repeated",
        caller=os.environ.get(CALLER_ENV) or "tone",
    )


async def serve_commands(
    worker: Worker, dispatch: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
) -> None:
    """The JSON-lines conversation with the orchestrator: one request per stdin line, one reply
    per stdout line; ``stop`` (or the parent going away) ends it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _reply({"ok": True, **(await worker.start())})
    while True:
        line = await reader.readline()
        if not line:
            return  # the parent is gone
        request = json.loads(line)
        cmd = request.get("cmd")
        if cmd == "stop":
            _reply({"ok": True})
            return
        try:
            answer = await dispatch(str(cmd), request)
        except Exception as exc:
            traceback.print_exc()
            _reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        _reply({"ok": True, **answer})


def run_worker(argv: list[str] | None, serve: Callable[[int], Awaitable[None]], usage: str) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print(usage, file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(int(args[0])))  # type: ignore[arg-type]
    else:
        # The fakes cost less on uvloop: more calls per worker under the 70 % bar.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(int(args[0])))  # type: ignore[arg-type]
    return 0


async def _serve(index: int) -> None:
    worker = worker_from_env(Worker, index)

    async def dispatch(cmd: str, request: dict[str, Any]) -> dict[str, Any]:
        if cmd == "ramp":
            return await worker.ramp(
                request["base_url"],
                int(request["calls"]),
                request["to"],
                float(request["rate"]),
                float(request["up_timeout"]),
                request.get("sip"),
                float(request.get("sip_share", 0.0)),
                request.get("sip_secure"),
            )
        if cmd == "window_start":
            return worker.window_start()
        if cmd == "window_end":
            return worker.window_end()
        if cmd == "finish":
            return await worker.finish(request["window"], float(request["timeout"]))
        raise ValueError(f"unknown command {cmd!r}")

    try:
        await serve_commands(worker, dispatch)
    finally:
        await worker.stop()


def main(argv: list[str] | None = None) -> int:
    return run_worker(argv, _serve, "usage: python -m bench.worker INDEX (driven by bench.load)")


if __name__ == "__main__":
    raise SystemExit(main())
