"""One 20 ms ticker for many simulated peers, the period cut into phases.

Real callers are independent: their packets reach a gateway spread over the 20 ms frame. A
generator that sends every call's packet in one burst per frame makes the gateway take them in
one queue, and every call after the first in the burst shows the burst's processing time as
inbound latency (and the generator's own loop time, since the burst is sent from one callback).
So the calls join ``slots`` phases round-robin, and with 4 slots a quarter of them send every
5 ms. Deadlines are absolute (``next += period/slots``); a tick more than 100 ms late restarts
from now rather than bursting. Each peer's ``tick(at)`` gets its phase's deadline: the instant
the packet is due, which is what the figures measure from (a late generator then shows as
latency, never hides it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

FRAME_S = 0.020
RESYNC_LATE_S = 0.100


async def run_on_deadlines(
    step_s: float, tick: Callable[[float], None], late: Callable[[], None]
) -> None:
    """``tick(deadline)`` every ``step_s`` on absolute deadlines, forever; a deadline missed by
    more than :data:`RESYNC_LATE_S` is not caught up on (``late()`` is told, and the schedule
    restarts from now)."""
    next_s = time.monotonic()
    while True:
        tick(next_s)
        next_s += step_s
        now = time.monotonic()
        if now - next_s > RESYNC_LATE_S:
            late()
            next_s = now
        await asyncio.sleep(max(0.0, next_s - now))


class DeadlineTask:
    """The one task a ticker runs on :func:`run_on_deadlines`: started by the first peer
    (:meth:`ensure_started`) unless ``autostart`` is False (a test ticks by hand), late ticks
    counted, stopped by :meth:`stop`. Subclasses give :meth:`_run`."""

    def __init__(self, *, autostart: bool = True) -> None:
        self.autostart = autostart
        self.late_ticks = 0
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self._task is None and self.autostart:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        raise NotImplementedError

    def _late(self) -> None:
        self.late_ticks += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class Ticking(Protocol):
    def tick(self, at: float, /) -> None: ...


PeerT = TypeVar("PeerT", bound=Ticking)


class PhasedTicker(DeadlineTask, Generic[PeerT]):
    """Every peer's 20 ms tick from one task; ``autostart`` False leaves the ticking to a test."""

    def __init__(
        self, key: Callable[[PeerT], str], *, slots: int = 4, autostart: bool = True
    ) -> None:
        super().__init__(autostart=autostart)
        self.key = key
        self.slots = max(1, slots)
        self.groups: list[dict[str, PeerT]] = [{} for _ in range(self.slots)]
        self._next_group = 0

    def add(self, peer: PeerT) -> None:
        self.groups[self._next_group][self.key(peer)] = peer
        self._next_group = (self._next_group + 1) % self.slots
        self.ensure_started()

    def discard(self, peer: PeerT) -> None:
        key = self.key(peer)
        for group in self.groups:
            group.pop(key, None)

    def __len__(self) -> int:
        return sum(len(group) for group in self.groups)

    def tick_group(self, index: int, at: float) -> None:
        for peer in list(self.groups[index].values()):
            peer.tick(at)

    async def _run(self) -> None:
        index = 0

        def tick(at: float) -> None:
            nonlocal index
            self.tick_group(index, at)
            index = (index + 1) % self.slots

        await run_on_deadlines(FRAME_S / self.slots, tick, self._late)
