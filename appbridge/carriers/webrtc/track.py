"""The gateway's audio track toward the browser: what aiortc's RTP sender pulls.

aiortc's sender loops on ``await track.recv()`` and sends whatever comes back; it is the reader,
and the media clock is the writer (one frame per 20 ms tick, ``leg.py``). The track is a small
queue between them: :meth:`OutboundTrack.push` never waits (the media clock must never block on
a peer), and when the sender falls behind, the oldest frames beyond :data:`MAX_QUEUED` go and
are counted in ``dropped``: late audio is worse than lost audio on a call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final, TypeAlias

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

#: What the sender takes: a frame to encode, or a packet already encoded (``frames.py``).
SenderItem: TypeAlias = "av.AudioFrame | av.Packet[Any]"
#: Frames (20 ms each) waiting for the sender; beyond this the oldest is dropped.
MAX_QUEUED: Final = 5


class OutboundTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[SenderItem] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.dropped = 0

    @property
    def queued(self) -> int:
        """Frames the sender has not taken yet. (Not ``__len__``: aiortc tests the track's
        truth to see whether it has one.)"""
        return len(self._queue)

    def push(self, item: SenderItem) -> None:
        """Queue one frame for the sender; never waits (module doc)."""
        if self.readyState != "live":
            return
        queue = self._queue
        if len(queue) >= MAX_QUEUED:
            queue.popleft()
            self.dropped += 1
        queue.append(item)
        self._wake()

    def clear(self) -> None:
        """Drop what the sender has not taken yet (``clear`` from the app)."""
        self._queue.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def recv(self) -> SenderItem:
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.readyState != "live":
            raise MediaStreamError
        return self._queue.popleft()

    def stop(self) -> None:
        self._queue.clear()
        super().stop()
        self._wake()
