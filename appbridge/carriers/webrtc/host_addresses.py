"""Which host candidates the gateway offers a browser (``[webrtc] host_addresses``).

aioice, the ICE agent under aiortc, gathers a host candidate (RFC 8445 §5.1.1.1) for every
address of every interface except 127.0.0.1, and has no option to choose them. A gateway on a
machine with many interfaces should offer only the ones browsers can reach, and one that serves
browsers on the same machine needs 127.0.0.1 itself. So this module replaces
``aioice.ice.get_host_addresses``, the one function aioice asks, with one that answers the
configured list, and is the only place that touches aioice's internals (docs/ARCHITECTURE.md,
"The shell"). With no list configured aioice's own answer stands.

The setting is process-wide, as aioice's function is: every peer connection made in this
process after :func:`use_host_addresses` gathers from the list.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

import aioice.ice

_ORIGINAL: Callable[[bool, bool], list[str]] = aioice.ice.get_host_addresses
_configured: tuple[str, ...] = ()


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    """aioice's signature: the configured addresses of the families it asks for."""
    if not _configured:
        return _ORIGINAL(use_ipv4, use_ipv6)
    wanted = []
    for address in _configured:
        version = ipaddress.ip_address(address).version
        if (version == 4 and use_ipv4) or (version == 6 and use_ipv6):
            wanted.append(address)
    return wanted


def use_host_addresses(addresses: Sequence[str]) -> None:
    """Offer exactly ``addresses`` as host candidates from now on; empty: every interface's."""
    global _configured
    for address in addresses:
        ipaddress.ip_address(address)  # a ValueError here, not at the next gathering
    _configured = tuple(addresses)
    aioice.ice.get_host_addresses = _host_addresses


def host_addresses() -> tuple[str, ...]:
    """The configured list (empty: aioice's choice)."""
    return _configured
