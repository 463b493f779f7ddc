"""``[webrtc]`` (appbridge/config/webrtc.py) and the host-candidate wrapper
(appbridge/carriers/webrtc/host_addresses.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aioice.ice
import pytest

from appbridge.carriers.webrtc import host_addresses as hosts
from appbridge.config import ConfigError, parse_config
from appbridge.config.model import IceServer, WebRtcConfig


def _config(webrtc: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x", "signing_secret": "s"}],
        "numbers": [{"number": "*", "app": "a"}],
    }
    if webrtc is not None:
        data["webrtc"] = webrtc
    return data


def test_defaults_without_the_section() -> None:
    assert parse_config(_config(None), {}).webrtc == WebRtcConfig()


def test_a_full_section() -> None:
    cfg = parse_config(
        _config(
            {
                "host_addresses": ["127.0.0.1", "::1"],
                "ice_servers": [
                    {"urls": ["stun:stun.example.net:3478"]},
                    {"urls": ["turn:turn.example.net"], "username": "u", "credential": "${T}"},
                ],
                "max_pending_offers": 3,
            }
        ),
        {"T": "secret"},
    ).webrtc
    assert cfg.host_addresses == ("127.0.0.1", "::1")
    assert cfg.ice_servers == (
        IceServer(("stun:stun.example.net:3478",)),
        IceServer(("turn:turn.example.net",), "u", "secret"),
    )
    assert cfg.max_pending_offers == 3
    assert "secret" not in repr(cfg)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"host_addresses": ["localhost"]}, "webrtc.host_addresses[0]"),
        ({"host_addresses": "127.0.0.1"}, "webrtc.host_addresses"),
        ({"ice_servers": [{"urls": ["http://x"]}]}, "webrtc.ice_servers[0].urls[0]"),
        ({"ice_servers": [{"urls": []}]}, "webrtc.ice_servers[0].urls"),
        ({"ice_servers": [{}]}, "webrtc.ice_servers[0].urls"),
        ({"ice_servers": [{"urls": ["turn:t.example"]}]}, "webrtc.ice_servers[0]"),
        ({"ice_servers": [{"urls": ["stun:s"], "port": 1}]}, "webrtc.ice_servers[0].port"),
        ({"max_pending_offers": 0}, "webrtc.max_pending_offers"),
        ({"hosts": []}, "webrtc.hosts"),
    ],
)
def test_problems_name_their_key(section: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_config(section), {})
    assert any(p.startswith(f"{problem}:") for p in err.value.problems), err.value.problems


@pytest.fixture
def restore_hosts() -> Iterator[None]:
    before = hosts.host_addresses()
    yield
    hosts.use_host_addresses(before)


def test_host_addresses_replace_aiois_choice(restore_hosts: None) -> None:
    hosts.use_host_addresses(["127.0.0.1", "::1"])
    assert aioice.ice.get_host_addresses(True, False) == ["127.0.0.1"]
    assert aioice.ice.get_host_addresses(True, True) == ["127.0.0.1", "::1"]
    assert aioice.ice.get_host_addresses(False, True) == ["::1"]
    hosts.use_host_addresses([])  # aioice's own answer again: never loopback
    assert "127.0.0.1" not in aioice.ice.get_host_addresses(True, False)
    with pytest.raises(ValueError):
        hosts.use_host_addresses(["not an address"])
