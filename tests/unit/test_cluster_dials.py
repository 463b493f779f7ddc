"""Calls placed through Twilio in a cluster (docs/scaling.md, "Calls placed through Twilio"), in
process: the placing node names itself in the callback and the stream, a callback for another
node's dial is checked here before anything is forwarded, and the owner's internal half accepts
only the cluster's signature. No redis-server: nothing listens on its port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from appbridge.caller.twilio_stream import twilio_signature
from appbridge.carriers.twilio_outbound import (
    DIAL_TOKEN_PARAM,
    NODE_PARAM,
    dial_owner,
    outbound_for,
)
from appbridge.cluster.auth import AUTH_HEADER, sign
from appbridge.cluster.service import ClusterService
from appbridge.config import parse_config
from appbridge.gateway import Gateway
from appbridge.http.app import build_app
from appbridge.protocol.twilio_streams import TwilioStartInfo

SID = "AC" + "5" * 32
TOKEN = "twilio-token"
SECRET = "cluster-secret"
PUBLIC = "https://lb.example.com"
FORM = {"content-type": "application/x-www-form-urlencoded"}
DIAL = "0123456789abcdef01234567"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def clustered() -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    config = parse_config(
        {
            "server": {"public_url": PUBLIC},
            "carriers": {"twilio": {"account_sid": SID, "auth_token": TOKEN}},
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


def start(params: dict[str, str]) -> TwilioStartInfo:
    return TwilioStartInfo(
        account_sid=SID, stream_sid="MZ1", call_sid="CA" + "1" * 32, custom_parameters=params
    )


async def test_the_placing_node_names_itself_in_the_callback_and_the_stream(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, _ = clustered
    outbound = outbound_for(gw)
    dial = outbound._new_dial("+15550000002", 30)
    form = outbound._form(dial, "+15550000002", "+15550000001")
    callback = urlsplit(str(form["StatusCallback"]))
    assert dict(parse_qsl(callback.query)) == {"dial": dial.dial_id, "node": "node-a"}
    assert f'name="{NODE_PARAM}" value="node-a"' in str(form["Twiml"])
    # Its own stream is claimed here, not relayed.
    assert dial_owner(gw, start({DIAL_TOKEN_PARAM: dial.token, NODE_PARAM: "node-a"})) is None


async def test_a_stream_is_relayed_only_for_a_dial_of_another_node(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, _ = clustered
    assert dial_owner(gw, start({DIAL_TOKEN_PARAM: "t", NODE_PARAM: "node-b"})) == "node-b"
    assert dial_owner(gw, start({NODE_PARAM: "node-b"})) is None  # no dial token: not a dial
    assert dial_owner(gw, start({DIAL_TOKEN_PARAM: "t"})) is None  # no node named: one node


async def test_a_callback_for_another_node_is_checked_here_first(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, client = clustered
    path = f"/twilio/status?dial={DIAL}&node=node-b"
    form = {"CallSid": "CA" + "2" * 32, "CallStatus": "ringing"}
    bad = await client.post(path, data=form, headers={"x-twilio-signature": "nope"})
    assert bad.status_code == 403
    assert gw.metrics.bad_signatures == 1
    assert gw.metrics.cluster_forwarded == 0
    # Signed by Twilio, for another node's dial, while Redis cannot say where that node is.
    signature = twilio_signature(TOKEN, PUBLIC + path, form)
    answer = await client.post(path, data=form, headers={"x-twilio-signature": signature})
    assert answer.status_code == 503
    assert answer.json()["error"] == "cluster_unavailable"


async def test_the_owners_half_takes_only_signed_callbacks(
    clustered: tuple[Gateway, httpx.AsyncClient],
) -> None:
    gw, client = clustered
    path = f"/internal/twilio/status/{DIAL}"
    body = b"CallSid=CA1&CallStatus=ringing"
    assert (await client.post(path, content=body, headers=FORM)).status_code == 401
    wrong = sign("wrong-secret", "POST", path, "node-b", gw.clock.wall())
    refused = await client.post(path, content=body, headers={**FORM, AUTH_HEADER: wrong})
    assert refused.status_code == 403
    signed = sign(SECRET, "POST", path, "node-b", gw.clock.wall())
    taken = await client.post(path, content=body, headers={**FORM, AUTH_HEADER: signed})
    assert taken.status_code == 204  # no such dial here: ignored, as on one node
