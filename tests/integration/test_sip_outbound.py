"""Outbound SIP calls (``POST /v1/calls``; docs/sip.md) against real sipp as the callee (UAS).

The gateway runs in-process with ``[sip]`` on 127.0.0.1 and one trunk pointing at sipp; a
:class:`FakeApp` is the app. Scenarios: sipp's built-in ``uas`` (answer), ``uas_486.xml``
(busy), ``uas_ring_cancel.xml`` (rings until our CANCEL) and ``uas_auth.xml`` (a 401 digest
challenge that sipp verifies on the retried INVITE). Under ``CI=true`` a missing sipp fails;
elsewhere the sipp tests skip. The request checks need no sipp.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

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

TRUNK_USER = "trunkuser"
TRUNK_PASSWORD = "trunk-secret"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
CALLEE = "+15550002222"
CALLER = "+15550001111"

needs_sipp = sipp_required()
pytestmark = [pytest.mark.timeout(60)]


@dataclass
class OutEnv:
    gw: Gateway
    app: FakeApp
    http: httpx.AsyncClient
    trunk_port: int


@asynccontextmanager
async def outbound_gateway(
    rtp_low: int, *, trunk: dict[str, Any] | None = None
) -> AsyncIterator[OutEnv]:
    app = FakeApp(secret=SECRET)
    await app.start()
    trunk_port = free_port()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    trunk_cfg = {"name": "main", "host": "127.0.0.1", "port": trunk_port, **(trunk or {})}
    config = make_config(
        port,
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        sip={
            "listen": ["udp:127.0.0.1:5060"],
            "rtp_ports": [rtp_low, rtp_low + 99],
            "trunks": [trunk_cfg],
        },
    )
    assert config.sip is not None
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("udp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            base = gw.config.server.base_url()
            async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=10) as http:
                yield OutEnv(gw, app, http, trunk_port)
    finally:
        await app.stop()


async def start_sipp(
    env: OutEnv, tmp: Path, scenario: str | None, **fill: str
) -> asyncio.subprocess.Process:
    """sipp as the trunk's callee on ``env.trunk_port``; returns once its port is bound."""
    where = bundled_scenario(tmp, scenario, **fill)
    proc = await spawn_sipp(tmp, *where, local_port=env.trunk_port)
    return await until_bound(proc, env.trunk_port)


async def place(env: OutEnv, **extra: Any) -> str:
    body = {"app": "main", "to": CALLEE, "from": CALLER, "carrier": "sip:main", **extra}
    resp = await env.http.post("/v1/calls", json=body)
    assert resp.status_code == 201, resp.text
    data = resp.json()
    assert data["status"] == "dialing"
    ref = data["callRef"]
    assert isinstance(ref, str) and ref.startswith("CA") and len(ref) == 34
    int(ref[2:], 16)
    return ref


async def wait_state(
    env: OutEnv, ref: str, states: set[str], timeout_s: float = 10
) -> dict[str, Any]:
    last: dict[str, Any] = {}
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        resp = await env.http.get(f"/v1/calls/{ref}")
        assert resp.status_code == 200, resp.text
        last = resp.json()
        if last["state"] in states:
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"call {ref} never reached {states}: {last}")


@needs_sipp
async def test_answered_call_opens_outbound_session_with_metadata(tmp_path: Path) -> None:
    async with outbound_gateway(43000) as env:
        sipp = await start_sipp(env, tmp_path, None)
        ref = await place(env, metadata={"campaign": "spring", "n": 3})
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "outbound"
        assert start["callRef"] == ref
        assert start["from"] == CALLER and start["to"] == CALLEE
        assert start["metadata"] == {"campaign": "spring", "n": 3}
        live = await wait_state(env, ref, {"active"})
        assert live["direction"] == "outbound" and live["sessionRef"] == start["sessionRef"]
        listed = (await env.http.get("/v1/calls")).json()["calls"]
        assert [c["callRef"] for c in listed] == [ref]
        # Hanging up from the API sends our BYE; sipp's uas answers it and exits cleanly.
        assert (await env.http.delete(f"/v1/calls/{ref}")).status_code == 200
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log
        ended = await wait_state(env, ref, {"ended"})
        assert ended["endReason"] == "app_hangup"
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "app_hangup"


@needs_sipp
async def test_busy_callee_ends_as_busy_without_a_session(tmp_path: Path) -> None:
    async with outbound_gateway(43100) as env:
        sipp = await start_sipp(env, tmp_path, "uas_486.xml")
        ref = await place(env)
        final = await wait_state(env, ref, {"busy", "failed", "ended"})
        assert final["state"] == "busy"
        assert final["endReason"] == "busy" and final["sipStatus"] == 486
        assert final["sessionRef"] is None
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log
        assert env.app.sessions == []  # the app is dialed only once the callee answers


@needs_sipp
async def test_no_answer_in_time_sends_cancel(tmp_path: Path) -> None:
    async with outbound_gateway(43200) as env:
        sipp = await start_sipp(env, tmp_path, "uas_ring_cancel.xml")
        ref = await place(env, timeout_s=1.5)
        await wait_state(env, ref, {"ringing"})
        final = await wait_state(env, ref, {"no-answer", "failed", "canceled", "ended"})
        assert final["state"] == "no-answer" and final["endReason"] == "no-answer"
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log  # sipp got the CANCEL, sent 487 and our transaction ACKed it
        assert env.app.sessions == []


@needs_sipp
async def test_delete_while_ringing_cancels(tmp_path: Path) -> None:
    async with outbound_gateway(43300) as env:
        sipp = await start_sipp(env, tmp_path, "uas_ring_cancel.xml")
        ref = await place(env)
        await wait_state(env, ref, {"ringing"})
        assert (await env.http.delete(f"/v1/calls/{ref}")).status_code == 200
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log
        final = await wait_state(env, ref, {"canceled"})
        assert final["endReason"] == "canceled"
        assert (await env.http.get("/v1/calls")).json()["calls"] == []


@needs_sipp
async def test_digest_challenge_is_answered_with_trunk_credentials(tmp_path: Path) -> None:
    trunk = {"username": TRUNK_USER, "password": TRUNK_PASSWORD}
    async with outbound_gateway(43400, trunk=trunk) as env:
        sipp = await start_sipp(
            env, tmp_path, "uas_auth.xml", user=TRUNK_USER, password=TRUNK_PASSWORD
        )
        ref = await place(env)
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "outbound"
        assert (await wait_state(env, ref, {"active"}))["state"] == "active"
        assert (await env.http.delete(f"/v1/calls/{ref}")).status_code == 200
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log


@needs_sipp
async def test_wrong_credentials_end_as_failed(tmp_path: Path) -> None:
    trunk = {"username": TRUNK_USER, "password": "not-the-password"}
    async with outbound_gateway(43500, trunk=trunk) as env:
        sipp = await start_sipp(
            env, tmp_path, "uas_auth.xml", user=TRUNK_USER, password=TRUNK_PASSWORD
        )
        ref = await place(env)
        final = await wait_state(env, ref, {"failed", "busy", "ended", "active"})
        assert final["state"] == "failed" and final["sipStatus"] == 403
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log


# -- request checks (no SIP peer involved) -------------------------------------------------------


async def post(env: OutEnv, body: Any, **kw: Any) -> httpx.Response:
    return await env.http.post("/v1/calls", json=body, **kw)


async def test_request_checks() -> None:
    async with outbound_gateway(43600) as env:
        good = {"app": "main", "to": CALLEE, "from": CALLER, "carrier": "sip:main"}
        cases: list[tuple[Any, int, str, str]] = [
            ({**good, "app": "nope"}, 400, "unknown_app", "nope"),
            ({**good, "carrier": "sip:other"}, 400, "unknown_trunk", "other"),
            ({**good, "carrier": "pigeon"}, 400, "bad_request", "carrier"),
            ({**good, "to": "5550002222"}, 400, "bad_request", "'to'"),
            ({**good, "from": "+1-555"}, 400, "bad_request", "'from'"),
            ({**good, "metadata": [1]}, 400, "bad_request", "metadata"),
            ({**good, "metadata": {"x": "a" * 17000}}, 400, "bad_request", "metadata"),
            ({**good, "timeout_s": 0}, 400, "bad_request", "timeout_s"),
            ({**good, "timeout_s": "30"}, 400, "bad_request", "timeout_s"),
            ({**good, "tooo": "+1555"}, 400, "bad_request", "tooo"),
            ([good], 400, "bad_request", "object"),
            ({**good, "carrier": "twilio"}, 502, "carrier_error", "Twilio"),
        ]
        for body, status, code, words in cases:
            resp = await post(env, body)
            assert resp.status_code == status, (body, resp.text)
            data = resp.json()
            assert data["error"] == code and words in data["message"], (body, data)
        resp = await env.http.post("/v1/calls", content=b"{not json")
        assert resp.status_code == 400 and resp.json()["error"] == "bad_request"
        resp = await post(env, good, headers={"Authorization": "Bearer wrong"})
        assert resp.status_code == 401
        assert (await env.http.get("/v1/calls")).json()["calls"] == []


async def test_unanswered_invite_times_out_as_failed_or_no_answer() -> None:
    """Nothing listens on the trunk's port: no provisional response ever comes, so the
    no-answer timer records the outcome; the CANCEL waits for a 1xx (RFC 3261 §9.1)."""
    async with outbound_gateway(43700) as env:
        ref = await place(env, timeout_s=0.3)
        final = await wait_state(env, ref, {"no-answer", "failed"})
        assert final["state"] == "no-answer" and final["sipStatus"] is None
