"""SIP transfers (docs/sip.md, "Transfers") and outbound TCP trunks against real sipp peers on
127.0.0.1.

- ``SipLeg.dial_party`` to a sipp UAS on the call's trunk: answered (``uas_party.xml`` checks
  the caller id and the app's header), busy (``uas_486.xml``), no answer (``uas_ring_cancel.xml``
  gets our CANCEL), and over a TCP trunk (``-t t1``).
- ``SipLeg.refer`` on an inbound call from a sipp UAC: 202, NOTIFY 100, NOTIFY 200, our BYE
  (``uac_refer.xml``); a REFER whose NOTIFY reports 503 fails and the call stays up
  (``uac_refer_fail.xml``).
- ``POST /v1/calls`` through a ``transport = "tcp"`` trunk to sipp's ``uas`` on ``-t t1``, and a
  trunk that refuses the connection (502).

The engine's transfer command flow is the lead's (calls/transfer.py); these tests drive the legs
directly. Under ``CI=true`` a missing sipp fails; elsewhere these tests skip.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.inbound import SipCall
from appbridge.carriers.sip.leg import SipLeg
from appbridge.carriers.sip.party import dial_party
from appbridge.gateway import Gateway
from appbridge.testing import FakeApp
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import API_TOKEN, SECRET, make_config
from tests.integration.sipp_support import (
    bundled_scenario,
    finish_sipp,
    free_port,
    sipp_required,
    spawn_sipp,
    until_bound,
)
from tests.integration.test_sip_sipp import PCAPS, SipEnv, run_sipp

UAS_ERRORS = "sipp_uas_errors.log"  # beside a UAC sipp's sipp_errors.log in the same tmp
ROUTED = "+15550001111"
PARTY = "+15550003333"
CALLER_ID = "+15550004444"

pytestmark = [sipp_required(), pytest.mark.timeout(60)]


@dataclass
class Env:
    gw: Gateway
    app: FakeApp
    sip_port: int
    trunk_port: int
    http: httpx.AsyncClient

    @property
    def sip_env(self) -> SipEnv:
        return SipEnv(self.gw, self.app, self.sip_port)


@asynccontextmanager
async def transfer_gateway(rtp_low: int, transport: str = "udp") -> AsyncIterator[Env]:
    """A gateway with one trunk ``main`` on 127.0.0.1 (``transport``), a free port for the
    sipp peer that plays it, and the FakeApp routed for ``ROUTED``."""
    app = FakeApp(secret=SECRET)
    await app.start()
    kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
    trunk_port = free_port(kind)
    sock = bind_loopback()
    config = make_config(
        sock.getsockname()[1],
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        numbers=[{"number": "*", "app": "main"}],
        sip={
            "listen": ["udp:127.0.0.1:5060"],
            "rtp_ports": [rtp_low, rtp_low + 99],
            "trunks": [
                {"name": "main", "host": "127.0.0.1", "port": trunk_port, "transport": transport}
            ],
        },
    )
    assert config.sip is not None
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("udp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            base = gw.config.server.base_url()
            headers = {"Authorization": f"Bearer {API_TOKEN}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:
                yield Env(gw, app, gw.sip.transport.udp_addresses[0][1], trunk_port, http)
    finally:
        await app.stop()


async def start_uas(
    env: Env, tmp: Path, scenario: str | None, *extra: str, **fill: str
) -> asyncio.subprocess.Process:
    """sipp as the trunk's callee on ``env.trunk_port``; returns once its port is bound."""
    where = bundled_scenario(tmp, scenario, **fill)
    proc = await spawn_sipp(tmp, *where, *extra, local_port=env.trunk_port, error_file=UAS_ERRORS)
    kind = socket.SOCK_STREAM if "t1" in extra else socket.SOCK_DGRAM
    return await until_bound(proc, env.trunk_port, kind)


async def finish(proc: asyncio.subprocess.Process, tmp: Path) -> tuple[int, str]:
    return await finish_sipp(proc, tmp, error_file=UAS_ERRORS)


async def inbound_leg(env: Env) -> tuple[SipCall, SipLeg]:
    """The SIP side and leg of the inbound call whose session just started."""
    session = await env.app.next_session(timeout=10)
    start = await session.wait_for("session.start", timeout=5)
    assert env.gw.sip is not None
    sc = next(c for c in env.gw.sip.inbound.calls.values() if c.call.call_ref == start["callRef"])
    assert sc.leg is not None and sc.leg.signalling is not None
    return sc, sc.leg


def trunk(env: Env) -> Any:
    assert env.gw.config.sip is not None
    return env.gw.config.sip.trunks[0]


async def test_dial_party_answered_through_the_calls_trunk(tmp_path: Path) -> None:
    async with transfer_gateway(47000) as env:
        party = await start_uas(env, tmp_path, "uas_party.xml", caller_id=re.escape(CALLER_ID))
        caller = asyncio.create_task(
            run_sipp(
                env.sip_env,
                "uac_gateway_bye.xml",
                ROUTED,
                tmp_path,
                pcap=str(PCAPS / "g711a.pcap"),
            )
        )
        _, leg = await inbound_leg(env)
        assert leg.native_cold_transfer is False
        new = await leg.dial_party(
            PARTY, caller_id=CALLER_ID, headers={"X-Case": "42", "Via": "x"}, timeout_s=10
        )
        assert isinstance(new, SipLeg) and new.carrier == "sip"
        assert new.receiver.send_address is not None and new.receiver.send_address[1] > 0
        assert not new.closed
        await new.hangup()
        code, log = await finish(party, tmp_path)
        assert code == 0, log
        await leg.hangup()
        code, log = await caller
        assert code == 0, log


async def test_dial_party_busy_is_transfer_failed(tmp_path: Path) -> None:
    async with transfer_gateway(47100) as env:
        party = await start_uas(env, tmp_path, "uas_486.xml")
        assert env.gw.sip is not None
        with pytest.raises(TransferError) as info:
            await dial_party(
                env.gw.sip.outbound,
                trunk(env),
                PARTY,
                caller_id=CALLER_ID,
                headers=None,
                timeout_s=10,
                label="party",
            )
        assert info.value.code == "transfer_failed" and "486" in str(info.value)
        code, log = await finish(party, tmp_path)
        assert code == 0, log


async def test_dial_party_no_answer_cancels(tmp_path: Path) -> None:
    async with transfer_gateway(47200) as env:
        party = await start_uas(env, tmp_path, "uas_ring_cancel.xml")
        assert env.gw.sip is not None
        with pytest.raises(TransferError, match="did not answer"):
            await dial_party(
                env.gw.sip.outbound,
                trunk(env),
                PARTY,
                caller_id=CALLER_ID,
                headers=None,
                timeout_s=1.0,
                label="party",
            )
        code, log = await finish(party, tmp_path)
        assert code == 0, log  # sipp got our CANCEL, answered 487 and got its ACK


async def test_refer_success_notifies_then_bye(tmp_path: Path) -> None:
    async with transfer_gateway(47300) as env:
        target = "+15550009999"
        caller = asyncio.create_task(
            run_sipp(
                env.sip_env,
                "uac_refer.xml",
                ROUTED,
                tmp_path,
                target=re.escape(f"{target}@127.0.0.1"),
            )
        )
        sc, leg = await inbound_leg(env)
        await asyncio.wait_for(leg.refer(target, None), 15)
        assert sc.finished  # our BYE went out
        code, log = await caller
        assert code == 0, log


async def test_refer_failure_keeps_the_call_up(tmp_path: Path) -> None:
    async with transfer_gateway(47400) as env:
        caller = asyncio.create_task(
            run_sipp(
                env.sip_env,
                "uac_refer_fail.xml",
                ROUTED,
                tmp_path,
                target=re.escape("bob@127.0.0.1"),
            )
        )
        sc, leg = await inbound_leg(env)
        with pytest.raises(TransferError) as info:
            await asyncio.wait_for(leg.refer("sip:bob@127.0.0.1", None), 15)
        assert info.value.code == "transfer_failed" and "503" in str(info.value)
        await asyncio.sleep(0.3)
        assert not sc.finished and not leg.closed and sc.call.state not in ("ending", "ended")
        await leg.hangup()
        code, log = await caller
        assert code == 0, log


async def test_outbound_call_over_a_tcp_trunk(tmp_path: Path) -> None:
    async with transfer_gateway(47500, transport="tcp") as env:
        callee = await start_uas(env, tmp_path, None, "-t", "t1")
        body = {"app": "main", "to": PARTY, "from": CALLER_ID, "carrier": "sip:main"}
        resp = await env.http.post("/v1/calls", json=body)
        assert resp.status_code == 201, resp.text
        ref = resp.json()["callRef"]
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "outbound" and start["callRef"] == ref
        resp = await env.http.delete(f"/v1/calls/{ref}")
        assert resp.status_code in (200, 202, 204), resp.text
        code, log = await finish(callee, tmp_path)
        assert code == 0, log  # sipp got our BYE on the same TCP connection


async def test_dial_party_over_a_tcp_trunk(tmp_path: Path) -> None:
    async with transfer_gateway(47600, transport="tcp") as env:
        party = await start_uas(
            env, tmp_path, "uas_party.xml", "-t", "t1", caller_id=re.escape(CALLER_ID)
        )
        assert env.gw.sip is not None
        leg = await dial_party(
            env.gw.sip.outbound,
            trunk(env),
            PARTY,
            caller_id=CALLER_ID,
            headers={"X-Case": "42"},
            timeout_s=10,
            label="party",
        )
        await leg.hangup()
        code, log = await finish(party, tmp_path)
        assert code == 0, log


async def test_tcp_trunk_that_refuses_the_connection(tmp_path: Path) -> None:
    async with transfer_gateway(47700, transport="tcp") as env:
        body = {"app": "main", "to": PARTY, "from": CALLER_ID, "carrier": "sip:main"}
        resp = await env.http.post("/v1/calls", json=body)
        assert resp.status_code == 502, resp.text
        assert resp.json()["error"] == "trunk_unreachable" and "TCP" in resp.json()["message"]
        assert not list(env.gw.registry)  # no call was registered
