"""Hold and transfer music, fetched once and shared by every call that plays it.

A contact centre puts many callers on hold to the same track. Fetched per call, each would
download and convert the file and keep its own copy for as long as it waits: a 5-minute track
is 2.4 MB of µ-law 8 kHz (four times that on a G.722 leg), so a few hundred callers on hold
would hold hundreds of megabytes of one song. Here one fetch and one converted copy serve them
all:

* **Key**: the URL, the call's carrier format and the ``[media]`` limits the fetch ran under
  (a reload that forbids private addresses is never answered from a fetch it would refuse).
* **One fetch at a time per key**: callers put on hold together wait for the same download.
  A caller who hangs up meanwhile does not cancel it for the others; a failed fetch is told to
  every waiter and not kept.
* **Fresh for** ``ttl_s`` (5 minutes): an operator who replaces the file on the server is heard
  by calls that go on hold after that, without a restart. Calls already playing keep the copy
  they have.
* **Bounded**: at most ``max_bytes`` of music kept (64 MiB), least recently used dropped first;
  a track bigger than that on its own is served but not kept. The bytes are shared, not copied:
  the output queue keeps a reference (``OutputQueue.append_audio`` stores ``bytes`` as given).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Final

import httpx

from appbridge.clock import Clock
from appbridge.media.codecs import AudioFormat
from appbridge.media.fetch import FetchLimits, convert_for_call, fetch_audio

__all__ = ["MUSIC_CACHE_BYTES", "MUSIC_TTL_S", "MusicStore"]

MUSIC_TTL_S: Final = 300.0
MUSIC_CACHE_BYTES: Final = 64 * 1024 * 1024

_Key = tuple[str, AudioFormat, FetchLimits]  # the limits: a frozen dataclass, hashable


class MusicStore:
    """Converted music by (URL, carrier format, fetch limits); see the module doc."""

    def __init__(
        self, clock: Clock, *, ttl_s: float = MUSIC_TTL_S, max_bytes: int = MUSIC_CACHE_BYTES
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._kept: OrderedDict[_Key, tuple[float, bytes]] = OrderedDict()
        self._kept_bytes = 0
        self._loading: dict[_Key, asyncio.Task[bytes]] = {}
        self.fetches = 0  # downloads started (not in `/metrics`; the tests read it)
        self.hits = 0

    @property
    def kept_bytes(self) -> int:
        return self._kept_bytes

    async def get(
        self, http: httpx.AsyncClient, url: str, limits: FetchLimits, out_format: AudioFormat
    ) -> bytes:
        """The track at ``url`` in ``out_format``; raises :class:`FetchError` as a fetch does."""
        key: _Key = (url, out_format, limits)
        kept = self._kept.get(key)
        if kept is not None:
            if self._clock.now() - kept[0] < self._ttl_s:
                self._kept.move_to_end(key)
                self.hits += 1
                return kept[1]
            self._forget(key)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._load(key, http, url, limits, out_format), name=f"music:{url}"
            )
            # Every waiter may be gone by the time a fetch fails: its error is read here, so
            # it is never reported as unretrieved.
            task.add_done_callback(_consume)
            self._loading[key] = task
        return await asyncio.shield(task)

    async def _load(
        self,
        key: _Key,
        http: httpx.AsyncClient,
        url: str,
        limits: FetchLimits,
        out_format: AudioFormat,
    ) -> bytes:
        try:
            self.fetches += 1
            audio = await fetch_audio(http, url, limits)
            data = await convert_for_call(audio, out_format)
            self._keep(key, data)
            return data
        finally:
            self._loading.pop(key, None)

    def _keep(self, key: _Key, data: bytes) -> None:
        if len(data) > self._max_bytes:
            return
        self._forget(key)
        self._kept[key] = (self._clock.now(), data)
        self._kept_bytes += len(data)
        while self._kept_bytes > self._max_bytes:
            oldest = next(iter(self._kept))
            self._forget(oldest)

    def _forget(self, key: _Key) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._kept_bytes -= len(kept[1])


def _consume(task: asyncio.Task[bytes]) -> None:
    if not task.cancelled():
        task.exception()
