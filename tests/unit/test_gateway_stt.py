"""Which STT providers a gateway loads at start (Gateway.stt_in_use): the ones its fonoster apps
listen with; Twilio-dialect apps listen with none (docs/protocol-twilio.md: no speech layer)."""

from __future__ import annotations

from typing import Any

from appbridge.clock import VirtualClock
from appbridge.config import parse_config
from appbridge.gateway import Gateway


def gateway(*apps: dict[str, Any]) -> Gateway:
    config = parse_config(
        {
            "server": {"host": "127.0.0.1", "port": 8080},
            "apps": list(apps),
            "numbers": [{"number": "*", "app": apps[0]["ref"]}],
        },
        {},
    )
    return Gateway(config, clock=VirtualClock())


TWILIO_APP = {"ref": "tw", "url": "ws://127.0.0.1:9/tw", "protocol": "twilio"}


def fonoster_app(ref: str, stt: str) -> dict[str, Any]:
    return {
        "ref": ref,
        "url": f"ws://127.0.0.1:9/{ref}",
        "signing_secret": "s",
        "speech": {"voice": "local/en-US", "language": "en-US", "stt": stt},
    }


async def test_twilio_dialect_apps_load_no_recognition_model() -> None:
    gw = gateway(TWILIO_APP)
    assert gw.stt_in_use() == set()
    assert gw.stt_for("local/en-US") is gw.stt_providers["local"]  # what "auto" would pick


async def test_fonoster_apps_load_what_they_listen_with() -> None:
    gw = gateway(TWILIO_APP, fonoster_app("auto", "auto"), fonoster_app("quiet", "none"))
    assert gw.stt_in_use() == {gw.stt_providers["local"]}
    assert gateway(fonoster_app("quiet", "none")).stt_in_use() == set()
