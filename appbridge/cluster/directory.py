"""Which node holds which call: the cluster's call directory in Redis (docs/scaling.md, "The
call directory").

Each node owns one hash, ``calls:<node>`` (callRef → JSON record, :mod:`appbridge.cluster.keys`),
that expires with the node's membership. Calls open, change state and end on the media path,
which never waits for Redis: :class:`DirectoryWriter` only queues what changed and one writer
task sends it, in order, one pipeline per batch. A batch that fails is not retried; the next
heartbeat writes the whole directory again instead (:meth:`DirectoryWriter.heal_steps`), which is
also how the directory heals after Redis restarted empty.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from appbridge.cluster import keys
from appbridge.cluster.membership import NODE_TTL_S, NodeInfo, live_nodes
from appbridge.cluster.redis_link import RedisLink

log = logging.getLogger(__name__)


class DirectoryWriter:
    """This node's half of the directory: what it last wrote, and what it must write next."""

    def __init__(self, link: RedisLink, node_id: str) -> None:
        self._link = link
        self.node_id = node_id
        self._key = keys.calls_key(node_id)
        # callRef → the record to write, or None to delete it; the latest change wins.
        self._pending: dict[str, dict[str, Any] | None] = {}
        # Whether the next batch adds a call: the directory's TTL is set with it, in case the
        # hash is new (renewed by the heartbeat after that).
        self._adds = False
        # callRef → (state, sessionRef) as last queued, to notice state changes cheaply.
        self._seen: dict[str, tuple[Any, Any]] = {}
        # Keys to delete with the next batch: claims of Twilio CallSids whose calls ended.
        self._released: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the call path: synchronous, never waits -------------------------------------------
    def put(self, described: dict[str, Any], *, new: bool = False) -> None:
        ref = described["callRef"]
        self._adds |= new
        self._seen[ref] = (described.get("state"), described.get("sessionRef"))
        self._pending[ref] = keys.call_record(described, self.node_id)
        self._wake.set()

    def remove(self, call_ref: str) -> None:
        self._seen.pop(call_ref, None)
        self._pending[call_ref] = None
        self._wake.set()

    def release(self, key: str) -> None:
        """Delete ``key`` with the next batch: calls that end together share one ``DEL``, and
        a burst of hang-ups opens no Redis connection per call."""
        self._released.append(key)
        self._wake.set()

    def changed(self, call_ref: str, state: Any, session_ref: Any) -> bool:
        """Whether a live call's state or session differs from what was last queued."""
        return self._seen.get(call_ref) != (state, session_ref)

    # -- the writer task ---------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-directory")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending and not self._released:
                continue
            batch, self._pending = self._pending, {}
            adds, self._adds = self._adds, False
            released, self._released = self._released, []
            await self._link.try_run(
                "write directory", partial(self._write, batch=batch, adds=adds, released=released)
            )

    async def _write(
        self,
        client: Any,
        *,
        batch: dict[str, dict[str, Any] | None],
        adds: bool,
        released: list[str] | None = None,
    ) -> Any:
        pipe = client.pipeline(transaction=False)
        if released:
            pipe.delete(*released)
        puts = {ref: keys.encode_record(rec) for ref, rec in batch.items() if rec is not None}
        gone = [ref for ref, rec in batch.items() if rec is None]
        if puts:
            pipe.hset(self._key, mapping=puts)
            if adds:
                pipe.expire(self._key, NODE_TTL_S)
        if gone:
            pipe.hdel(self._key, *gone)
        return await pipe.execute()

    def heal_steps(self, pipe: Any, live: list[dict[str, Any]]) -> None:
        """The whole directory written again from the live calls, replacing what Redis held."""
        records = {
            d["callRef"]: keys.encode_record(keys.call_record(d, self.node_id)) for d in live
        }
        pipe.delete(self._key)
        if records:
            pipe.hset(self._key, mapping=records)
            pipe.expire(self._key, NODE_TTL_S)
        for described in live:
            self._seen[described["callRef"]] = (described.get("state"), described.get("sessionRef"))


async def locate(link: RedisLink, call_ref: str) -> NodeInfo | None:
    """The live node whose directory holds ``call_ref`` (two round trips), or None: unknown, or
    held by a node whose membership expired. Raises
    :class:`~appbridge.cluster.redis_link.RedisUnavailable`."""

    def holds(pipe: Any, node_id: str) -> None:
        pipe.hexists(keys.calls_key(node_id), call_ref)

    for node, present in await live_nodes(link, holds):
        if present:
            return node
    return None


async def remote_records(link: RedisLink, self_id: str) -> list[dict[str, Any]]:
    """The directory records of every other live node, by node id then callRef. Raises
    :class:`~appbridge.cluster.redis_link.RedisUnavailable`."""

    def whole(pipe: Any, node_id: str) -> None:
        pipe.hgetall(keys.calls_key(node_id))

    records: list[dict[str, Any]] = []
    for node, directory in await live_nodes(link, whole):
        if node.node_id == self_id:
            continue
        for ref in sorted(directory):
            record = keys.decode_record(directory[ref])
            if record is not None:
                record["node"] = node.node_id
                records.append(record)
    return records
