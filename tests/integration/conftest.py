"""Fixtures for integration tests: a real gateway on loopback, real fake peers around it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from appbridge.config import Config, parse_config
from appbridge.gateway import Gateway
from appbridge.testing import FakeApp, FakeTwilio, FakeTwilioRest
from appbridge.testing.harness import bind_loopback, running_gateway

ACCOUNT_SID = "AC" + "1" * 32
AUTH_TOKEN = "twilio-test-token"
SECRET = "app-signing-secret"
API_TOKEN = "api-token-1"


@dataclass
class Env:
    gw: Gateway
    app: FakeApp
    twilio: FakeTwilio
    rest: FakeTwilioRest
    base_url: str


def make_config(port: int, rest_base: str, apps: list[dict[str, Any]], **extra: Any) -> Config:
    server_extra = extra.pop("server_extra", {})
    data: dict[str, Any] = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "public_url": f"http://127.0.0.1:{port}",
            **server_extra,
        },
        "api": {"tokens": [API_TOKEN]},
        "carriers": {
            "twilio": {"account_sid": ACCOUNT_SID, "auth_token": AUTH_TOKEN, "api_base": rest_base}
        },
        "media": {"allow_private": True},
        "apps": apps,
        "numbers": extra.pop("numbers", [{"number": "*", "app": apps[0]["ref"]}]),
    }
    data.update(extra)
    return parse_config(data, {})


@asynccontextmanager
async def gateway_env(
    app_options: Callable[[FakeApp], list[dict[str, Any]]] | None = None,
    **extra: Any,
) -> AsyncIterator[Env]:
    app = FakeApp(secret=SECRET)
    await app.start()
    rest = FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN)
    await rest.start()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    apps = (
        app_options(app)
        if app_options
        else [{"ref": "main", "url": app.url, "signing_secret": SECRET}]
    )
    config = make_config(port, rest.base_url, apps, **extra)
    twilio: FakeTwilio | None = None
    try:
        async with running_gateway(config, sock) as gw:
            base = gw.config.server.base_url()
            twilio = FakeTwilio(base, account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, rest=rest)
            yield Env(gw=gw, app=app, twilio=twilio, rest=rest, base_url=base)
    finally:
        if twilio is not None:
            await twilio.aclose()
        await rest.stop()
        await app.stop()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with gateway_env() as e:
        yield e
