"""Reconnecting app links (docs/protocol-session-v1.md, "Reconnecting"), end to end.

The gateway runs in-process and the caller is the fake Twilio carrier or sipp; the app is the
plain FakeApp (its frames by hand), or a real SDK app process that is killed with SIGKILL and
started again on the same port with its state in a JSON file. Waits poll for a condition with a
bound; none asserts how fast something happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.testing.fake_app import FakeApp, FakeSession
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.integration.conftest import API_TOKEN, SECRET, Env, gateway_env
from tests.integration.sipp_support import sipp_required
from tests.integration.test_sip_sipp import PCAPS, ROUTED, run_sipp, sip_gateway

REPO = Path(__file__).resolve().parents[2]
SENTENCE = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
SORRY = "Sorry, the assistant is unavailable. Goodbye."


def with_fallback(app: FakeApp) -> list[dict[str, Any]]:
    return [
        {
            "ref": "main",
            "url": app.url,
            "signing_secret": SECRET,
            "fallback": {"message": SORRY},
        }
    ]


async def connect(env: Env) -> tuple[FakeTwilioCall, FakeSession, dict[str, Any]]:
    call = await env.twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
    assert call.webhook_status == 200, call.twiml
    session = await env.app.next_session(timeout=5)
    start = await session.wait_for("session.start", timeout=5)
    return call, session, start


async def heard_grows(call: FakeTwilioCall, by_bytes: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    before = len(call.heard_ulaw())
    await call.wait_until(lambda: len(call.heard_ulaw()) >= before + by_bytes, timeout=timeout)


async def eventually(condition: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- the plain FakeApp path ------------------------------------------------------------------


async def test_a_lost_link_is_redialled_and_taken_back_with_events_lost() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, start = await connect(env)
        assert "reconnect" not in start  # absent on every normal start
        await first.set_reconnect(True)
        await first.send({"type": "speak", "id": "long", "text": SENTENCE})
        await first.wait_for("output.started", timeout=10)
        env.app.refuse = True  # the first attempts fail: events pile up meanwhile
        await first.close()
        await call.send_dtmf("5")  # an event for the app while it is away
        await asyncio.sleep(0.3)
        env.app.refuse = False
        second = await env.app.next_session(timeout=10)
        again = await second.wait_for("session.start", timeout=5)
        assert again["sessionRef"] == start["sessionRef"]
        assert again["callRef"] == start["callRef"]
        info = again["reconnect"]
        assert info["attempt"] >= 2 and info["downMs"] >= 300
        await heard_grows(call, 4000)  # the caller keeps hearing what was queued
        await second.set_reconnect(True)
        lost = await second.wait_for("events.lost", timeout=5)
        assert lost["count"] >= 1  # at least the keypress
        assert not second.of_type("dtmf")  # dropped, never delivered late
        await second.send({"type": "speak", "id": "after", "text": "We are back."})
        await second.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "after", 15)
        await call.send_dtmf("7")
        dtmf = await second.wait_for("dtmf", timeout=5)
        assert dtmf["digit"] == "7"


async def test_an_app_that_answers_otherwise_sends_the_call_to_its_fallback() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.close()
        second = await env.app.next_session(timeout=10)
        assert (await second.wait_for("session.start", timeout=5))["reconnect"]["attempt"] == 1
        await second.send({"type": "speak", "text": "I do not know this session."})
        await call.wait_closed(timeout=20)
        assert len(call.heard_ulaw()) > 8000  # the fallback message was spoken
        assert not second.of_type("events.lost")


async def test_an_attempt_not_answered_in_2_s_is_followed_by_the_next() -> None:
    async with gateway_env(with_fallback) as env:
        _call, first, start = await connect(env)
        await first.set_reconnect(True)
        await first.close()
        silent = await env.app.next_session(timeout=10)
        assert (await silent.wait_for("session.start", timeout=5))["reconnect"]["attempt"] == 1
        await silent.wait_closed(timeout=5)  # the gateway gave up on it after 2 s
        third = await env.app.next_session(timeout=10)
        again = await third.wait_for("session.start", timeout=5)
        assert again["reconnect"]["attempt"] == 2 and again["reconnect"]["downMs"] >= 2000
        assert again["sessionRef"] == start["sessionRef"]
        await third.set_reconnect(True)
        await third.wait_for("events.lost", timeout=5)


async def test_a_failed_reconnect_follows_the_fallback_to_another_app() -> None:
    def apps(app: FakeApp) -> list[dict[str, Any]]:
        return [
            {
                "ref": "main",
                "url": app.url + "?who=main",
                "signing_secret": SECRET,
                "fallback": {"app": "overflow"},
            },
            {"ref": "overflow", "url": app.url + "?who=overflow", "signing_secret": SECRET},
        ]

    async with gateway_env(apps) as env:
        _call, first, start = await connect(env)
        await first.set_reconnect(True)
        await first.close()
        second = await env.app.next_session(timeout=10)
        await second.wait_for("session.start", timeout=5)
        await second.close()  # a close ends reconnecting: the fallback applies
        overflow = await env.app.next_session(timeout=10)
        fresh = await overflow.wait_for("session.start", timeout=5)
        assert overflow.path.endswith("who=overflow") and fresh["appRef"] == "overflow"
        assert fresh["sessionRef"] != start["sessionRef"] and "reconnect" not in fresh
        await overflow.send({"type": "speak", "id": "o", "text": "Overflow here."})
        await overflow.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "o", 15)


async def test_reconnect_false_and_the_last_word_turn_reconnecting_off() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.set_reconnect(False)
        await first.close()
        await call.wait_closed(timeout=10)

        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        await first.send({"type": "handoff", "app": "nowhere", "id": "h"})  # refused, but said
        await first.wait_for("error", timeout=5)
        await first.set_reconnect(True)  # too late: off for the rest of the session
        await first.close()
        await call.wait_closed(timeout=10)
        with pytest.raises(TimeoutError):
            await env.app.next_session(timeout=1)


async def test_an_api_hangup_between_links_ends_the_call_at_once() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        await first.set_reconnect(True)
        env.app.refuse = True
        await first.close()
        auth = {"Authorization": f"Bearer {API_TOKEN}"}
        async with httpx.AsyncClient(base_url=env.base_url) as client:
            r = await client.delete(f"/v1/calls/{call.call_sid}", headers=auth)
            assert r.status_code == 200
        await call.wait_closed(timeout=5)
        env.app.refuse = False
        with pytest.raises(TimeoutError):
            await env.app.next_session(timeout=1)


async def test_the_caller_hanging_up_between_links_ends_the_call_at_once() -> None:
    async with gateway_env(with_fallback) as env:
        call, first, _ = await connect(env)
        gw_call = env.gw.registry.get(call.call_sid)
        assert gw_call is not None
        await first.set_reconnect(True)
        env.app.refuse = True
        await first.close()
        await eventually(lambda: gw_call.between_links)
        await call.hangup()
        await asyncio.wait_for(gw_call.ended.wait(), 5)
        assert gw_call.end_reason == "caller_hangup"
        env.app.refuse = False
        with pytest.raises(TimeoutError):
            await env.app.next_session(timeout=1)


# --- a real SDK app process, killed mid-call ---------------------------------------------------

WRAPPER = """
import os, runpy, sys, time
import appbridge.sdk  # the slow imports happen before the gate, so a restart binds at once
gate = os.environ.get("GATE", "")
while gate and not os.path.exists(gate):
    time.sleep(0.005)
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BotProcess:
    """examples/reconnect_bot.py as its own process, on a fixed port, with its JSON store."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp, self.port = tmp, port
        self.store = tmp / "state.json"
        self.wrapper = tmp / "run_bot.py"
        self.wrapper.write_text(WRAPPER)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    def spawn(self, gate: Path | None = None) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "APP_PORT": str(self.port),
            "APP_SECRET": SECRET,
            "APP_STATE_FILE": str(self.store),
            "GATE": str(gate) if gate else "",
        }
        log = open(self.tmp / f"bot{len(self.procs)}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, str(self.wrapper), str(REPO / "examples" / "reconnect_bot.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    async def listening(self, timeout_s: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return
        raise AssertionError("the bot never listened: " + self.logs())

    def state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.store.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return next(iter(data.values()), {}) if isinstance(data, dict) else {}

    async def wait_state(self, check: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            state = self.state()
            if state and check(state):
                return state
            await asyncio.sleep(0.05)
        raise AssertionError(f"store state {self.state()!r}; logs: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in self.tmp.glob("bot*.log"))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        for log in self._logs:
            log.close()


@contextmanager
def bot_processes(tmp: Path) -> Iterator[BotProcess]:
    bots = BotProcess(tmp, free_tcp_port())
    try:
        yield bots
    finally:
        bots.stop()


@asynccontextmanager
async def bot_gateway(bots: BotProcess) -> AsyncIterator[Env]:
    def apps(_: FakeApp) -> list[dict[str, Any]]:
        url = f"ws://127.0.0.1:{bots.port}/session"
        return [
            {"ref": "main", "url": url, "signing_secret": SECRET, "fallback": {"message": SORRY}}
        ]

    async with gateway_env(apps) as env:
        yield env


@pytest.mark.timeout(90)
async def test_a_killed_and_restarted_sdk_app_takes_its_session_back(tmp_path: Path) -> None:
    with bot_processes(tmp_path) as bots:
        bots.spawn()
        await bots.listening()
        gate = tmp_path / "go"
        bots.spawn(gate)  # imports now, binds once the first is gone
        async with bot_gateway(bots) as env:
            call = await env.twilio.place_call(
                "+15550001111", "+15550002222", continuous_media=True
            )
            assert call.webhook_status == 200, call.twiml
            await heard_grows(call, 4000)  # the greeting
            for digit in "12":
                await call.send_dtmf(digit)
            await bots.wait_state(lambda s: s["presses"] == 2)
            bots.procs[0].send_signal(signal.SIGKILL)
            bots.procs[0].wait(5)
            gate.touch()
            # The restarted app restores the session from its store and gets events.lost.
            await bots.wait_state(lambda s: "lost" in s, timeout_s=20)
            assert "restored: True" in bots.logs()  # by the resume hook, from the store
            await heard_grows(call, 4000)  # "Welcome back": the call went on
            await call.send_dtmf("3")
            await bots.wait_state(lambda s: s["presses"] == 3)
            await call.send_dtmf("#")
            await call.wait_closed(timeout=20)  # "#": goodbye and hang-up, by the new process


@pytest.mark.timeout(90)
async def test_a_killed_sdk_app_that_stays_down_sends_the_call_to_the_fallback(
    tmp_path: Path,
) -> None:
    with bot_processes(tmp_path) as bots:
        bots.spawn()
        await bots.listening()
        async with bot_gateway(bots) as env:
            call = await env.twilio.place_call(
                "+15550001111", "+15550002222", continuous_media=True
            )
            await heard_grows(call, 4000)
            await call.send_dtmf("1")
            await bots.wait_state(lambda s: s["presses"] == 1)
            bots.procs[0].send_signal(signal.SIGKILL)
            bots.procs[0].wait(5)
            before = len(call.heard_ulaw())
            await call.wait_closed(timeout=30)  # 5 attempts, then the message, then hang-up
            assert len(call.heard_ulaw()) - before > 8000  # over a second of the fallback
            assert env.gw.metrics.app_unreachable >= 1


# --- on SIP, with sipp as the caller -----------------------------------------------------------


@sipp_required()
@pytest.mark.timeout(60)
async def test_a_sip_call_goes_on_across_a_lost_link(tmp_path: Path) -> None:
    async with sip_gateway(41400) as env:
        sipp = asyncio.create_task(
            run_sipp(
                env,
                "uac_basic.xml",
                ROUTED,
                tmp_path,
                pcap=str(PCAPS / "g711a.pcap"),
                pause_ms="8000",
            )
        )
        first = await env.app.next_session(timeout=10)
        start = await first.wait_for("session.start", timeout=5)
        await first.wait_until(lambda: len(first.audio) >= 10, timeout=8)  # caller audio
        await first.set_reconnect(True)
        await first.send({"type": "speak", "id": "long", "text": SENTENCE})
        await first.wait_for("output.started", timeout=10)
        await first.close()
        second = await env.app.next_session(timeout=10)
        again = await second.wait_for("session.start", timeout=5)
        assert again["sessionRef"] == start["sessionRef"] and again["reconnect"]["attempt"] == 1
        await second.set_reconnect(True)
        await second.wait_for("events.lost", timeout=5)
        await second.send({"type": "speak", "id": "after", "text": "Still here."})
        await second.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "after", 15)
        rc, log = await sipp
        assert rc == 0, log
        end = await second.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
