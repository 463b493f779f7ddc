"""The cluster as the gateway runs it: one Redis link, the heartbeat, the directory writer, and
the answers the routes ask for (docs/scaling.md).

Started by :meth:`appbridge.gateway.Gateway.start` when ``[cluster]`` is set and stopped by
:meth:`~appbridge.gateway.Gateway.stop`, which makes the node leave the cluster. The registry
tells it of every call that opens or ends (:meth:`call_added`, :meth:`call_removed`, both
synchronous); one background loop notices state changes and the draining flag and sends the
heartbeat. Nothing a call does waits for Redis.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx

from appbridge.cluster import auth, keys
from appbridge.cluster.directory import DirectoryWriter, locate, remote_records
from appbridge.cluster.membership import (
    Announcement,
    HeartbeatSchedule,
    NodeInfo,
    choose_node,
    heartbeat_steps,
    leave_steps,
    live_nodes,
    node_info,
)
from appbridge.cluster.redis_link import RedisLink, RedisUnavailable

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.calls.registry import CallRegistry
    from appbridge.clock import Clock
    from appbridge.config.model import ClusterConfig, Config
    from appbridge.counters import Metrics

log = logging.getLogger(__name__)

#: How often the loop looks at the calls' states and the draining flag (no Redis unless changed).
SWEEP_S: Final = 0.25
#: A forwarded request's whole budget, connecting included.
FORWARD_TIMEOUT_S: Final = 5.0
#: How long a CallSid stays claimed when its call's end is never seen (a node that died).
CALLSID_CLAIM_TTL_S: Final = 4 * 3600


class ClusterHost(Protocol):
    """What the cluster needs of the gateway (which it never imports: docs/ARCHITECTURE.md,
    "Layers")."""

    registry: CallRegistry
    metrics: Metrics
    clock: Clock
    config: Config
    draining: bool
    ssl_context: ssl.SSLContext


class ClusterService:
    def __init__(self, gw: ClusterHost, config: ClusterConfig) -> None:
        self.gw = gw
        self.config = config
        self.node_id = config.node_id
        self.link = RedisLink(config.redis_url, gw.metrics)
        self.writer = DirectoryWriter(self.link, self.node_id)
        self.schedule = HeartbeatSchedule()
        self.http = httpx.AsyncClient(
            timeout=FORWARD_TIMEOUT_S, headers={"User-Agent": "AppBridge"}, follow_redirects=False
        )
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.gw.registry.observer = self
        self.writer.start()
        await self._heartbeat()
        self._loop_task = asyncio.get_running_loop().create_task(
            self._run(), name="cluster-heartbeat"
        )

    async def stop(self) -> None:
        """Leave the cluster: this node's hash, directory and membership are removed at once."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None
        await self.writer.stop()
        for task in list(self._tasks):
            task.cancel()

        async def leave(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            leave_steps(pipe, self.node_id)
            return await pipe.execute()

        if await self.link.try_run("leave", leave) is not None:
            log.info("cluster: node %s left the cluster", self.node_id)
        if self.gw.registry.observer is self:
            self.gw.registry.observer = None
        await self.link.aclose()
        await self.http.aclose()

    def spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the registry's observer: synchronous -------------------------------------------------
    def call_added(self, call: Call) -> None:
        self.writer.put(call.describe(), new=True)

    def call_removed(self, call: Call) -> None:
        self.writer.remove(call.call_ref)
        if call.carrier == "twilio" and call.direction == "inbound":
            self.writer.release(keys.callsid_key(call.call_ref))

    # -- the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()
            if self.schedule.due(self.gw.clock.now(), self.gw.draining):
                await self._heartbeat()

    def sweep(self) -> None:
        """Queue the record of every live call whose state or session changed."""
        for call in self.gw.registry:
            if self.writer.changed(call.call_ref, call.state.value, call.session_ref):
                self.writer.put(call.describe())

    def announcement(self) -> Announcement:
        return Announcement(
            self.node_id,
            self.config.internal_url,
            self.gw.config.server.max_calls,
            len(self.gw.registry),
            self.gw.draining,
        )

    async def _heartbeat(self) -> None:
        """One heartbeat; the whole directory is written again when Redis had lost this node
        (restarted, or our hash expired during an outage) or a write failed since the last."""
        draining = self.gw.draining
        heal = self.link.lost_state
        ann = self.announcement()

        async def beat(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            heartbeat_steps(pipe, ann)
            return await pipe.execute()

        answers = await self.link.try_run("heartbeat", beat)
        now = self.gw.clock.now()
        if answers is None:
            self.schedule.failed(now)
            return
        self.schedule.sent(now, draining)
        if heal or not answers[0]:
            await self._heal()

    async def _heal(self) -> None:
        live = [call.describe() for call in self.gw.registry]

        async def rewrite(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            self.writer.heal_steps(pipe, live)
            return await pipe.execute()

        self.link.lost_state = False
        if await self.link.try_run("heal directory", rewrite) is not None:
            log.info("cluster: directory of %s written again (%d calls)", self.node_id, len(live))

    # -- what the routes ask -----------------------------------------------------------------
    async def locate(self, call_ref: str) -> NodeInfo | None:
        """The live node holding ``call_ref``; raises RedisUnavailable."""
        return await locate(self.link, call_ref)

    async def node(self, node_id: str) -> NodeInfo | None:
        """The live node ``node_id``, None when it is not live; raises RedisUnavailable."""
        return await node_info(self.link, node_id)

    async def remote_calls(self) -> list[dict[str, Any]]:
        """The other live nodes' calls as their directories say; raises RedisUnavailable."""
        return await remote_records(self.link, self.node_id)

    async def placement(self) -> NodeInfo | None:
        """The node a new call goes to, None for this one (also when Redis is unreachable)."""
        try:
            nodes = [node for node, _ in await live_nodes(self.link)]
        except RedisUnavailable:
            return None
        server = self.gw.config.server
        chosen = choose_node(
            nodes,
            self.node_id,
            server.max_calls - len(self.gw.registry),
            self_draining=self.gw.draining,
        )
        if chosen == self.node_id:
            return None
        return next(node for node in nodes if node.node_id == chosen)

    async def claim_call_sid(self, call_sid: str) -> bool | None:
        """Claim a Twilio CallSid for this node: True when claimed now, False when another
        webhook (on any node) holds it, None when Redis cannot say."""
        try:
            won = await self.link.run(
                "claim CallSid",
                lambda r: r.set(
                    keys.callsid_key(call_sid), self.node_id, nx=True, ex=CALLSID_CLAIM_TTL_S
                ),
            )
        except RedisUnavailable:
            return None
        return bool(won)

    async def release_call_sid(self, call_sid: str) -> None:
        await self.link.try_run("release CallSid", lambda r: r.delete(keys.callsid_key(call_sid)))

    def signed_headers(self, method: str, path: str) -> dict[str, str]:
        value = auth.sign(self.config.secret, method, path, self.node_id, self.gw.clock.wall())
        return {auth.AUTH_HEADER: value}

    def verify(self, method: str, path: str, header: str | None) -> auth.AuthResult:
        return auth.verify(self.config.secret, method, path, header, self.gw.clock.wall())
