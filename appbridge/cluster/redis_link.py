"""The node's one Redis client: every command bounded, every failure counted and swallowed.

A cluster keeps serving when Redis is gone (docs/scaling.md, "When Redis restarts"): nothing here
waits longer than :data:`REDIS_TIMEOUT_S`, and an error never reaches a call. An outage is logged
once when it begins and once when it ends; ``metrics.cluster_redis_errors`` counts every failed
command batch (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from appbridge.counters import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The longest any Redis round trip may take, connecting included.
REDIS_TIMEOUT_S: Final = 1.0


class RedisUnavailable(Exception):
    """Redis did not answer in time, or answered with an error."""


class RedisLink:
    """Wraps ``redis.asyncio.Redis``; :meth:`run` is the only way commands are sent."""

    def __init__(self, url: str, metrics: Metrics, *, timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self.url = url
        self._metrics = metrics
        self._timeout_s = timeout_s
        # No retries inside the client: one bounded attempt, the caller decides what comes next.
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self.up = True
        #: Set on every failure, cleared by whoever re-writes what Redis may have lost.
        self.lost_state = False

    async def run(self, what: str, command: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run ``command(client)`` within the timeout; raises :class:`RedisUnavailable`."""
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await command(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(what, exc)
            raise RedisUnavailable(f"{what}: {exc or type(exc).__name__}") from exc
        if not self.up:
            self.up = True
            log.warning("cluster: Redis at %s answers again", self._safe_url())
        return result

    async def try_run(
        self, what: str, command: Callable[[aioredis.Redis], Awaitable[T]]
    ) -> T | None:
        """:meth:`run`, with an outage answered None (writes that the heartbeat repairs)."""
        try:
            return await self.run(what, command)
        except RedisUnavailable:
            return None

    def _failed(self, what: str, exc: BaseException) -> None:
        self._metrics.cluster_redis_errors += 1
        self.lost_state = True
        if self.up:
            self.up = False
            log.warning(
                "cluster: Redis at %s unreachable (%s: %s); serving local calls only",
                self._safe_url(),
                what,
                exc or type(exc).__name__,
            )

    def _safe_url(self) -> str:
        """The URL without its password, for the log."""
        head, at, tail = self.url.rpartition("@")
        if not at:
            return self.url
        scheme = head.partition("://")[0]
        return f"{scheme}://***@{tail}"

    async def aclose(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self.client.aclose()
        except (RedisError, OSError, TimeoutError):
            pass


def pipeline_of(*steps: Callable[[Any], Any]) -> Callable[[aioredis.Redis], Awaitable[list[Any]]]:
    """A command for :meth:`RedisLink.run` sending ``steps`` as one pipeline (one round trip)."""

    async def send(client: aioredis.Redis) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for step in steps:
            step(pipe)
        return await pipe.execute()

    return send
