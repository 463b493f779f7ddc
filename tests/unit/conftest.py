"""Fixtures shared by unit test modules."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from appbridge.config import default_config
from appbridge.gateway import Gateway


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    """An idle gateway on the embedded default configuration, without SIP: for reading what it
    exports (``/metrics``) without any call or socket."""
    gateway = Gateway(default_config(port=8080, sip_port=None))
    try:
        yield gateway
    finally:
        await gateway.http.aclose()
