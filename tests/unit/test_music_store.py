"""The music store (media/music.py): one fetch and one copy per track, against a real HTTP
server on loopback; time is a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from appbridge.clock import VirtualClock
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.media.fetch import DefaultLimits, FetchError
from appbridge.media.music import MusicStore
from appbridge.media.wav import write_wav
from appbridge.testing.audio import tone_pcm16
from appbridge.testing.fake_twilio import LoopbackServer

LIMITS = DefaultLimits(allow_private=True)  # the media server is on loopback


class Media:
    """Serves /tone.wav (1 s at 8 kHz) and /missing.wav (404); counts requests, and can hold
    answers back until told."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.wav = write_wav(tone_pcm16(500, 1000, 8000), 8000)

    async def serve(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.requests.append(name)
        await self.release.wait()
        if name == "tone.wav":
            return Response(self.wav, media_type="audio/wav")
        return Response(b"no", status_code=404)


async def held_back(
    server: Media, store: MusicStore, http: httpx.AsyncClient, url: str, n: int
) -> list[asyncio.Task[bytes]]:
    """``n`` gets of ``url``, started while the server holds its answer back (``release``)."""
    server.release.clear()
    gets = [asyncio.create_task(store.get(http, url, LIMITS, PCMU_8K)) for _ in range(n)]
    await asyncio.sleep(0.2)
    return gets


@pytest.fixture
async def media() -> AsyncIterator[tuple[Media, str]]:
    media = Media()
    server = LoopbackServer(Starlette(routes=[Route("/{name}", media.serve)]))
    await server.start()
    try:
        yield media, server.base_url
    finally:
        await server.stop()


async def test_calls_on_hold_together_share_one_fetch_and_one_copy(
    media: tuple[Media, str],
) -> None:
    server, base = media
    store = MusicStore(VirtualClock())
    async with httpx.AsyncClient() as http:
        waiting = await held_back(server, store, http, f"{base}/tone.wav", 5)
        server.release.set()
        tracks = await asyncio.gather(*waiting)
        assert server.requests == ["tone.wav"] and store.fetches == 1
        assert len(tracks[0]) == 8000  # 1 s of µ-law 8 kHz
        assert all(track is tracks[0] for track in tracks)  # shared, not copied
        again = await store.get(http, f"{base}/tone.wav", LIMITS, PCMU_8K)
        assert again is tracks[0] and store.hits == 1 and store.kept_bytes == 8000


async def test_a_track_is_fetched_again_once_stale_and_per_format_and_limits(
    media: tuple[Media, str],
) -> None:
    server, base = media
    clock = VirtualClock()
    store = MusicStore(clock, ttl_s=300)
    url = f"{base}/tone.wav"
    async with httpx.AsyncClient() as http:
        first = await store.get(http, url, LIMITS, PCMU_8K)
        clock.advance(299)
        assert await store.get(http, url, LIMITS, PCMU_8K) is first
        clock.advance(2)  # the operator may have replaced the file: fetch it again
        assert await store.get(http, url, LIMITS, PCMU_8K) is not first
        wide = await store.get(http, url, LIMITS, AudioFormat("pcm16", 16000))
        assert abs(len(wide) - 32000) <= 16  # 1 s of pcm16 16 kHz (the resampler's edge)
        await store.get(http, url, replace(LIMITS, max_redirects=0), PCMU_8K)
        assert store.fetches == 4 and len(server.requests) == 4


async def test_a_failed_fetch_reaches_every_waiter_and_is_not_kept(
    media: tuple[Media, str],
) -> None:
    server, base = media
    store = MusicStore(VirtualClock())
    async with httpx.AsyncClient() as http:
        waiting = await held_back(server, store, http, f"{base}/missing.wav", 3)
        server.release.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, FetchError) for r in results), results
        with pytest.raises(FetchError):
            await store.get(http, f"{base}/missing.wav", LIMITS, PCMU_8K)
        assert store.fetches == 2 and store.kept_bytes == 0


async def test_a_caller_who_leaves_does_not_cancel_the_fetch_for_the_others(
    media: tuple[Media, str],
) -> None:
    server, base = media
    store = MusicStore(VirtualClock())
    async with httpx.AsyncClient() as http:
        leaving, staying = await held_back(server, store, http, f"{base}/tone.wav", 2)
        leaving.cancel()
        server.release.set()
        assert len(await staying) == 8000
        assert leaving.cancelled() and store.fetches == 1


async def test_the_store_keeps_at_most_its_bound_least_recently_used_first(
    media: tuple[Media, str],
) -> None:
    _, base = media
    store = MusicStore(VirtualClock(), max_bytes=20000)
    async with httpx.AsyncClient() as http:
        await store.get(http, f"{base}/tone.wav", LIMITS, PCMU_8K)  # 8,000 bytes
        await store.get(
            http, f"{base}/tone.wav", replace(LIMITS, max_redirects=1), PCMU_8K
        )  # 8,000
        await store.get(http, f"{base}/tone.wav", LIMITS, PCMU_8K)  # used again: newest
        await store.get(
            http, f"{base}/tone.wav", replace(LIMITS, max_redirects=2), PCMU_8K
        )  # evicts one
        assert store.kept_bytes == 16000 and store.fetches == 3
        await store.get(http, f"{base}/tone.wav", LIMITS, PCMU_8K)
        assert store.fetches == 3  # the least recently used one went, not this one
        wide = await store.get(http, f"{base}/tone.wav", LIMITS, AudioFormat("pcm16", 16000))
        assert len(wide) > 20000 and store.kept_bytes <= 20000  # served, too big to keep
