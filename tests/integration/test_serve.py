"""``appbridge serve`` as a real process: start-up, SIGHUP reload, SIGTERM drain
(docs/operations.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio
from appbridge.testing.harness import bind_loopback

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
drain_timeout_s = 5

[carriers.twilio]
account_sid = "AC{sid}"

[[apps]]
ref = "a"
url = "{url}"
signing_secret = "${{APP_SECRET}}"

[[numbers]]
number = "{number}"
app = "a"
"""


def write_config(path: Path, port: int, url: str, number: str) -> None:
    path.write_text(CONFIG.format(port=port, sid="2" * 32, url=url, number=number))


async def wait_healthy(base: str, proc: asyncio.subprocess.Process) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(300):
            if proc.returncode is not None:
                raise AssertionError(f"serve exited with {proc.returncode}")
            try:
                if (await client.get(base + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway never became healthy")


async def test_serve_reloads_on_sighup_and_drains_on_sigterm(tmp_path: Path) -> None:
    app = FakeApp(secret="s3cret")
    await app.start()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    sock.close()
    cfg = tmp_path / "appbridge.toml"
    write_config(cfg, port, app.url, "+15550000001")
    env = {**os.environ, "APP_SECRET": "s3cret", "APPBRIDGE_LOG_LEVEL": "INFO"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "appbridge",
        "serve",
        "--config",
        str(cfg),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    twilio = FakeTwilio(base, account_sid="AC" + "2" * 32, auth_token=None)
    try:
        await wait_healthy(base, proc)
        call = await twilio.place_call("+1555", "+15550000002")
        assert call.twiml_verbs[:2] == ["Say", "Hangup"]  # not routed yet

        cfg.write_text("this is [not toml")
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.5)
        call = await twilio.place_call("+1555", "+15550000002")
        assert call.twiml_verbs[:2] == ["Say", "Hangup"]  # the old configuration stayed

        write_config(cfg, port, app.url, "+15550000002")
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.5)
        call = await twilio.place_call("+1555", "+15550000002")
        assert call.has_stream
        session = await app.next_session(timeout=5)
        await session.wait_for("session.start", timeout=5)

        proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient() as client:
            await asyncio.sleep(0.3)
            ready = await client.get(base + "/readyz")
            assert ready.status_code == 503
        late = await twilio.place_call("+1555", "+15550000002")
        assert "Reject" in late.twiml_verbs  # draining: no new calls
        await call.hangup()  # the live call finishes; the gateway then exits
        code = await asyncio.wait_for(proc.wait(), timeout=15)
        assert code == 0
        stderr = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        assert "keeping the running configuration" in stderr
        assert "configuration reloaded" in stderr
        assert "s3cret" not in stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await twilio.aclose()
        await app.stop()


async def test_serve_refuses_an_invalid_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[server]\nport = "eighty"\n[[apps]]\nref = "a"\nurl = "ws://8.8.8.8/x"\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "appbridge",
        "serve",
        "--config",
        str(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert any(line.startswith("server.port:") for line in lines)
    assert any(line.startswith("apps[0].url:") for line in lines)


@pytest.mark.parametrize("taken", ["http", "sip-udp", "sip-tcp"])
async def test_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path, taken: str) -> None:
    """docs/operations.md, exit codes: a listener that cannot open names its key and address."""
    blocker = socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM if taken == "sip-udp" else socket.SOCK_STREAM
    )
    blocker.bind(("127.0.0.1", 0))
    if taken != "sip-udp":
        blocker.listen()
    port = blocker.getsockname()[1]
    http_port = port if taken == "http" else free_tcp_port()
    proto = "udp" if taken == "sip-udp" else "tcp"
    sip_port = free_tcp_port() if taken == "http" else port
    cfg = tmp_path / "ports.toml"
    cfg.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {http_port}\n'
        f'[sip]\nlisten = ["{proto}:127.0.0.1:{sip_port}"]\n'
        '[[apps]]\nref = "a"\nurl = "ws://127.0.0.1:9/x"\n[[numbers]]\nnumber = "*"\napp = "a"\n'
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "appbridge", "serve", "--config", str(cfg)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        blocker.close()
    assert proc.returncode == 1
    stderr = err.decode()
    assert "Traceback" not in stderr
    key, address = ("server.port", f"127.0.0.1:{port}")
    if taken != "http":
        key, address = ("sip.listen", f"{proto}:127.0.0.1:{port}")
    errors = [line.split(" ERROR ", 1)[1] for line in stderr.splitlines() if " ERROR " in line]
    assert errors == [f"appbridge: {key}: cannot listen on {address}: address already in use"]


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
