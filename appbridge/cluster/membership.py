"""A node's announcement in Redis, and the live nodes read back (docs/scaling.md, "Membership").

Each node keeps a hash (:func:`~appbridge.cluster.keys.node_key`) with its ``internal_url``,
``max_calls``, live calls and whether it is draining, renewed every :data:`HEARTBEAT_S` with a
TTL of :data:`NODE_TTL_S`: a node that stops heartbeating is gone from the cluster at most that
long after. The set :data:`~appbridge.cluster.keys.NODES` only says which hashes to look at; a
member without a hash is not live, and is pruned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from appbridge.cluster import keys
from appbridge.cluster.redis_link import RedisLink

#: How often a node renews its hash (the outside rule: at most every 5 s).
HEARTBEAT_S: Final = 2.0
#: How long a silent node stays listed (the outside rule: gone at most 15 s after).
NODE_TTL_S: Final = 6
#: How soon a heartbeat that failed is tried again.
RETRY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One live node as its hash says, with its live calls counted from its directory."""

    node_id: str
    internal_url: str
    max_calls: int
    live: int
    draining: bool

    @property
    def free(self) -> int:
        return self.max_calls - self.live


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a heartbeat writes."""

    node_id: str
    internal_url: str
    max_calls: int
    live: int
    draining: bool

    def fields(self) -> dict[str, str]:
        return {
            "node_id": self.node_id,
            "internal_url": self.internal_url,
            "max_calls": str(self.max_calls),
            "live": str(self.live),
            "draining": "1" if self.draining else "0",
        }


class HeartbeatSchedule:
    """When the next heartbeat is due, in the caller's clock: every :data:`HEARTBEAT_S`, at once
    when the draining flag changed (so no new call is placed on a draining node a moment longer
    than needed), and :data:`RETRY_S` after a failure. No I/O, no clock of its own."""

    def __init__(self, interval_s: float = HEARTBEAT_S, retry_s: float = RETRY_S) -> None:
        self.interval_s = interval_s
        self.retry_s = retry_s
        self._next_at: float | None = None
        self._not_before = float("-inf")
        self._announced_draining: bool | None = None

    def due(self, now: float, draining: bool) -> bool:
        if now < self._not_before:
            return False
        if self._next_at is None or now >= self._next_at:
            return True
        return draining != self._announced_draining

    def sent(self, now: float, draining: bool) -> None:
        self._next_at = now + self.interval_s
        self._not_before = float("-inf")
        self._announced_draining = draining

    def failed(self, now: float) -> None:
        self._next_at = now + self.retry_s
        self._not_before = now + self.retry_s


def heartbeat_steps(pipe: Any, ann: Announcement) -> None:
    """The heartbeat's commands, in one pipeline. The first answers whether Redis still had the
    node's hash: 0 means it was lost (a Redis restart, a long outage) and the directory must be
    written again whole."""
    node = keys.node_key(ann.node_id)
    pipe.expire(node, NODE_TTL_S)
    pipe.hset(node, mapping=ann.fields())
    pipe.expire(node, NODE_TTL_S)
    pipe.sadd(keys.NODES, ann.node_id)
    pipe.expire(keys.calls_key(ann.node_id), NODE_TTL_S)


def leave_steps(pipe: Any, node_id: str) -> None:
    """Leaving the cluster: the node's hash, its directory and its membership go at once."""
    pipe.delete(keys.node_key(node_id), keys.calls_key(node_id))
    pipe.srem(keys.NODES, node_id)


def parse_node(fields: dict[str, str], live: int | None) -> NodeInfo | None:
    """A node hash as read back (``live`` counted elsewhere, or None to take the hash's own);
    None for one that expired or is not well formed."""
    node_id, url = fields.get("node_id"), fields.get("internal_url")
    if not node_id or not url:
        return None
    try:
        max_calls = int(fields.get("max_calls", "0"))
        if live is None:
            live = int(fields.get("live", "0"))
    except ValueError:
        return None
    return NodeInfo(node_id, url, max_calls, live, fields.get("draining") == "1")


def count_calls(pipe: Any, node_id: str) -> None:
    """:func:`live_nodes`' default question of each node: how many calls its directory holds."""
    pipe.hlen(keys.calls_key(node_id))


async def live_nodes(
    link: RedisLink, ask: Callable[[Any, str], None] = count_calls
) -> list[tuple[NodeInfo, Any]]:
    """The live nodes, each with the answer to ``ask`` (one command about that node): two round
    trips within one Redis timeout. A node's ``live`` is its directory's length when ``ask`` is
    :func:`count_calls`, else what its last heartbeat said. Members whose hash expired are
    pruned from the set on the way. Raises
    :class:`~appbridge.cluster.redis_link.RedisUnavailable`."""

    async def read(client: Any) -> list[tuple[NodeInfo, Any]]:
        members = sorted(str(m) for m in await client.smembers(keys.NODES))
        if not members:
            return []
        pipe = client.pipeline(transaction=False)
        for node_id in members:
            pipe.hgetall(keys.node_key(node_id))
            ask(pipe, node_id)
        answers = await pipe.execute()
        found: list[tuple[NodeInfo, Any]] = []
        dead: list[str] = []
        for index, node_id in enumerate(members):
            fields, answer = answers[2 * index], answers[2 * index + 1]
            node = parse_node(fields, answer if ask is count_calls else None)
            if node is None or node.node_id != node_id:
                dead.append(node_id)
            else:
                found.append((node, answer))
        if dead:
            await client.srem(keys.NODES, *dead)
        return found

    return await link.run("read nodes", read)


async def node_info(link: RedisLink, node_id: str) -> NodeInfo | None:
    """The live node ``node_id`` as its hash says (one round trip), or None when it is not
    live. Raises :class:`~appbridge.cluster.redis_link.RedisUnavailable`."""

    async def read(client: Any) -> dict[str, str]:
        # The link decodes answers (redis_link.py), so the fields are text.
        return dict(await client.hgetall(keys.node_key(node_id)))

    node = parse_node(await link.run("read node", read), None)
    return node if node is not None and node.node_id == node_id else None


def choose_node(
    nodes: list[NodeInfo], self_id: str, self_free: int, *, self_draining: bool = False
) -> str:
    """Where ``POST /v1/calls`` places a call (docs/scaling.md, "Placing a call"): the
    non-draining node with the most free capacity; a tie goes to this node, then to the lowest
    node id. ``self_free`` is this node's own, exact count (the others' are as of their last
    write). A draining node is chosen only when no other node can take the call, and then
    refuses it itself."""
    best_id, best_free = self_id, (self_free if not self_draining else -(1 << 62))
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.node_id == self_id or node.draining:
            continue
        if node.free > best_free:
            best_id, best_free = node.node_id, node.free
    return best_id
