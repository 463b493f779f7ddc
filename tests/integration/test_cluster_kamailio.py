"""The whole cluster at once (docs/scaling.md): the real Kamailio of deploy/kamailio/kamailio.cfg
in front, three ``appbridge serve`` nodes on 127.0.0.2, .3 and .4 each with ``[sip]`` and
``[cluster]``, and one real redis-server for their call directory.

A call sipp places through Kamailio is listed by every node and ended by any node, the owner's
BYE going back through Kamailio (RFC 3261 §16.12); a draining node keeps its call to its end,
stays listed by the others meanwhile, gets no new call and exits 0 (docs/operations.md,
"Signals"). Each node dials its own loopback :class:`FakeApp`, so a session on that app is the
node's own record of holding the call. It reuses the support of test_kamailio.py and
test_cluster.py; under ``CI=true`` a missing kamailio, sipp or redis-server fails, elsewhere
these tests skip (deploy/install-test-peers.sh installs them).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.testing import FakeApp
from tests.cluster_support import RedisProcess, free_tcp_port, redis_server
from tests.integration.sipp_support import sipp_required
from tests.integration.test_cluster import (
    API_TOKEN,
    APP_SECRET,
    BEARER,
    CONFIG,
    PUBLIC_URL,
    SID,
    TWILIO_TOKEN,
    healthy,
    listing,
)
from tests.integration.test_cluster import HTTP_TOKEN as TWILIO_HTTP_TOKEN
from tests.integration.test_cluster import Node as ClusterNode
from tests.integration.test_kamailio import (
    NODE_HOSTS,
    PCAP,
    PROBE_INTERVAL_S,
    Cluster,
    http_status_is,
    kamailio_required,
    shared_sip_port,
    sipp_calls,
    sipp_result,
    start_kamailio,
    state_is,
    until,
)

__all__ = ["redis_server"]

pytestmark = [sipp_required(), kamailio_required(), pytest.mark.timeout(120)]

MAX_CALLS = 10
NODE_IDS = ("node-a", "node-b", "node-c")


@dataclass
class Member:
    """One clustered node and the app it dials."""

    node: ClusterNode
    app: FakeApp

    @property
    def host(self) -> str:
        return self.node.host


@dataclass
class Whole:
    """Kamailio (its log, its control socket, the sipp runs) and the three members."""

    kam: Cluster
    members: list[Member]

    def sessions(self) -> list[int]:
        return [len(m.app.sessions) for m in self.members]

    def logs(self) -> str:
        """The tail of every node's log and of Kamailio's, for a failure's message."""
        tails = [f"--- {m.node.node_id}\n{m.node.log.read_text()[-2000:]}" for m in self.members]
        kamailio = self.kam.kamailio_log.read_text(errors="replace")[-2000:]
        return "\n".join([*tails, f"--- kamailio\n{kamailio}"])

    def holder(self, before: list[int]) -> Member:
        """The one member whose app got a session since ``before``."""
        grown = [m for m, b in zip(self.members, before, strict=True) if len(m.app.sessions) > b]
        assert len(grown) == 1, (before, self.sessions())
        return grown[0]


def _write_config(
    workdir: Path, index: int, port: int, sip_port: int, app: FakeApp, redis_url: str
) -> Path:
    """The node configuration of test_cluster.py: ``[sip]`` and ``[cluster]``, its own app."""
    host = NODE_HOSTS[index]
    config = workdir / f"{NODE_IDS[index]}.toml"
    rtp_lo = 52000 + 400 * index
    config.write_text(
        CONFIG.format(
            host=host,
            port=port,
            public_url=PUBLIC_URL,
            max_calls=MAX_CALLS,
            api_token=API_TOKEN,
            sid=SID,
            http_token=TWILIO_HTTP_TOKEN,
            twilio_token=TWILIO_TOKEN,
            sip_port=sip_port,
            rtp_lo=rtp_lo,
            rtp_hi=rtp_lo + 199,
            dead_port=free_tcp_port(),
            app_port=app.port,
            node_id=NODE_IDS[index],
            redis_url=redis_url,
            rest_port=free_tcp_port(),
        )
    )
    return config


@asynccontextmanager
async def whole_cluster(tmp: Path, redis: RedisProcess) -> AsyncIterator[Whole]:
    """Three clustered SIP nodes, all healthy and probed up by Kamailio; all stopped after."""
    redis.flush()
    port, sip_port = free_tcp_port(), shared_sip_port()
    members: list[Member] = []
    kam: Cluster | None = None
    try:
        for index, node_id in enumerate(NODE_IDS):
            app = FakeApp(secret=APP_SECRET)
            await app.start()
            config = _write_config(tmp, index, port, sip_port, app, redis.url)
            node = ClusterNode(node_id, NODE_HOSTS[index], port, config, tmp / f"{node_id}.log")
            members.append(Member(node, app))
            node.start()
        for member in members:
            await healthy(member.node)
        kam = await start_kamailio(tmp, sip_port, MAX_CALLS)
        for member in members:
            await until(lambda h=member.host: state_is(kam, h, "AP"), 15, f"{member.host} up")
        yield Whole(kam, members)
    finally:
        for caller in kam.callers if kam is not None else []:
            if caller.returncode is None:
                caller.kill()
            await caller.communicate()
        if kam is not None:
            if kam.kamailio.returncode is None:
                kam.kamailio.terminate()
            try:
                await asyncio.wait_for(kam.kamailio.wait(), 10)
            except TimeoutError:
                kam.kamailio.kill()
                await kam.kamailio.wait()
        for member in members:
            await asyncio.to_thread(member.node.stop, signal.SIGKILL)
            await member.app.stop()


def _calls_by_ref(body: dict[str, Any]) -> dict[str, str]:
    return {c["callRef"]: c["node"] for c in body["calls"]}


async def _listed_on(member: Member, call_ref: str, node_id: str) -> bool:
    return _calls_by_ref(await listing(member.node)).get(call_ref) == node_id


async def _absent_on(member: Member, call_ref: str) -> bool:
    return call_ref not in _calls_by_ref(await listing(member.node))


async def test_a_call_through_kamailio_is_listed_and_ended_by_the_other_nodes(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    async with whole_cluster(tmp_path, redis_server) as whole:
        kam = whole.kam
        before = whole.sessions()
        proc = await sipp_calls(kam, "uac_proxy_gateway_bye.xml", 1, 1, tag="gwbye", pcap=PCAP)
        await until(lambda: sum(whole.sessions()) > sum(before), 10, "the call's session")
        x = whole.holder(before)
        start = await x.app.sessions[-1].wait_for("session.start", timeout=5)
        ref = start["callRef"]
        i = whole.members.index(x)
        y, z = whole.members[(i + 1) % 3], whole.members[(i + 2) % 3]

        await until(lambda: _listed_on(y, ref, x.node.node_id), 10, f"{ref} listed on Y")
        body = await listing(y.node)
        assert body["partial"] is False
        assert [c["node"] for c in body["calls"] if c["callRef"] == ref] == [x.node.node_id]

        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            deleted = await client.delete(f"{z.node.base}/v1/calls/{ref}", headers=BEARER)
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["callRef"] == ref
        assert deleted.json()["node"] == x.node.node_id
        rc, log = await sipp_result(kam, proc, "gwbye")  # sipp got X's BYE and answered 200
        assert rc == 0, log
        assert re.search(
            rf"appbridge-bye \S+ from {re.escape(x.host)}:", kam.kamailio_log.read_text()
        )
        await x.app.sessions[-1].wait_for("session.end", timeout=5)
        await until(lambda: _absent_on(y, ref), 10, f"{ref} gone from Y's list")


async def test_a_draining_node_keeps_its_call_listed_gets_no_new_one_and_exits_0(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    async with whole_cluster(tmp_path, redis_server) as whole:
        kam = whole.kam
        before = whole.sessions()
        long_call = await sipp_calls(
            kam, "uac_proxy_call.xml", 1, 1, tag="long", pcap=PCAP, pause_ms="4000"
        )
        try:
            await until(lambda: sum(whole.sessions()) > sum(before), 10, "the long call's session")
        except AssertionError:
            pytest.fail("the long call reached no app:\n" + whole.logs())
        a = whole.holder(before)
        session = a.app.sessions[-1]
        ref = (await session.wait_for("session.start", timeout=5))["callRef"]
        others = [m for m in whole.members if m is not a]
        await until(lambda: len(session.audio) > 5, 10, "caller audio")
        heard = len(session.audio)

        assert a.node.proc is not None
        a.node.proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient(trust_env=False) as client:
            await until(lambda: http_status_is(client, a.node.base + "/readyz", 503), 5, "A's 503")
        others_before = [len(m.app.sessions) for m in others]
        short = await sipp_calls(
            kam, "uac_proxy_call.xml", 4, 10, tag="drain", pcap=PCAP, pause_ms="300"
        )
        for other in others:
            await until(lambda o=other: _listed_on(o, ref, a.node.node_id), 5, "A's call listed")
        rc, log = await sipp_result(kam, short, "drain")
        assert rc == 0, log
        await until(lambda: state_is(kam, a.host, "IP"), 2 * PROBE_INTERVAL_S + 3, "A down")
        assert len(a.app.sessions) == before[whole.members.index(a)] + 1  # no new call on A
        assert sum(len(m.app.sessions) for m in others) == sum(others_before) + 4
        for other in others:  # still listed, from either node, while it goes on
            assert await _listed_on(other, ref, a.node.node_id)

        rc, log = await sipp_result(kam, long_call, "long")  # its own BYE got its 200
        assert rc == 0, log
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        assert len(session.audio) > heard + 50  # RTP kept flowing during the drain
        try:
            rc = await asyncio.to_thread(a.node.proc.wait, 15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{a.node.node_id} did not exit after its drain:\n" + whole.logs())
        assert rc == 0
        for other in others:
            await until(lambda o=other: _absent_on(o, ref), 10, "A's call gone from the lists")
