"""One soak load-generator process: N calls kept up for minutes, each replaced when it ends.

Started by :mod:`bench.soak` as ``python -m bench.soak_worker INDEX`` and driven like
:mod:`bench.worker` (one JSON object per line on stdin/stdout, request then answer):

===============  ==============================================================================
``start``        (implied) the fake app and, for worker 0, the fake REST API; answers their URLs
``soak_start``   open ``calls`` slots at ``rate`` per second; each slot places a call, keeps it
                 for a random lifetime in ``lifetime_s``, ends it, measures it, places the next;
                 answers once the first call of every slot is up (or after ``up_timeout``)
``sample``       CPU so far, calls up, calls placed / completed / failed
``soak_finish``  stop replacing calls, end the live ones, answer the pooled figures
``stop``         stop the fakes and exit
===============  ==============================================================================

The soak exercises call set-up and tear-down too: half of the calls end with the caller hanging
up (Twilio ``stop``), the other half with the app sending ``hangup`` (docs/protocol-session-v1.md:
``session.end`` with ``app_hangup``), or, in the Twilio dialect, closing its socket
(docs/protocol-twilio.md). Each call is measured over its own life, from
2 s after its session started to the moment it was ended, with :func:`bench.analysis.analyse_calls`,
and its recordings are then dropped: a 10-minute soak would otherwise keep every message of some
thousand calls. Only the measured samples are kept, in flat ``array('d')`` buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import resource
import time
from array import array
from typing import Any

from bench.analysis import CallerFigures, analyse_calls
from bench.pipecat_app import TwilioAppSession
from bench.report import summarize
from bench.talker import AppScript
from bench.worker import (
    Placed,
    Worker,
    is_sip_slot,
    run_worker,
    self_cpu_s,
    serve_commands,
    start_stall_watch,
    worker_from_env,
)

#: A call's first seconds (dial, pacer lead, first burst phase) are not measured.
SETTLE_S = 2.0
#: Bound on waiting for one call's app session, and for a call's two ends to close.
CALL_UP_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
SAMPLE_FIELDS = (
    "jitter_ms",
    "clear_to_silence_ms",
    "inbound_latency_ms",
    # The same figures from loop-time receive stamps (bench/analysis.py), for comparison.
    "jitter_loop_ms",
    "inbound_latency_loop_ms",
)
#: How often the worker moves what is alive into the collector's permanent generation.
FREEZE_PERIOD_S = 1.0


class SoakWorker(Worker):
    """A :class:`bench.worker.Worker` whose calls churn instead of being held once, on the lean
    peers as the ramp."""

    def __init__(self, index: int, **kw: str) -> None:
        super().__init__(index, **kw)
        self.rng = random.Random(2000 + index)
        self.churning = False
        self.slots: list[asyncio.Task[None]] = []
        self.figures = CallerFigures()  # counts only; the samples go to self.samples
        self.samples = {name: array("d") for name in SAMPLE_FIELDS}
        self.placed_total = 0
        self.completed = 0
        self.failed = 0
        self.dropped = 0  # calls that ended before their lifetime, not by us
        self.app_hangups = 0
        self.caller_hangups = 0
        self.errors: dict[str, int] = {}
        self.first_up: list[asyncio.Future[None]] = []
        self.freezer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ commands
    async def soak_start(
        self,
        base_url: str,
        calls: int,
        to: str,
        rate: float,
        lifetime_s: tuple[float, float],
        up_timeout: float,
        sip: list[Any] | None = None,
        sip_share: float = 0.0,
    ) -> dict[str, Any]:
        await self.open_sip(sip, sip_share)
        self.open_twilio(base_url)
        self.churning = True
        self.freezer = asyncio.create_task(self._freeze_while_churning())
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        for k in range(calls):
            up: asyncio.Future[None] = loop.create_future()
            self.first_up.append(up)
            self.slots.append(asyncio.create_task(self._slot(k, to, lifetime_s, up)))
            delay_s = started + (k + 1) / rate - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
        await asyncio.wait(self.first_up, timeout=up_timeout)
        return {"up": self._up(), "ramp_s": round(time.monotonic() - started, 3)}

    def sample(self) -> dict[str, Any]:
        return {
            "t": time.monotonic(),
            "cpu_s": self_cpu_s(),
            "up": self._up(),
            "placed": self.placed_total,
            "completed": self.completed,
            "failed": self.failed,
            "dropped": self.dropped,
            "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }

    async def soak_finish(self, timeout_s: float) -> dict[str, Any]:
        self.churning = False
        if self.freezer is not None:
            self.freezer.cancel()
        if self.slots:
            _, pending = await asyncio.wait(self.slots, timeout=timeout_s)
            for task in pending:
                task.cancel()
        wire = self.figures.to_wire()
        for name, values in self.samples.items():
            wire[name] = []
            wire[name + "_summary"] = summarize(values).as_dict()
            wire[name + "_count"] = len(values)
        return {
            "figures": wire,
            "placed": self.placed_total,
            "completed": self.completed,
            "failed": self.failed,
            "dropped": self.dropped,
            "app_hangups": self.app_hangups,
            "caller_hangups": self.caller_hangups,
            "errors": dict(sorted(self.errors.items())[:20]),
            "rest_requests": len(self.rest.requests) if self.rest is not None else 0,
        }

    async def _freeze_while_churning(self) -> None:
        """Keep the collector's full passes short (the churn stall, docs/PERFORMANCE.md).

        Every call keeps all its messages until it ends (for :func:`analyse_calls`), so the
        oldest generation grows large, and each automatic full pass walks all of it on the loop
        that paces the callers' frames, to find next to nothing. ``gc.freeze()`` every second
        moves what is alive into the permanent generation, which no pass walks; what is dropped
        later is still freed by reference counting, and the rare cycles among frozen objects
        stay until the worker exits (the worker's own RSS is reported by ``window_end``).
        """
        while self.churning:
            gc.freeze()
            await asyncio.sleep(FREEZE_PERIOD_S)

    # ------------------------------------------------------------------ one slot
    def _up(self) -> int:
        return sum(1 for s in self.talker.scripts.values() if not s.session.closed)

    def _fail(self, reason: str) -> None:
        self.failed += 1
        self.errors[reason[:120]] = self.errors.get(reason[:120], 0) + 1

    async def _script_of(self, call_sid: str) -> AppScript | None:
        deadline = time.monotonic() + CALL_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            script = self.talker.scripts.get(call_sid)
            if script is not None:
                return script
            await asyncio.sleep(0.05)
        return None

    async def _slot(
        self, k: int, to: str, lifetime_s: tuple[float, float], up: asyncio.Future[None]
    ) -> None:
        """Place a call, keep it ``lifetime_s``, end it, measure it; again until told to stop."""
        serial = 0
        while self.churning:
            serial += 1
            self.placed_total += 1
            slot = Placed()
            await self._place(slot, to, is_sip_slot(k, self.sip_share))
            call = slot.call
            if call is None or not call.has_stream or slot.error:
                self._fail(slot.error or "no stream")
                if call is not None:
                    with contextlib.suppress(Exception):
                        await call.hangup()
                await asyncio.sleep(1.0)
                continue
            script = await self._script_of(call.call_sid)
            if script is None:
                self._fail("no session.start")
                with contextlib.suppress(Exception):
                    await call.hangup()
                await self._cancel(slot)
                continue
            if not up.done():
                up.set_result(None)
            t0 = script.started_at + SETTLE_S
            end_at = script.started_at + self.rng.uniform(*lifetime_s)
            session = script.session
            while self.churning and not (call.closed or session.closed):
                remaining_s = end_at - time.monotonic()
                if remaining_s <= 0:
                    break
                await asyncio.sleep(min(1.0, remaining_s))
            t1 = time.monotonic()
            if call.closed or session.closed:
                self.dropped += 1
            elif (k + serial) % 2 == 0 and self.churning:
                self.app_hangups += 1
                with contextlib.suppress(Exception):
                    if isinstance(session, TwilioAppSession):
                        await session.close()  # docs/protocol-twilio.md: close to hang up
                    else:
                        await session.send({"type": "hangup"})
            else:
                self.caller_hangups += 1
                with contextlib.suppress(Exception):
                    await call.hangup()
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while time.monotonic() < deadline and not (call.closed and session.closed):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if not call.closed:  # the app's hangup did not reach the caller: end it ourselves
                self._fail("call still open after hangup")
                with contextlib.suppress(Exception):
                    await call.hangup()
            await self._cancel(slot)
            if t1 > t0:
                self._absorb(analyse_calls([(call, script)], (t0, t1)))
            self.completed += 1
            self._forget(call.call_sid, script)

    async def _cancel(self, slot: Placed) -> None:
        if slot.driver is not None:
            slot.driver.cancel()
            await asyncio.gather(slot.driver, return_exceptions=True)

    def _absorb(self, figures: CallerFigures) -> None:
        for name in SAMPLE_FIELDS:
            values: list[float] = getattr(figures, name)
            self.samples[name].extend(values)
            values.clear()
        self.figures.merge(figures)

    def _forget(self, call_sid: str, script: AppScript) -> None:
        """Drop a finished call's recordings (the fakes keep every message otherwise)."""
        self.talker.scripts.pop(call_sid, None)
        with contextlib.suppress(ValueError):
            self.app.sessions.remove(script.session)
        if self.twilio is not None:
            self.twilio.calls = [c for c in self.twilio.calls if c.call_sid != call_sid]


async def _serve(index: int) -> None:
    worker = worker_from_env(SoakWorker, index)
    watch = start_stall_watch()

    async def dispatch(cmd: str, request: dict[str, Any]) -> dict[str, Any]:
        if cmd == "soak_start":
            low, high = request["lifetime_s"]
            return await worker.soak_start(
                request["base_url"],
                int(request["calls"]),
                request["to"],
                float(request["rate"]),
                (float(low), float(high)),
                float(request["up_timeout"]),
                request.get("sip"),
                float(request.get("sip_share", 0.0)),
            )
        if cmd == "sample":
            return worker.sample()
        if cmd == "soak_finish":
            return await worker.soak_finish(float(request["timeout"]))
        raise ValueError(f"unknown command {cmd!r}")

    try:
        await serve_commands(worker, dispatch)
    finally:
        worker.churning = False
        for task in worker.slots:
            task.cancel()
        await asyncio.gather(*worker.slots, return_exceptions=True)
        await worker.stop()
        if watch is not None:
            watch.stop()


def main(argv: list[str] | None = None) -> int:
    return run_worker(
        argv, _serve, "usage: python -m bench.soak_worker INDEX (driven by bench.soak)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
