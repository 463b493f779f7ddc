"""The lean Twilio callers are known to the fake REST API, as Twilio knows its calls (bench).

The gateway hangs a Twilio call up through REST (``Status=completed``); Twilio answers with the
Call resource and then ends the Media Stream with ``stop`` and a close. The bench's lean callers
take part in that exchange like the project's ``FakeTwilioCall``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from websockets.asyncio.server import ServerConnection, serve

from appbridge.testing.fake_twilio import FakeTwilioRest
from bench.lean_twilio import LeanTwilio


async def test_a_rest_hang_up_of_a_lean_call_ends_its_stream_as_twilio_does() -> None:
    got: list[dict[str, Any]] = []
    closed = asyncio.Event()

    async def stream(ws: ServerConnection) -> None:
        async for raw in ws:
            got.append(json.loads(raw))
        closed.set()

    rest = FakeTwilioRest(account_sid="AC1", auth_token="tok")
    await rest.start()
    try:
        async with serve(stream, "127.0.0.1", 0, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            twiml = (
                f'<Response><Connect><Stream url="ws://127.0.0.1:{port}/twilio/stream"/>'
                "</Connect></Response>"
            )

            def webhook(request: httpx.Request) -> httpx.Response:
                return httpx.Response(200, text=twiml, headers={"content-type": "text/xml"})

            async with httpx.AsyncClient(transport=httpx.MockTransport(webhook)) as hooks:
                twilio = LeanTwilio(
                    f"http://127.0.0.1:{port}",
                    account_sid="AC1",
                    auth_token="tok",
                    client=hooks,
                    rest=rest,
                )
                twilio.ticker.autostart = False
                call = await twilio.place_call("+1555", "+1666")
                assert call.has_stream, call.stream_error
                url = f"{rest.base_url}/2010-04-01/Accounts/AC1/Calls/{call.call_sid}.json"
                async with httpx.AsyncClient(auth=("AC1", "tok")) as api:
                    answer = await api.post(url, data={"Status": "completed"})
                    assert answer.status_code == 200
                    resource = answer.json()
                    assert (resource["sid"], resource["status"]) == (call.call_sid, "completed")
                    assert (resource["from"], resource["to"]) == ("+1555", "+1666")
                    await asyncio.wait_for(closed.wait(), 5.0)
                    assert call.closed and call.ended_by == "rest"
                    assert [m["event"] for m in got][-1] == "stop"
                    # A finished call is still a resource: a late hang-up gets it as it is.
                    again = await api.post(url, data={"Status": "completed"})
                    assert again.status_code == 200 and again.json()["status"] == "completed"
    finally:
        await rest.stop()
