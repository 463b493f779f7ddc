"""The reader of ``[webrtc]``: what the gateway offers a browser call (docs/webrtc.md).

The section is optional: browser calls work without it, with every interface's address as a
host candidate and no STUN or TURN server (docs/configuration.md, ``[webrtc]``). Every problem
is recorded on the :class:`Reader` with its key path, as the other section readers do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final

from appbridge.config.model import IceServer, WebRtcConfig
from appbridge.config.schema import Reader, item_path

WEBRTC_KEYS: Final = ("host_addresses", "ice_servers", "max_pending_offers")
ICE_SERVER_KEYS: Final = ("urls", "username", "credential")
#: URL schemes of RFC 7064 (STUN) and RFC 7065 (TURN).
ICE_SCHEMES: Final = ("stun:", "stuns:", "turn:", "turns:")


def _check_address(text: str) -> str | None:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return f"expected an IP address, got {text!r}"
    return None


def _check_ice_url(text: str) -> str | None:
    if not text.startswith(ICE_SCHEMES) or len(text) <= len(text.split(":", 1)[0]) + 1:
        return f"expected a stun:, stuns:, turn: or turns: URL, got {text!r}"
    return None


def _ice_server(reader: Reader, table: Mapping[str, Any], path: str) -> IceServer | None:
    reader.check_keys(path, table, ICE_SERVER_KEYS)
    urls = reader.strings(table, "urls", f"{path}.urls", _check_ice_url)
    if not urls:
        if "urls" not in table or urls == []:
            reader.problem(f"{path}.urls", "at least one stun: or turn: URL is required")
        return None
    username = reader.string(table, "username", f"{path}.username")
    credential = reader.string(table, "credential", f"{path}.credential", secret=True)
    if any(url.startswith(("turn:", "turns:")) for url in urls) and (
        username is None or credential is None
    ):
        reader.problem(path, "a TURN server needs username and credential (RFC 8656 §9.2)")
    return IceServer(tuple(urls), username, credential)


def parse_webrtc(reader: Reader, data: Mapping[str, Any]) -> WebRtcConfig:
    table = reader.table(data, "webrtc", "webrtc")
    if table is None:
        return WebRtcConfig()
    reader.check_keys("webrtc", table, WEBRTC_KEYS)
    addresses = reader.strings(table, "host_addresses", "webrtc.host_addresses", _check_address)
    servers: list[IceServer] = []
    for index, entry in enumerate(reader.tables(table, "ice_servers", "webrtc.ice_servers")):
        server = _ice_server(reader, entry, item_path("webrtc.ice_servers", index))
        if server is not None:
            servers.append(server)
    pending = reader.integer(
        table, "max_pending_offers", "webrtc.max_pending_offers", default=8, low=1, high=1000
    )
    return WebRtcConfig(
        host_addresses=tuple(addresses or ()),
        ice_servers=tuple(servers),
        max_pending_offers=pending,
    )
