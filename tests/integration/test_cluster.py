"""Three gateway nodes as real processes on 127.0.0.2/.3/.4, one real redis-server
(docs/scaling.md): any node lists and ends any call, placement by free capacity, a Redis restart
cuts no call and the directory heals, a killed node's calls answer 404 once its membership
expired, a Twilio webhook posted to two nodes makes one call whose stream, landing on the
other node, is relayed to the owner, and a call placed through Twilio (an outbound app call, a
warm transfer's party) works when its status callbacks and its stream land on a node other
than the one that placed it."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.caller.twilio_carrier import TwilioCarrier
from appbridge.caller.twilio_stream import TwilioStreamCall
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio, FakeTwilioRest
from appbridge.testing.fake_twilio_outbound import Callee
from tests.cluster_support import RedisProcess, free_tcp_port, redis_server

__all__ = ["redis_server"]

REPO = Path(__file__).resolve().parents[2]
SID = "AC" + "4" * 32
TWILIO_TOKEN = "twilio-token"
HTTP_TOKEN = "http-token"
API_TOKEN = "api-token"
APP_SECRET = "app-secret"
CLUSTER_SECRET = "cluster-secret"
PUBLIC_URL = "http://lb.test"
NODES = {"node-a": ("127.0.0.2", 3), "node-b": ("127.0.0.3", 3), "node-c": ("127.0.0.4", 6)}
MEMBERSHIP_GONE_S = 15.0  # the outside bound: gone at most 15 s after the last heartbeat

CONFIG = """
[server]
host = "{host}"
port = {port}
public_url = "{public_url}"
max_calls = {max_calls}
drain_timeout_s = 5

[api]
tokens = ["{api_token}"]

[http]
account_sid = "{sid}"
auth_token = "{http_token}"

[carriers.twilio]
account_sid = "{sid}"
auth_token = "{twilio_token}"
api_base = "http://127.0.0.1:{rest_port}"

[sip]
listen = ["udp:{host}:{sip_port}"]
rtp_ports = [{rtp_lo}, {rtp_hi}]

[[sip.trunks]]
name = "t"
host = "127.0.0.1"
port = {dead_port}

[[apps]]
ref = "a"
url = "ws://127.0.0.1:{app_port}/session"
signing_secret = "${{APP_SECRET}}"
workspace_ref = "{sid}"

[[numbers]]
number = "*"
app = "a"

[cluster]
node_id = "{node_id}"
redis_url = "{redis_url}"
internal_url = "http://{host}:{port}"
secret = "${{APPBRIDGE_CLUSTER_SECRET}}"
"""


@dataclass
class Node:
    node_id: str
    host: str
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "APP_SECRET": APP_SECRET,
            "APPBRIDGE_CLUSTER_SECRET": CLUSTER_SECRET,
            "APPBRIDGE_LOG_LEVEL": "INFO",
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "appbridge", "serve", "--config", str(self.config)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@dataclass
class Cluster:
    nodes: dict[str, Node]
    redis: RedisProcess
    app_port: int
    rest_port: int

    def carrier(self, webhook_node: str, stream_node: str | None = None) -> TwilioCarrier:
        """Twilio behind the load balancer: the webhook reaches one node, the stream another."""
        carrier = TwilioCarrier(
            self.nodes[webhook_node].base,
            account_sid=SID,
            auth_token=TWILIO_TOKEN,
            public_url=PUBLIC_URL,
        )
        if stream_node is not None:
            target = self.nodes[stream_node]
            carrier.dial_url_for = lambda url: f"ws://{target.host}:{target.port}/twilio/stream"  # type: ignore[method-assign]
        return carrier


async def healthy(node: Node, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False) as client:
        while time.monotonic() < deadline:
            assert node.proc is not None and node.proc.poll() is None, node.log.read_text()
            try:
                if (await client.get(node.base + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{node.node_id} never became healthy:\n{node.log.read_text()}")


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    port, sip_port, app_port = free_tcp_port(), free_tcp_port(), free_tcp_port()
    rest_port = free_tcp_port()  # the fake Twilio REST API, started by the test that needs it
    nodes: dict[str, Node] = {}
    for index, (node_id, (host, max_calls)) in enumerate(NODES.items()):
        config = workdir / f"{node_id}.toml"
        config.write_text(
            CONFIG.format(
                host=host,
                port=port,
                public_url=PUBLIC_URL,
                max_calls=max_calls,
                api_token=API_TOKEN,
                sid=SID,
                http_token=HTTP_TOKEN,
                twilio_token=TWILIO_TOKEN,
                sip_port=sip_port,
                rtp_lo=30000 + 1000 * index,
                rtp_hi=30999 + 1000 * index,
                dead_port=free_tcp_port(),
                app_port=app_port,
                node_id=node_id,
                redis_url=redis_server.url,
                rest_port=rest_port,
            )
        )
        nodes[node_id] = Node(node_id, host, port, config, workdir / f"{node_id}.log")
    for node in nodes.values():
        node.start()
    try:
        yield Cluster(nodes, redis_server, app_port, rest_port)
    finally:
        for node in nodes.values():
            node.stop()


@pytest.fixture
async def live(cluster: Cluster) -> Cluster:
    for node in cluster.nodes.values():
        if node.proc is not None and node.proc.poll() is None:
            await healthy(node)
    return cluster


@pytest.fixture
async def app(cluster: Cluster) -> Any:
    fake = FakeApp(secret=APP_SECRET, port=cluster.app_port)
    await fake.start()
    yield fake
    await fake.stop()


BEARER = {"authorization": f"Bearer {API_TOKEN}"}
BASIC = {"authorization": "Basic " + base64.b64encode(f"{SID}:{HTTP_TOKEN}".encode()).decode()}


async def poll(check: Callable[[], Awaitable[Any]], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout_s} s (last: {last!r})")


async def listing(node: Node) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        answer = await client.get(node.base + "/v1/calls", headers=BEARER)
    assert answer.status_code == 200
    return dict(answer.json())


async def place(
    cluster: Cluster, app: FakeApp, webhook: str, stream: str | None = None
) -> TwilioStreamCall:
    carrier = cluster.carrier(webhook, stream)
    call = await carrier.place_call("+15550000001", "+15550000002", continuous_media=True)
    assert call.has_stream, call.twiml
    session = await app.next_session(timeout=10)
    await session.wait_for("session.start", timeout=10)
    return call


async def test_every_node_lists_and_ends_every_call(live: Cluster, app: FakeApp) -> None:
    nodes = live.nodes
    on_a = await place(live, app, "node-a")
    on_b = await place(live, app, "node-b")
    refs = {on_a.call_sid: "node-a", on_b.call_sid: "node-b"}

    async def everywhere() -> bool:
        for node in nodes.values():
            found = {c["callRef"]: c["node"] for c in (await listing(node))["calls"]}
            if {ref: found.get(ref) for ref in refs} != refs:
                return False
        return True

    await poll(everywhere)
    body = await listing(nodes["node-c"])
    assert body["partial"] is False
    listed = next(c for c in body["calls"] if c["callRef"] == on_a.call_sid)
    assert set(listed) == {
        "callRef", "sessionRef", "app", "direction", "from", "to", "started", "state", "node"
    }  # fmt: skip

    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        direct = await client.get(
            f"{nodes['node-a'].base}/v1/calls/{on_a.call_sid}", headers=BEARER
        )
        forwarded = await client.get(
            f"{nodes['node-b'].base}/v1/calls/{on_a.call_sid}", headers=BEARER
        )
        assert forwarded.status_code == direct.status_code == 200
        assert forwarded.json() == direct.json()
        assert forwarded.json()["node"] == "node-a"

        # DELETE on node B ends the call living on node A.
        deleted = await client.delete(
            f"{nodes['node-b'].base}/v1/calls/{on_a.call_sid}", headers=BEARER
        )
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["callRef"] == on_a.call_sid
        assert deleted.json()["node"] == "node-a"
        await on_a.wait_closed(timeout=10)

        # The Twilio-compatible hang-up sent to node A (or C) ends the call living on node B.
        path = f"/2010-04-01/Accounts/{SID}/Calls/{on_b.call_sid}.json"
        form = {"content-type": "application/x-www-form-urlencoded"}
        wrong = await client.post(
            nodes["node-c"].base + path, content=b"Status=ringing", headers={**BASIC, **form}
        )
        assert wrong.status_code == 400
        assert wrong.json()["code"] == 20001
        hung = await client.post(
            nodes["node-c"].base + path, content=b"Status=completed", headers={**BASIC, **form}
        )
        assert hung.status_code == 200, hung.text
        assert hung.headers["content-type"] == "application/json"
        assert hung.json()["sid"] == on_b.call_sid
        assert hung.json()["status"] == "completed"
        await on_b.wait_closed(timeout=10)

        unknown = await client.get(f"{nodes['node-c'].base}/v1/calls/CAnope", headers=BEARER)
        assert unknown.status_code == 404
        assert unknown.json() == {"error": "not_found", "message": "no such call"}
        unsigned = await client.get(f"{nodes['node-a'].base}/internal/v1/calls/{on_b.call_sid}")
        assert unsigned.status_code == 401


async def test_post_places_the_call_on_the_node_with_the_most_free_capacity(live: Cluster) -> None:
    nodes = live.nodes
    request = {
        "app": "a",
        "to": "+15550000009",
        "from": "+15550000001",
        "carrier": "sip:t",
        "timeout_s": 5,
    }
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        placed = await client.post(nodes["node-a"].base + "/v1/calls", json=request, headers=BEARER)
        assert placed.status_code == 201, placed.text
        body = placed.json()
        assert body["node"] == "node-c"  # max_calls 6 against 3 and 3
        assert body["status"] == "dialing"
        assert placed.headers["location"] == f"/v1/calls/{body['callRef']}"
        seen = await client.get(
            f"{nodes['node-b'].base}/v1/calls/{body['callRef']}", headers=BEARER
        )
        assert seen.status_code == 200
        assert seen.json()["node"] == "node-c"
        await client.delete(f"{nodes['node-a'].base}/v1/calls/{body['callRef']}", headers=BEARER)


async def test_a_webhook_posted_to_two_nodes_makes_one_call_relayed_to_its_owner(
    live: Cluster, app: FakeApp
) -> None:
    nodes = live.nodes
    carrier_a = live.carrier("node-a", stream_node="node-b")
    call = await carrier_a.place_call("+15550000001", "+15550000002", continuous_media=True)
    assert call.has_stream
    session = await app.next_session(timeout=10)
    start = await session.wait_for("session.start", timeout=10)
    assert start is not None
    # The same webhook again, on node B: the same TwiML, and no second call.
    repeat = live.carrier("node-b")
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        from appbridge.caller.twilio_carrier import voice_webhook_form
        from appbridge.caller.twilio_stream import twilio_signature

        form = voice_webhook_form(call.call_sid, SID, "+15550000001", "+15550000002")
        signature = twilio_signature(TWILIO_TOKEN, PUBLIC_URL + "/twilio/voice", form)
        again = await client.post(
            repeat.gateway_base_url + "/twilio/voice",
            data=form,
            headers={"X-Twilio-Signature": signature},
        )
    assert again.status_code == 200
    assert again.content.decode() == call.twiml
    await call.send_audio_ulaw(b"\x55" * 160 * 25)  # half a second of caller audio, via node B
    await session.wait_until(lambda: len(session.inbound_audio()) >= 160 * 10, timeout=10)
    assert (
        f"twilio stream {call.call_sid}: relayed to node node-a" in nodes["node-b"].log.read_text()
    )
    body = await listing(nodes["node-c"])
    assert [c["node"] for c in body["calls"] if c["callRef"] == call.call_sid] == ["node-a"]
    assert len(app.sessions) == 1  # the copy answered without dialling the app
    await call.hangup()
    await session.wait_closed(timeout=10)


async def call_state(node: Node, call_ref: str) -> str:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        answer = await client.get(f"{node.base}/v1/calls/{call_ref}", headers=BEARER)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


@pytest.fixture
async def twilio_rest(cluster: Cluster) -> Any:
    """The fake Twilio REST API the nodes' ``api_base`` names: calls the nodes place go there."""
    rest = FakeTwilioRest(account_sid=SID, auth_token=TWILIO_TOKEN)
    rest._server._config.port = cluster.rest_port  # the port the nodes' configuration names
    await rest.start()
    yield rest
    await rest.stop()


def twilio_reaches(rest: FakeTwilioRest, node: Node) -> None:
    """Twilio behind the load balancer: every callback and stream of a call a node places
    lands on ``node``."""
    FakeTwilio(
        node.base, account_sid=SID, auth_token=TWILIO_TOKEN, public_url=PUBLIC_URL, rest=rest
    )


async def test_a_call_placed_through_twilio_works_on_whichever_node_twilio_reaches(
    live: Cluster, app: FakeApp, twilio_rest: FakeTwilioRest
) -> None:
    nodes = live.nodes
    landing, owner = nodes["node-a"], nodes["node-c"]
    rest = twilio_rest
    twilio_reaches(rest, landing)
    rest.dialer.callees["+15550000007"] = Callee("busy", after_ms=100)
    rest.dialer.default_callee = Callee("answer", after_ms=100, continuous_media=True)
    request = {"app": "a", "from": "+15550000001", "carrier": "twilio", "timeout_s": 20}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        placed = await client.post(
            landing.base + "/v1/calls", json={**request, "to": "+15550000003"}, headers=BEARER
        )
        assert placed.status_code == 201, placed.text
        assert placed.json()["node"] == "node-c"  # the most free capacity
        ref = placed.json()["callRef"]
        out = await rest.dialer.next_call()
        callee = await out.wait_stream(timeout=10)
        session = await app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=10)
        assert start is not None
        for status in ("initiated", "ringing", "in-progress"):
            assert (await out.wait_for_status(status)).http_status == 204
        await callee.send_audio_ulaw(b"\x55" * 160 * 25)  # half a second, via node A
        await session.wait_until(lambda: len(session.inbound_audio()) >= 160 * 10, timeout=10)
        assert f"twilio stream {ref}: relayed to node node-c" in landing.log.read_text()
        await poll(lambda: _equals(call_state(owner, ref), "active"))
        await callee.hangup()
        await session.wait_closed(timeout=10)
        assert (await out.wait_for_status("completed", timeout=10)).http_status == 204
        await poll(lambda: _equals(call_state(owner, ref), "ended"))

        # A callee that is busy: only the forwarded callback can tell the owner so.
        busy = await client.post(
            landing.base + "/v1/calls", json={**request, "to": "+15550000007"}, headers=BEARER
        )
        assert busy.status_code == 201, busy.text
        assert busy.json()["node"] == "node-c"
        busy_ref = busy.json()["callRef"]
        busy_out = await rest.dialer.next_call()
        assert (await busy_out.wait_for_status("busy")).http_status == 204
        await poll(lambda: _equals(call_state(owner, busy_ref), "busy"))


async def test_a_warm_transfer_party_placed_through_twilio_reaching_another_node(
    live: Cluster, app: FakeApp, twilio_rest: FakeTwilioRest
) -> None:
    nodes = live.nodes
    caller = await place(live, app, "node-a")  # the call lives on node A
    session = app.sessions[-1]
    twilio_reaches(twilio_rest, nodes["node-b"])  # the party's callbacks and stream: node B
    twilio_rest.dialer.default_callee = Callee("answer", after_ms=100)
    await session.send({"type": "transfer", "id": "w1", "to": "+15557654321", "mode": "warm"})
    out = await twilio_rest.dialer.next_call()
    party = await out.wait_stream(timeout=10)
    for status in ("initiated", "ringing", "in-progress"):
        assert (await out.wait_for_status(status)).http_status == 204

    async def completed() -> dict[str, Any] | None:
        await session.send({"type": "transfer.complete", "id": "w1"})
        message = await session.wait_for(
            lambda m: m.get("type") == "session.end" or m.get("relatesTo") == "w1", timeout=5
        )
        return message if message.get("type") == "session.end" else None

    end = await poll(completed)  # bad_message until the relayed stream is the party's
    assert end["reason"] == "transfer"
    assert f"twilio stream {party.call_sid}: relayed to node node-a" in (
        nodes["node-b"].log.read_text()
    )
    assert not caller.closed and not party.closed  # bridged on node A
    await caller.hangup()
    await party.wait_closed(timeout=10)


async def test_a_redis_restart_cuts_no_call_and_the_directory_heals(
    live: Cluster, app: FakeApp
) -> None:
    nodes = live.nodes
    on_a = await place(live, app, "node-a")
    on_b = await place(live, app, "node-b")
    refs = {on_a.call_sid, on_b.call_sid}

    async def listed_by_c() -> bool:
        body = await listing(nodes["node-c"])
        return not body["partial"] and refs <= {c["callRef"] for c in body["calls"]}

    await poll(listed_by_c)
    live.redis.stop()
    body = await listing(nodes["node-a"])
    assert body["partial"] is True
    assert [c["callRef"] for c in body["calls"]] == [on_a.call_sid]
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        elsewhere = await client.get(
            f"{nodes['node-a'].base}/v1/calls/{on_b.call_sid}", headers=BEARER
        )
    assert elsewhere.status_code == 503
    assert elsewhere.json()["error"] == "cluster_unavailable"
    await asyncio.sleep(0)
    await asyncio.to_thread(live.redis.start)  # empty: everything it held is gone
    await poll(listed_by_c, timeout_s=10.0)
    assert not on_a.closed and not on_b.closed
    await on_a.hangup()
    await on_b.hangup()


async def test_a_draining_node_is_marked_in_redis_and_leaves_once_its_calls_ended(
    live: Cluster, app: FakeApp
) -> None:
    import redis.asyncio as aioredis

    from appbridge.cluster import keys

    node_b = live.nodes["node-b"]
    on_b = await place(live, app, "node-b")
    client = aioredis.Redis.from_url(live.redis.url, decode_responses=True)
    try:
        assert await client.hget(keys.node_key("node-b"), "draining") == "0"
        assert node_b.proc is not None
        node_b.proc.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            return await client.hget(keys.node_key("node-b"), "draining") == "1"

        await poll(draining, timeout_s=5.0)
        assert not on_b.closed  # its live call goes on
        await on_b.hangup()
        code = await asyncio.to_thread(node_b.proc.wait, 15)
        assert code == 0
        assert not await client.exists(keys.node_key("node-b"), keys.calls_key("node-b"))
        assert "node-b" not in await client.smembers(keys.NODES)
    finally:
        await client.aclose()
    assert "node-b" not in {c["node"] for c in (await listing(live.nodes["node-a"]))["calls"]}


async def test_a_killed_nodes_calls_answer_404_once_its_membership_expired(
    live: Cluster, app: FakeApp
) -> None:
    nodes = live.nodes
    on_c = await place(live, app, "node-c")

    async def status() -> int:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            answer = await client.get(
                f"{nodes['node-a'].base}/v1/calls/{on_c.call_sid}", headers=BEARER
            )
        return answer.status_code

    await poll(lambda: _equals(status(), 200))
    nodes["node-c"].stop(signal.SIGKILL)
    killed_at = time.monotonic()
    await poll(lambda: _equals(status(), 404), timeout_s=MEMBERSHIP_GONE_S + 2)
    assert time.monotonic() - killed_at <= MEMBERSHIP_GONE_S + 2
    body = await listing(nodes["node-a"])
    assert on_c.call_sid not in {c["callRef"] for c in body["calls"]}
    await on_c.aclose()


async def _equals(awaitable: Awaitable[Any], value: Any) -> bool:
    return bool(await awaitable == value)
