"""Inbound SIP calls against real sipp (the Debian package sip-tester), all on loopback.

sipp plays the caller (UAC) with the scenarios in ``tests/integration/sipp/``; the gateway runs
in-process with ``[sip]`` listening on 127.0.0.1 and a :class:`FakeApp` as the routed app.
Under ``CI=true`` a missing sipp fails; elsewhere these tests skip (deploy/install-test-peers.sh
installs it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from appbridge.gateway import Gateway
from appbridge.testing import FakeApp
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import SECRET, make_config
from tests.integration.sipp_support import (
    SCENARIOS,
    finish_sipp,
    free_port,
    scenario_file,
    sipp_required,
    spawn_sipp,
)

PCAPS = Path("/usr/share/sip-tester")
ROUTED = "+15550001111"

pytestmark = [sipp_required(), pytest.mark.timeout(60)]


@dataclass
class SipEnv:
    gw: Gateway
    app: FakeApp
    sip_port: int


@asynccontextmanager
async def sip_gateway(rtp_low: int) -> AsyncIterator[SipEnv]:
    app = FakeApp(secret=SECRET)
    await app.start()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    config = make_config(
        port,
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        numbers=[{"number": ROUTED, "app": "main"}],
        sip={"listen": ["udp:127.0.0.1:5060"], "rtp_ports": [rtp_low, rtp_low + 99]},
    )
    assert config.sip is not None
    # Port 0 (any free port) bypasses the validator on purpose: tests must not collide.
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("udp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            yield SipEnv(gw, app, gw.sip.transport.udp_addresses[0][1])
    finally:
        await app.stop()


async def run_sipp(
    env: SipEnv, scenario: str, service: str, tmp: Path, *extra: str, **fill: str
) -> tuple[int, str]:
    """Run one sipp scenario against the gateway; ``@KEY@`` placeholders are filled from
    ``fill``; ``extra`` are more sipp options (``-trace_msg``...)."""
    path = scenario_file(tmp, (SCENARIOS / scenario).read_text(), scenario, **fill)
    proc = await spawn_sipp(
        tmp,
        f"127.0.0.1:{env.sip_port}",
        "-sf",
        str(path),
        "-s",
        service,
        *extra,
        local_port=free_port(),
    )
    return await finish_sipp(proc, tmp)


async def test_basic_call_session_start_and_caller_audio(tmp_path: Path) -> None:
    async with sip_gateway(41000) as env:
        sipp = asyncio.create_task(
            run_sipp(
                env,
                "uac_basic.xml",
                ROUTED,
                tmp_path,
                pcap=str(PCAPS / "g711a.pcap"),
                pause_ms="3000",
            )
        )
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "inbound"
        assert start["from"] == "+15551230001"
        assert start["to"] == ROUTED
        assert start["callRef"].startswith("CA") and len(start["callRef"]) == 34
        # Caller audio from the pcap reaches the app as binary frames.
        await session.wait_until(lambda: len(session.audio) >= 25, timeout=8)
        rc, log = await sipp
        assert rc == 0, log
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        assert env.gw.sip is not None
        leg_stats = env.gw.sip.inbound
        assert leg_stats.rejected == {}


async def test_cancel_before_answer_gets_487(tmp_path: Path) -> None:
    async with sip_gateway(41200) as env:
        env.app.refuse = True  # the app is slow to accept: the gateway keeps ringing
        rc, log = await run_sipp(env, "uac_cancel.xml", ROUTED, tmp_path)
        assert rc == 0, log
        assert env.gw.sip is not None
        assert env.gw.sip.inbound.rejected.get(487) == 1
        for _ in range(100):
            if len(env.gw.registry) == 0:
                break
            await asyncio.sleep(0.02)
        assert len(env.gw.registry) == 0
        assert env.gw.metrics.calls_ended.get("caller_hangup") == 1


async def test_unrouted_number_gets_404(tmp_path: Path) -> None:
    async with sip_gateway(41400) as env:
        rc, log = await run_sipp(env, "uac_404.xml", "+15559999999", tmp_path)
        assert rc == 0, log
        assert env.gw.sip is not None
        assert env.gw.sip.inbound.rejected == {404: 1}
        assert len(env.gw.registry) == 0


async def test_rfc4733_dtmf_from_pcap_reaches_the_app(tmp_path: Path) -> None:
    async with sip_gateway(41600) as env:
        sipp = asyncio.create_task(
            run_sipp(
                env,
                "uac_basic.xml",
                ROUTED,
                tmp_path,
                pcap=str(PCAPS / "dtmf_2833_1.pcap"),
                pause_ms="2000",
            )
        )
        session = await env.app.next_session(timeout=10)
        await session.wait_for("session.start", timeout=5)
        dtmf = await session.wait_for("dtmf", timeout=8)
        assert dtmf["digit"] == "1"
        rc, log = await sipp
        assert rc == 0, log
        assert len(session.of_type("dtmf")) == 1
