"""The routes with ``[cluster]`` when Redis is unreachable, and the internal routes' signature
check (docs/scaling.md), in process: no redis-server, nothing listening on its port."""

from __future__ import annotations

import base64
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from appbridge.cluster.auth import AUTH_HEADER, sign
from appbridge.cluster.service import ClusterService
from appbridge.config import parse_config
from appbridge.gateway import Gateway
from appbridge.http.app import build_app

API_TOKEN = "api-token"
SID = "AC" + "3" * 32
SECRET = "cluster-secret"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def clustered() -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    config = parse_config(
        {
            "api": {"tokens": [API_TOKEN]},
            "http": {"account_sid": SID, "auth_token": "tok"},
            "apps": [{"ref": "a", "url": "wss://app.example.com/s", "workspace_ref": SID}],
            "numbers": [{"number": "*", "app": "a"}],
            "cluster": {
                "node_id": "node-a",
                "redis_url": f"redis://127.0.0.1:{closed_port()}/0",
                "internal_url": "http://127.0.0.1:1",
                "secret": SECRET,
            },
        },
        {},
    )
    gw = Gateway(config)
    assert config.cluster is not None
    gw.cluster = ClusterService(gw, config.cluster)
    await gw.cluster.start()
    transport = httpx.ASGITransport(app=build_app(gw))
    client = httpx.AsyncClient(transport=transport, base_url="http://gw")
    try:
        yield gw, client
    finally:
        await client.aclose()
        await gw.cluster.stop()
        await gw.http.aclose()


BEARER = {"authorization": f"Bearer {API_TOKEN}"}


async def test_listing_without_redis_is_partial(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, client = clustered
    answer = await client.get("/v1/calls", headers=BEARER)
    assert answer.status_code == 200
    assert answer.json() == {"calls": [], "partial": True}
    assert gw.metrics.cluster_redis_errors >= 1


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_call_not_here_without_redis_is_503(
    clustered: tuple[Gateway, httpx.AsyncClient], method: str
) -> None:
    _, client = clustered
    answer = await client.request(method, "/v1/calls/c-elsewhere", headers=BEARER)
    assert answer.status_code == 503
    assert answer.json()["error"] == "cluster_unavailable"


async def test_the_twilio_hang_up_of_a_call_not_here_without_redis_is_503(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    _, client = clustered
    basic = base64.b64encode(f"{SID}:tok".encode()).decode()
    answer = await client.post(
        f"/2010-04-01/Accounts/{SID}/Calls/CA1.json",
        content=b"Status=completed",
        headers={
            "authorization": f"Basic {basic}",
            "content-type": "application/x-www-form-urlencoded",
        },
    )
    assert answer.status_code == 503
    assert answer.json()["status"] == 503
    # Credentials are still checked first, as on one node.
    answer = await client.post(f"/2010-04-01/Accounts/{SID}/Calls/CA1.json", content=b"")
    assert answer.status_code == 401


async def test_bearer_is_still_checked_first(clustered: tuple[Gateway, httpx.AsyncClient]) -> None:
    _, client = clustered
    assert (await client.get("/v1/calls")).status_code == 401
    assert (await client.get("/v1/calls/x")).status_code == 401


async def test_internal_routes_refuse_unsigned_requests(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, client = clustered
    path = "/internal/v1/calls/c1"
    assert (await client.get(path)).status_code == 401
    bad = sign("wrong-secret", "GET", path, "node-b", gw.clock.wall())
    assert (await client.get(path, headers={AUTH_HEADER: bad})).status_code == 403
    stale = sign(SECRET, "GET", path, "node-b", gw.clock.wall() - 120)
    assert (await client.get(path, headers={AUTH_HEADER: stale})).status_code == 403
    other_path = sign(SECRET, "GET", "/internal/v1/calls/c2", "node-b", gw.clock.wall())
    assert (await client.get(path, headers={AUTH_HEADER: other_path})).status_code == 403
    good = sign(SECRET, "GET", path, "node-b", gw.clock.wall())
    answer = await client.get(path, headers={AUTH_HEADER: good})
    assert answer.status_code == 404
    assert answer.json() == {"error": "not_found", "message": "no such call"}
    post = sign(SECRET, "GET", "/internal/v1/calls", "node-b", gw.clock.wall())
    answer = await client.post("/internal/v1/calls", headers={AUTH_HEADER: post}, content=b"{}")
    assert answer.status_code == 403  # signed for another method


async def test_without_cluster_there_are_no_internal_routes() -> None:
    config = parse_config(
        {
            "apps": [{"ref": "a", "url": "wss://app.example.com/s"}],
            "numbers": [{"number": "*", "app": "a"}],
        },
        {},
    )
    gw = Gateway(config)
    transport = httpx.ASGITransport(app=build_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        assert (await client.get("/internal/v1/calls/c1")).status_code == 404
    await gw.http.aclose()
