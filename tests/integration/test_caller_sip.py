"""The SIP test caller (``appbridge.caller.sip``) against a real gateway on loopback.

No outside peer is needed: the caller is the gateway's own SIP stack playing the UAC, so these
tests run everywhere (no sipp/baresip guard). The gateway runs in-process with ``[sip]`` on
127.0.0.1 (UDP and TCP on free ports), answering with :class:`FakeApp` (which records what the
app sees) or with the embedded demo app (whose greeting the caller must hear and record).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from appbridge.caller.sip import (
    SipCallFailed,
    SipCallPlan,
    SipTestCaller,
    place_sip_call,
)
from appbridge.config import Config, SipConfig, default_config
from appbridge.gateway import Gateway
from appbridge.media.wav import parse_wav
from appbridge.testing import FakeApp
from appbridge.testing.audio import dominant_freq, rms_pcm16, tone_pcm16
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import SECRET, make_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROUTED = "+15550002222"
APP_RATE_HZ = 16000  # FakeApp sessions use the default app audio: pcm16 at 16 kHz
SILENT_RMS = 100.0
APPBRIDGE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "appbridge"


@dataclass
class SipEnv:
    gw: Gateway
    app: FakeApp
    udp_port: int
    tcp_port: int

    def uri(self, number: str = ROUTED, *, tcp: bool = False) -> str:
        if tcp:
            return f"sip:{number}@127.0.0.1:{self.tcp_port};transport=tcp"
        return f"sip:{number}@127.0.0.1:{self.udp_port}"


def with_sip(config: Config, rtp_low: int) -> Config:
    """``[sip]`` on free loopback ports: port 0 bypasses the validator, so tests never collide."""
    sip = SipConfig(
        listen=("udp:127.0.0.1:0", "tcp:127.0.0.1:0"),
        rtp_ports=(rtp_low, rtp_low + 99),
        public_address=None,
        trunks=(),
    )
    return dataclasses.replace(config, sip=sip)


@asynccontextmanager
async def sip_env(rtp_low: int) -> AsyncIterator[SipEnv]:
    app = FakeApp(secret=SECRET)
    await app.start()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    config = make_config(
        port,
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        numbers=[{"number": ROUTED, "app": "main"}],
    )
    try:
        async with running_gateway(with_sip(config, rtp_low), sock) as gw:
            assert gw.sip is not None
            transport = gw.sip.transport
            yield SipEnv(gw, app, transport.udp_addresses[0][1], transport.tcp_addresses[0][1])
    finally:
        await app.stop()


async def test_call_digits_audio_both_ways_and_bye_over_udp() -> None:
    async with sip_env(44000) as env:
        lines: list[str] = []
        async with SipTestCaller(env.uri(), from_user="+15550001111", emit=lines.append) as c:
            assert await c.call(timeout_s=10) == 200
            session = await env.app.next_session(timeout=5)
            start = await session.wait_for("session.start", timeout=5)
            assert (start["from"], start["to"]) == ("+15550001111", ROUTED)
            assert [e.kind for e in c.history[:1]] == ["invite"]
            assert {e.status for e in c.history if e.kind == "provisional"} >= {100, 180}
            # Keypresses: RFC 4733 events that the app receives as `dtmf`, one per key.
            await c.send_digits("1#", wait=True)
            await session.wait_until(lambda: len(session.of_type("dtmf")) == 2, timeout=5)
            assert [m["digit"] for m in session.of_type("dtmf")] == ["1", "#"]
            assert [e.digit for e in c.history if e.kind == "digit_sent"] == ["1", "#"]
            # The app's audio reaches the caller: a 600 Hz tone in what was heard.
            before = len(c.heard())
            await session.send_binary(tone_pcm16(600, 1000, APP_RATE_HZ, amplitude=8000))
            await c.wait_until(lambda: rms_pcm16(c.heard()[before:][-1600:]) > 2000, 5)
            await asyncio.sleep(0.5)
            heard = c.heard()[before:]
            loud = max((heard[i : i + 1600] for i in range(0, len(heard), 800)), key=rms_pcm16)
            assert abs(dominant_freq(loud, 8000) - 600) < 20
            # The caller's audio reaches the app: a 1 kHz tone, sent in real time.
            await c.send_audio(tone_pcm16(1000, 600, 8000, amplitude=8000))
            assert c.queued_audio_s == 0
            await session.wait_until(
                lambda: rms_pcm16(session.inbound_audio()[-3200:]) > 2000, timeout=5
            )
            inbound = session.inbound_audio()[-6400:]
            loud = max((inbound[i : i + 3200] for i in range(0, len(inbound), 640)), key=rms_pcm16)
            assert abs(dominant_freq(loud, APP_RATE_HZ) - 1000) < 20
            await c.hangup()
            assert c.ended and c.hung_up_by == "caller"
            end = await session.wait_for("session.end", timeout=5)
            assert end["reason"] == "caller_hangup"
            stats = c.stats()
            assert stats["sent"] >= 50 and stats["received"] >= 50 and stats["lost"] == 0
            assert [e.kind for e in c.history][-3:] == ["hangup", "bye_answered", "ended"]
        text = "\n".join(lines)
        assert "180 Ringing" in text and "answered" in text and "BYE answered 200" in text


async def test_tcp_call_ended_by_the_app_is_a_remote_hangup() -> None:
    async with sip_env(44200) as env, SipTestCaller(env.uri(tcp=True)) as c:
        await c.call(timeout_s=10)
        assert c.invite is not None
        assert (c.invite.headers.get("Via") or "").startswith("SIP/2.0/TCP ")
        session = await env.app.next_session(timeout=5)
        await session.wait_for("session.start", timeout=5)
        await c.send_digits("7")
        dtmf = await session.wait_for("dtmf", timeout=5)
        assert dtmf["digit"] == "7"
        await session.send({"type": "hangup", "id": "bye"})
        await c.wait_ended(timeout_s=5)
        assert c.hung_up_by == "remote"
        assert (await c.wait_for("remote_hangup")).kind == "remote_hangup"


async def test_unrouted_number_fails_with_404_and_cancel_before_answer() -> None:
    async with sip_env(44400) as env:
        caller = SipTestCaller(env.uri("+15559999999"))
        with pytest.raises(SipCallFailed) as failed:
            await caller.call(timeout_s=10)
        assert failed.value.status == 404
        await caller.close()
        # A slow app keeps the gateway ringing: hanging up then is a CANCEL, answered 487.
        env.app.refuse = True
        lines: list[str] = []
        hang_up = asyncio.Event()

        def emit(line: str) -> None:
            lines.append(line)
            if "180 Ringing" in line:
                hang_up.set()  # Ctrl-C while it rings

        plan = SipCallPlan(uri=env.uri(), duration_s=5)
        task = asyncio.create_task(place_sip_call(plan, emit=emit, hang_up=hang_up))
        report = await asyncio.wait_for(task, 10)
        assert report.exit_code == 1 and report.status == 487, lines
        assert any("CANCEL sent" in line for line in lines)
        assert lines[-1] == "summary: not answered: 487 Request Terminated"


async def test_the_demo_greeting_is_heard_and_recorded(tmp_path: Path) -> None:
    sock = bind_loopback()
    port = sock.getsockname()[1]
    record = tmp_path / "heard.wav"
    lines: list[str] = []
    async with running_gateway(with_sip(default_config(port), 44600), sock) as gw:
        assert gw.sip is not None
        udp = gw.sip.transport.udp_addresses[0][1]
        plan = SipCallPlan(uri=f"sip:{ROUTED}@127.0.0.1:{udp}", duration_s=4.0, record=record)
        report = await place_sip_call(plan, emit=lines.append)
    assert report.exit_code == 0, lines
    assert report.hung_up_by == "caller"
    audio = parse_wav(record.read_bytes())
    assert audio.rate_hz == 8000
    assert abs(len(audio.pcm16) / 16000 - 4.0) < 0.3
    # The greeting is speech: loud enough and lasting (eSpeak at the demo's level).
    frames = [audio.pcm16[i : i + 320] for i in range(0, len(audio.pcm16) - 319, 320)]
    voiced = [f for f in frames if rms_pcm16(f) >= SILENT_RMS]
    assert len(voiced) * 0.020 > 1.5, lines
    assert max(rms_pcm16(f) for f in frames) > 1000
    assert any("audio from the far end starts" in line for line in lines)
    assert "you hung up" in lines[-1]


async def _run_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(APPBRIDGE),
        "call",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 40)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_command_line_end_to_end(tmp_path: Path) -> None:
    record = tmp_path / "out.wav"
    async with sip_env(44800) as env:
        rc, out, err = await _run_cli(
            env.uri(), "--digits", "5", "--record", str(record), "--duration", "4"
        )
        assert rc == 0, out + err
        session = env.app.sessions[0]
        await session.wait_for("session.end", timeout=5)
        assert [m["digit"] for m in session.of_type("dtmf")] == ["5"]
        for expected in ("100 Trying", "180 Ringing", "answered", "digit sent: 5", "BYE sent"):
            assert expected in out, out
        assert f" s to {record}" in out
        assert out.strip().splitlines()[-1].startswith("summary: 200 OK; talked 4.")
        assert abs(len(parse_wav(record.read_bytes()).pcm16) / 16000 - 4.0) < 0.3
        # An unrouted number: exit 1 with the SIP status printed.
        rc, out, err = await _run_cli(env.uri("+15559999999"), "--duration", "2")
        assert rc == 1, out + err
        assert "404" in out and "not answered: 404" in out
    # Usage errors: exit 2 with the reason.
    rc, out, err = await _run_cli("sip:127.0.0.1;transport=sctp")
    assert rc == 2 and "transport=sctp" in err
    rc, out, err = await _run_cli("sip:+1555@127.0.0.1", "--digits", "12x")
    assert rc == 2 and "--digits" in err
