"""A trunk's host name to the IPv4 address the SIP stack sends to (RFC 3263 §4.2, A records).

Outbound calls, transfers and registrations all need it; a slow resolver must not hold any of
them longer than ``timeout_s``. NAPTR and SRV lookups are not done: a trunk names its port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

DEFAULT_TIMEOUT_S = 5.0


async def resolve_ipv4(host: str, port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """An address literal as it is, else the first A record; raises ``OSError`` (also when the
    lookup takes longer than ``timeout_s``)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    lookup = asyncio.get_running_loop().getaddrinfo(
        host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
    )
    try:
        infos = await asyncio.wait_for(lookup, timeout_s)
    except TimeoutError as exc:
        raise OSError(f"resolving {host} took longer than {timeout_s:g} s") from exc
    if not infos:
        raise OSError(f"{host} has no IPv4 address")
    return str(infos[0][4][0])
