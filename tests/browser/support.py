"""What the real-browser tests stand on (docs/web.md, "Tests"): Debian's chromium driven by
Playwright, a speech WAV for its fake microphone, the gateway as a real ``appbridge serve``
process, and scripted apps on the other side.

Chromium runs headless with a fake capture device that plays a WAV file made here with the
gateway's own offline TTS (eSpeak NG), so what the caller "says" is known and scored by word
error rate. ``--allow-loopback-in-peer-connection`` lets it gather 127.0.0.1 candidates (ICE,
RFC 8445), and mDNS hiding of local addresses is off so the candidates are plain addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from appbridge.testing.fake_app import FakeSession
from appbridge.testing.spoken import espeak

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = ROOT / "build" / "browser"
CHROMIUM = "/usr/bin/chromium"
APP_SECRET = "browser-app-secret"
API_TOKEN = "browser-test-token"
#: What the fake microphone says, again and again (Chrome loops the file).
SENTENCE = "I would like to check the balance of my savings account please."
WAV_RATE_HZ = 48000


def ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def require_chromium() -> str:
    """The chromium binary; missing, it fails under CI=true and skips elsewhere."""
    missing = None
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        missing = "chromium is missing: run deploy/install-test-peers.sh (as root)"
    else:
        try:
            import playwright.async_api  # noqa: F401
        except ImportError:
            missing = (
                "the playwright client is missing: install the test extras (make install-test)"
            )
    if missing:
        if ci():
            pytest.fail(f"CI=true and {missing}", pytrace=False)
        pytest.skip(missing)
    return CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))


def chromium_args(wav: Path) -> list[str]:
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--allow-loopback-in-peer-connection",
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        "--autoplay-policy=no-user-gesture-required",
    ]


# ---------------------------------------------------------------------------------------------
# The caller's voice


def speech_wav(path: Path, text: str = SENTENCE) -> Path:
    """``text`` spoken by eSpeak NG, 16-bit mono PCM at 48 kHz, with silence around it so that
    each pass of the looped file ends a turn (docs/turn-taking.md)."""
    pcm, rate = espeak(text)
    speech = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    times = np.arange(int(len(speech) * WAV_RATE_HZ / rate)) / WAV_RATE_HZ
    resampled = np.interp(times, np.arange(len(speech)) / rate, speech)
    before, after = np.zeros(WAV_RATE_HZ // 2), np.zeros(WAV_RATE_HZ * 3)
    samples = np.concatenate([before, resampled, after]).clip(-32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(WAV_RATE_HZ)
        out.writeframes(samples.tobytes())
    return path


def pcm16_rms_dbfs(pcm: bytes) -> float:
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float64)
    if samples.size == 0:
        return -100.0
    rms = float(np.sqrt(np.mean(samples**2))) / 32768
    return max(-100.0, 20 * float(np.log10(rms))) if rms > 0 else -100.0


# ---------------------------------------------------------------------------------------------
# Scripted apps


async def echo_app(session: FakeSession) -> None:
    """Sends the caller's audio straight back (binary frames from the app carry no track byte:
    docs/protocol-session-v1.md)."""
    sent = 0

    def more() -> bool:
        return len(session.audio) > sent or session.closed

    while not session.closed:
        try:
            await session.wait_until(more, 5)
        except TimeoutError:
            continue
        while sent < len(session.audio):
            frame = session.audio[sent]
            sent += 1
            await session.send_binary(frame[1:])


# ---------------------------------------------------------------------------------------------
# The gateway, as `appbridge serve`

GATEWAY_TOML = """
[server]
host = "{host}"
port = {port}
drain_timeout_s = 1
{api}
[webrtc]
host_addresses = ["127.0.0.1"]

[[apps]]
ref = "agent"
url = "{agent_url}"
signing_secret = "${{APP_SECRET}}"

[[apps]]
ref = "echo"
url = "{echo_url}"
signing_secret = "${{APP_SECRET}}"

[[numbers]]
number = "+15550001000"
app = "agent"

[[numbers]]
number = "+15550002000"
app = "echo"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class GatewayProcess:
    base: str  # always http://127.0.0.1:PORT, whatever the gateway binds
    proc: asyncio.subprocess.Process
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.asynccontextmanager
async def gateway_process(
    folder: Path, agent_url: str, echo_url: str, *, host: str = "127.0.0.1", tokens: bool = False
) -> AsyncIterator[GatewayProcess]:
    port = free_port()
    api = f'\n[api]\ntokens = ["{API_TOKEN}"]\n' if tokens else ""
    text = GATEWAY_TOML.format(
        host=host, port=port, api=api, agent_url=agent_url, echo_url=echo_url
    )
    async with serve_toml(folder, port, text) as gateway:
        yield gateway


@contextlib.asynccontextmanager
async def serve_toml(folder: Path, port: int, text: str) -> AsyncIterator[GatewayProcess]:
    """``appbridge serve`` on the configuration ``text`` (listening on ``port``), until healthy."""
    config = folder / f"gateway-{port}.toml"
    config.write_text(text)
    log = folder / f"gateway-{port}.log"
    env = {**os.environ, "APP_SECRET": APP_SECRET, "APPBRIDGE_LOG_LEVEL": "INFO"}
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "appbridge", "serve", "--config", str(config)),
            env=env,
            cwd=ROOT,
            stdout=sink,
            stderr=sink,
        )
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", proc, log)
    try:
        await wait_healthy(gateway)
        yield gateway
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def wait_healthy(gateway: GatewayProcess, timeout_s: float = 60.0) -> None:
    async with httpx.AsyncClient() as client:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if gateway.proc.returncode is not None:
                raise AssertionError(
                    f"serve exited with {gateway.proc.returncode}:\n{gateway.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(gateway.base + "/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway never became healthy:\n{gateway.log_tail()}")


async def poll(condition: Any, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Call ``condition`` (sync or async) until it returns something truthy; that is returned.
    A bounded wait for a condition, never a fixed sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
