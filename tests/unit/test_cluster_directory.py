"""Membership and the call directory against a real redis-server (docs/scaling.md): the
heartbeat, TTLs, draining, leaving, a Redis restart healing the directory, a Redis that does not
answer, and CallSid claims."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis

from appbridge.calls.registry import CallRegistry
from appbridge.clock import SystemClock
from appbridge.cluster import keys
from appbridge.cluster.membership import NODE_TTL_S, live_nodes
from appbridge.cluster.redis_link import RedisLink, RedisUnavailable
from appbridge.cluster.service import ClusterService
from appbridge.config.model import ClusterConfig, ServerConfig
from appbridge.counters import Metrics
from tests.cluster_support import RedisProcess, redis_server

__all__ = ["redis_server"]


@dataclass
class FakeState:
    value: str


@dataclass
class FakeCall:
    call_ref: str
    state: FakeState = field(default_factory=lambda: FakeState("dialing"))
    session_ref: str | None = None
    carrier: str = "sip"
    direction: str = "inbound"

    def describe(self) -> dict[str, Any]:
        return {
            "callRef": self.call_ref,
            "sessionRef": self.session_ref,
            "app": "a",
            "direction": self.direction,
            "from": "+15550000001",
            "to": "+15550000002",
            "carrier": self.carrier,
            "started": "2026-12-06T00:00:00Z",
            "state": self.state.value,
        }


@dataclass
class FakeConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(max_calls=10))


@dataclass
class FakeGateway:
    registry: CallRegistry = field(default_factory=CallRegistry)
    metrics: Metrics = field(default_factory=Metrics)
    clock: SystemClock = field(default_factory=SystemClock)
    config: FakeConfig = field(default_factory=FakeConfig)
    draining: bool = False


def service(url: str, node_id: str = "node-a") -> tuple[FakeGateway, ClusterService]:
    gw = FakeGateway()
    cfg = ClusterConfig(node_id, url, f"http://{node_id}.internal:8080", "secret")
    return gw, ClusterService(gw, cfg)  # type: ignore[arg-type]


async def until(check: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.fixture
async def client(redis_server: RedisProcess) -> AsyncIterator[aioredis.Redis]:
    redis_server.flush()
    r = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield r
    await r.aclose()


async def test_a_node_announces_itself_with_a_ttl_and_leaves(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    _gw, svc = service(redis_server.url)
    await svc.start()
    try:
        fields = await client.hgetall(keys.node_key("node-a"))
        assert fields == {
            "node_id": "node-a",
            "internal_url": "http://node-a.internal:8080",
            "max_calls": "10",
            "live": "0",
            "draining": "0",
        }
        assert 0 < await client.ttl(keys.node_key("node-a")) <= NODE_TTL_S <= 15
        assert await client.smembers(keys.NODES) == {"node-a"}
    finally:
        await svc.stop()
    assert not await client.exists(keys.node_key("node-a"), keys.calls_key("node-a"))
    assert await client.smembers(keys.NODES) == set()


async def test_calls_are_written_changed_and_removed(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    gw, svc = service(redis_server.url)
    await svc.start()
    try:
        call = FakeCall("c1")
        gw.registry.add(call)  # type: ignore[arg-type]
        key = keys.calls_key("node-a")
        raw = await until(lambda: client.hget(key, "c1"))
        assert keys.decode_record(raw) == {**call.describe(), "node": "node-a"}
        assert 0 < await client.ttl(key) <= NODE_TTL_S
        call.state = FakeState("active")
        call.session_ref = "s1"

        async def active() -> bool:
            record = keys.decode_record(await client.hget(key, "c1") or "null")
            return record is not None and record["state"] == "active"

        await until(active)
        gw.registry.remove(call)  # type: ignore[arg-type]
        await until(lambda: _not(client.hexists(key, "c1")))
    finally:
        await svc.stop()


async def _not(awaitable: Any) -> bool:
    return not await awaitable


async def test_draining_is_announced_and_placement_avoids_it(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    gw_a, a = service(redis_server.url, "node-a")
    gw_b, b = service(redis_server.url, "node-b")
    await a.start()
    await b.start()
    try:
        gw_b.registry.add(FakeCall("b1"))  # type: ignore[arg-type]
        await until(lambda: client.hexists(keys.calls_key("node-b"), "b1"))
        assert await a.placement() is None  # a has the most free capacity
        gw_a.draining = True

        async def drained() -> bool:
            return await client.hget(keys.node_key("node-a"), "draining") == "1"

        await until(drained, timeout_s=2.0)
        chosen = await a.placement()
        assert chosen is not None and chosen.node_id == "node-b"
    finally:
        await a.stop()
        await b.stop()


async def test_a_dead_nodes_entries_expire_and_its_calls_are_not_found(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    _gw_a, a = service(redis_server.url, "node-a")
    gw_b, b = service(redis_server.url, "node-b")
    await a.start()
    await b.start()
    try:
        gw_b.registry.add(FakeCall("b1"))  # type: ignore[arg-type]
        await until(lambda: client.hexists(keys.calls_key("node-b"), "b1"))
        owner = await a.locate("b1")
        assert owner is not None and owner.node_id == "node-b"
        assert [r["callRef"] for r in await a.remote_calls()] == ["b1"]
        # node-b dies without leaving: its loop stops, nothing is deleted.
        assert b._loop_task is not None
        b._loop_task.cancel()
        await b.writer.stop()
        assert 0 < await client.ttl(keys.node_key("node-b")) <= NODE_TTL_S
        assert 0 < await client.ttl(keys.calls_key("node-b")) <= NODE_TTL_S
        # Expiry is Redis' own clock: make it happen now instead of waiting NODE_TTL_S.
        await client.pexpire(keys.node_key("node-b"), 1)
        await client.pexpire(keys.calls_key("node-b"), 1)
        await asyncio.sleep(0.05)
        assert await a.locate("b1") is None
        assert await a.remote_calls() == []
        assert [n.node_id for n, _ in await live_nodes(a.link)] == ["node-a"]
        assert await client.smembers(keys.NODES) == {"node-a"}  # pruned
    finally:
        await a.stop()
        b._loop_task = None
        await b.stop()


async def test_the_directory_heals_after_a_redis_restart(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    gw, svc = service(redis_server.url)
    await svc.start()
    try:
        for ref in ("c1", "c2", "c3"):
            gw.registry.add(FakeCall(ref))  # type: ignore[arg-type]
        key = keys.calls_key("node-a")
        await until(lambda: _equals(client.hlen(key), 3))
        await asyncio.to_thread(redis_server.restart)
        fresh = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            await until(lambda: _equals(fresh.hlen(key), 3), timeout_s=6.0)
            assert await fresh.exists(keys.node_key("node-a"))
            assert sorted(await fresh.hkeys(key)) == ["c1", "c2", "c3"]
        finally:
            await fresh.aclose()
    finally:
        await svc.stop()


async def _equals(awaitable: Any, value: Any) -> bool:
    try:
        return await awaitable == value
    except Exception:
        return False


async def test_an_unreachable_redis_is_counted_and_never_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw, svc = service(f"redis://127.0.0.1:{port}/0")
    await svc.start()  # no Redis: starts anyway
    try:
        gw.registry.add(FakeCall("c1"))  # type: ignore[arg-type]
        assert await svc.claim_call_sid("CA1") is None
        with pytest.raises(RedisUnavailable):
            await svc.locate("x")
        assert await svc.placement() is None
        assert gw.metrics.cluster_redis_errors >= 3
    finally:
        await svc.stop()


async def test_a_silent_redis_is_given_up_on_within_a_second() -> None:
    # A listener that never answers: the connection opens, the reply never comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        link = RedisLink(f"redis://127.0.0.1:{port}/0", Metrics())
        started = time.monotonic()
        with pytest.raises(RedisUnavailable):
            await link.run("ping", lambda r: r.ping())
        assert time.monotonic() - started < 1.5
        await link.aclose()


async def test_a_callsid_is_claimed_once_across_nodes(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    _, a = service(redis_server.url, "node-a")
    _, b = service(redis_server.url, "node-b")
    await a.start()
    await b.start()
    try:
        assert await a.claim_call_sid("CA1") is True
        assert await b.claim_call_sid("CA1") is False
        assert await client.get(keys.callsid_key("CA1")) == "node-a"
        await a.release_call_sid("CA1")
        assert await b.claim_call_sid("CA1") is True
    finally:
        await a.stop()
        await b.stop()


async def test_the_callsid_claims_of_calls_ending_together_go_in_one_batch(
    redis_server: RedisProcess, client: aioredis.Redis
) -> None:
    gw, svc = service(redis_server.url)
    await svc.start()
    try:
        calls = [FakeCall(f"CA{n}", carrier="twilio") for n in range(20)]
        for call in calls:
            assert await svc.claim_call_sid(call.call_ref) is True
            gw.registry.add(call)  # type: ignore[arg-type]
        await until(lambda: _equals(client.hlen(keys.calls_key("node-a")), 20))
        before = await client.info("clients")
        for call in calls:  # a burst of hang-ups
            gw.registry.remove(call)  # type: ignore[arg-type]
        claims = [keys.callsid_key(call.call_ref) for call in calls]
        await until(lambda: _equals(client.exists(*claims), 0))
        after = await client.info("clients")
        # No connection per ended call: the releases went with the writer's batch.
        assert after["connected_clients"] <= before["connected_clients"] + 1
    finally:
        await svc.stop()
