"""Slow and idle HTTP clients are bounded and disturb no call (docs/operations.md, "HTTP
connections"): a request head must arrive within the deadline, and only so many connections may
wait for one at once. Real sockets against the real gateway server."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from appbridge.http import head_deadline
from tests.integration.conftest import Env
from tests.integration.test_bad_input import still_works
from tests.integration.test_session_protocol import connect


async def open_slow(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    await writer.drain()
    return reader, writer


def port_of(env: Env) -> int:
    return int(env.base_url.rsplit(":", 1)[1])


async def test_a_head_that_never_ends_gets_408_and_is_closed(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_deadline, "HEAD_TIMEOUT_S", 0.3)
    reader, writer = await open_slow(port_of(env))
    for _ in range(3):  # still trickling: the deadline is for the whole head, not per byte
        await asyncio.sleep(0.05)
        writer.write(b"a")
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    writer.close()
    async with httpx.AsyncClient() as client:
        assert (await client.get(env.base_url + "/healthz")).status_code == 200


async def test_a_kept_alive_connection_gets_the_deadline_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_deadline, "HEAD_TIMEOUT_S", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(env))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert first.startswith(b"HTTP/1.1 200")
    length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    writer.write(b"GET /healthz HTTP/1.1\r\nHo")  # the next head, never finished
    rest = await asyncio.wait_for(reader.read(), timeout=5)
    assert rest.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_many_slow_clients_evict_the_oldest_and_a_live_call_goes_on(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_deadline, "MAX_PENDING_HEADS", 20)
    _, session, _ = await connect(env)
    clients = [await open_slow(port_of(env)) for _ in range(60)]
    try:
        answers = await asyncio.gather(
            *(asyncio.wait_for(r.read(), timeout=0.5) for r, _ in clients[:40]),
        )
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers)
        for reader, _ in clients[40:]:  # the 20 newest still wait
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), timeout=0.05)
        async with httpx.AsyncClient() as client:
            assert (await client.get(env.base_url + "/healthz")).status_code == 200
        await still_works(session)
    finally:
        for _, writer in clients:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
