"""Trunk host names to addresses (appbridge/carriers/sip/resolve.py)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from appbridge.carriers.sip.resolve import resolve_ipv4


async def test_a_literal_is_kept_and_a_name_resolves() -> None:
    assert await resolve_ipv4("192.0.2.7", 5060) == "192.0.2.7"
    assert await resolve_ipv4("localhost", 5060) == "127.0.0.1"


async def test_a_name_without_an_address_raises() -> None:
    with pytest.raises(OSError):
        await resolve_ipv4("no-such-host.invalid", 5060)


async def test_a_slow_resolver_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def never(*args: Any, **kwargs: Any) -> list[Any]:
        await asyncio.sleep(3600)
        return [(socket.AF_INET, socket.SOCK_DGRAM, 0, "", ("192.0.2.1", 5060))]

    monkeypatch.setattr(loop, "getaddrinfo", never)
    with pytest.raises(OSError, match=r"longer than 0\.05 s"):
        await resolve_ipv4("slow.example", 5060, timeout_s=0.05)
