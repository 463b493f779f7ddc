"""Every example in examples/ against the real gateway, with the fake Twilio caller.

The SDK examples are imported from their files and served by an ``AppServer`` on loopback; the
gateway runs in-process (``gateway_env``) with its app URL pointing at it, as
examples/appbridge.examples.toml does for ``make run``. The Pipecat example runs as a subprocess
of ``.venv-pipecat`` (skipped when that is absent, failed under ``CI=true``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from appbridge.config import load_config
from appbridge.sdk import AppServer, Session
from appbridge.testing.audio import dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from appbridge.testing.fake_app import FakeApp, FakeSession
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.integration.conftest import SECRET, Env, gateway_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PIPECAT_PYTHON = REPO / ".venv-pipecat" / "bin" / "python"
HTTP_SID = "AC" + "7" * 32
HTTP_TOKEN = "examples-test-token"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def quiet_for(call: FakeTwilioCall, ticks: int) -> bool:
    """The caller heard something, then nothing for the last ``ticks`` 20 ms ticks."""
    frames = call.heard_frames()
    return (
        call.first_audio_at() is not None
        and len(frames) >= ticks
        and all(n == 0 for _, _, n in frames[-ticks:])
    )


class Example:
    def __init__(self, env: Env, listener: FakeApp) -> None:
        self.env = env
        self.listener = listener
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        self.gathers = 0
        """How many times the handler called ``gather``."""

    def in_gather(self, n: int, session: Session) -> Callable[[], bool]:
        """True while the ``n``-th gather of the call waits for input."""
        return lambda: self.gathers == n and session.gathering

    async def call(self) -> tuple[FakeTwilioCall, Session, FakeSession]:
        call = await self.env.twilio.place_call("+15550001111", "+15550000002")
        assert call.webhook_status == 200, call.twiml
        session = await asyncio.wait_for(self.sessions.get(), 5)
        listened = await self.listener.next_session(timeout=5)
        return call, session, listened


@asynccontextmanager
async def serving(handler: Callable[[Session], Any]) -> AsyncIterator[Example]:
    """The example's handler behind an AppServer, a gateway dialing it, a listener watching."""
    holder: list[Example] = []

    async def run(session: Session) -> None:
        example = holder[0]
        gather = session.gather

        async def counted(**kw: Any) -> Any:
            example.gathers += 1
            return await gather(**kw)

        session.gather = counted  # type: ignore[method-assign]
        example.sessions.put_nowait(session)
        await handler(session)

    server = await AppServer(run, secrets=SECRET).serve()
    listener = FakeApp(secret=SECRET)
    await listener.start()

    def apps(_: object) -> list[dict[str, Any]]:
        return [
            {
                "ref": "example",
                "url": server.url,
                "signing_secret": SECRET,
                "listeners": [{"url": listener.url, "tracks": "inbound"}],
            }
        ]

    try:
        async with gateway_env(apps) as env:
            holder.append(Example(env, listener))
            yield holder[0]
    finally:
        await listener.stop()
        await server.close()


def test_the_examples_configuration_is_valid() -> None:
    config = load_config(EXAMPLES / "appbridge.examples.toml", env={})
    assert {a.ref for a in config.apps.values()} == {"echo", "ivr", "llm", "pipecat", "demo"}
    urls = {a.ref: a.url for a in config.apps.values()}
    assert urls["echo"].endswith(":9001/session") and urls["pipecat"].endswith(":9004/ws")


async def test_echo_bot_echoes_the_caller() -> None:
    echo_bot = load_example("echo_bot")
    async with serving(echo_bot.echo) as ex:
        call, session, _ = await ex.call()
        await call.wait_until(lambda: quiet_for(call, 30), timeout=15)  # the greeting is over
        heard_before = len(call.heard_ulaw())
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(1000, 800, 8000)))
        await call.wait_until(lambda: len(call.heard_ulaw()) - heard_before > 5600, timeout=5)
        echoed = ulaw_decode(call.heard_ulaw()[heard_before:])
        assert abs(dominant_freq(echoed, 8000) - 1000) < 30
        await call.send_dtmf("1")  # any key: "Goodbye." and the hang-up
        await call.wait_closed(timeout=15)
        assert session.end is not None and session.end.reason == "app_hangup"


async def test_ivr_transfers_and_survives_a_failed_transfer() -> None:
    ivr = load_example("ivr")
    async with serving(ivr.ivr) as ex:
        call, session, _ = await ex.call()
        rest = ex.env.rest
        rest.fail_next(400, 21211)  # sales cannot be reached the first time
        await eventually(ex.in_gather(1, session))  # the menu
        await call.send_dtmf("1")
        await eventually(lambda: len(rest.requests) == 1)
        assert rest.requests[0].status == 400
        await eventually(ex.in_gather(2, session))  # sorry, then the menu again
        await call.send_dtmf("2")
        await eventually(ex.in_gather(3, session))  # "type your ticket number"
        for digit in "42#":
            await call.send_dtmf(digit)
        await call.wait_closed(timeout=20)
        assert rest.transfers and f"<Number>{ivr.SUPPORT_NUMBER}</Number>" in rest.transfers[0][1]
        assert session.end is not None and session.end.reason == "transfer"
        assert len(call.heard_ulaw()) / 8000 > 3  # menu, apology, menu, ticket, thanks


async def test_reconnect_bot_counts_keys_in_its_store(tmp_path: Path) -> None:
    """examples/reconnect_bot.py in-process; its restart is tests/integration/test_reconnect.py."""
    bot = load_example("reconnect_bot")
    bot.STORE = bot.JsonStore(tmp_path / "state.json")
    async with serving(bot.reconnect_bot) as ex:
        call, session, _ = await ex.call()
        await eventually(lambda: bot.STORE.get(session.session_ref) == {"presses": 0})
        assert await bot.can_resume(session.start)
        for digit in "12":
            await call.send_dtmf(digit)
        await eventually(lambda: bot.STORE.get(session.session_ref) == {"presses": 2})
        await call.send_dtmf("#")
        await call.wait_closed(timeout=20)
        assert session.end is not None and session.end.reason == "app_hangup"
        await eventually(lambda: bot.STORE.get(session.session_ref) is None)  # dropped at the end
        assert not await bot.can_resume(session.start)


async def test_llm_bot_streams_one_multi_piece_utterance(monkeypatch: pytest.MonkeyPatch) -> None:
    llm_bot = load_example("llm_bot")
    tokens: list[str] = []
    generate = llm_bot.generate

    async def recording(heard: str | None) -> AsyncIterator[str]:
        async for token in generate(heard):
            tokens.append(token)
            yield token

    monkeypatch.setattr(llm_bot, "generate", recording)
    async with serving(llm_bot.llm_bot) as ex:
        call, session, listened = await ex.call()
        done = await listened.wait_for("output.done", timeout=20)
        started = listened.of_type("output.started")
        assert [m["id"] for m in started] == [done["id"]]  # one utterance...
        greeting_tokens = len(tokens)
        assert greeting_tokens > 10  # ...of many pieces
        assert done["heardMs"] > 3000 and len(call.heard_ulaw()) / 8000 > 3
        await eventually(ex.in_gather(1, session))
        await call.send_dtmf("5")
        reply = await listened.wait_for("output.done", timeout=20)
        assert reply["id"] != done["id"] and reply["heardMs"] > 2000
        assert "".join(tokens[greeting_tokens:]).startswith("You said the key 5.")


# ---------------------------------------------------------------------- Pipecat
def _pipecat_or_skip() -> Path:
    problem = None
    if not PIPECAT_PYTHON.exists():
        problem = f"{PIPECAT_PYTHON} does not exist"
    else:
        probe = subprocess.run(
            [str(PIPECAT_PYTHON), "-c", "import fastapi, uvicorn, pipecat.serializers.twilio"],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if probe.returncode != 0:
            problem = "Pipecat does not import in .venv-pipecat"
    if problem is not None:
        message = f"Pipecat missing ({problem}); run `bash deploy/install-test-peers.sh`"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return PIPECAT_PYTHON


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _listening(port: int, timeout_s: float) -> bool:
    for _ in range(int(timeout_s / 0.1)):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return True
    return False


@pytest.mark.interop
async def test_pipecat_example_echoes_and_hangs_up_through_the_gateway(tmp_path: Path) -> None:
    python = _pipecat_or_skip()
    port = _free_port()

    def apps(_: object) -> list[dict[str, Any]]:
        url = f"ws://127.0.0.1:{port}/ws"
        return [{"ref": "pc", "url": url, "protocol": "twilio", "workspace_ref": HTTP_SID}]

    http = {"account_sid": HTTP_SID, "auth_token": HTTP_TOKEN}
    async with gateway_env(apps, http=http) as env:
        log = (tmp_path / "pipecat.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            str(python),
            str(EXAMPLES / "pipecat_twilio.py"),
            "--port", str(port),
            "--gateway", env.base_url,
            "--account-sid", HTTP_SID,
            "--auth-token", HTTP_TOKEN,
            stdout=log,
            stderr=log,
            cwd=str(REPO),
        )  # fmt: skip
        try:
            assert await _listening(port, 30), (tmp_path / "pipecat.log").read_text()
            call = await env.twilio.place_call("+15550001111", "+15550000004")
            assert call.webhook_status == 200 and call.has_stream, call.twiml
            await call.send_audio_ulaw(ulaw_encode(tone_pcm16(1000, 1000, 8000)))
            await call.wait_until(lambda: len(call.heard_ulaw()) > 4000, timeout=10)
            assert abs(dominant_freq(ulaw_decode(call.heard_ulaw()), 8000) - 1000) < 30
            await call.drain()
            await call.send_dtmf("#")  # the bot ends its pipeline: auto_hang_up via the gateway
            await call.wait_closed(timeout=15)
            # The gateway hung up for Pipecat through Twilio's REST API (Status=completed).
            assert call.ended_by == "rest", call.ended_by
            hangups = [r for r in env.rest.requests if r.form.get("Status") == "completed"]
            assert len(hangups) == 1
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            log.close()
