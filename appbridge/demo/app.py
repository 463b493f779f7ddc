"""The embedded demo app (INTERFACES §3): a fonoster.session.v1 app served by the gateway itself.

The gateway dials it over a real loopback WebSocket like any other app, so a newcomer's first call
exercises the whole path. It greets the caller, tells them which key they pressed, and repeats
what it heard once turn events exist (the speech issue). It is deliberately written against the
wire protocol only, with nothing from the gateway's internals.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

log = logging.getLogger(__name__)

GREETING = (
    "Hello, and welcome to the App Bridge demo. "
    "Press any key on your phone and I will tell you which one it was."
)
_DIGIT_WORDS = {"*": "star", "#": "pound"}


class DemoAppEndpoint:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        ws = WebSocket(scope, receive, send)
        await ws.accept()
        try:
            await self._session(ws)
        except WebSocketDisconnect:
            pass

    async def _session(self, ws: WebSocket) -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                continue  # caller audio: the demo does not use it directly
            try:
                event = json.loads(text)
            except ValueError:
                continue
            kind = event.get("type")
            if kind == "session.start":
                await ws.send_text(
                    json.dumps({"type": "speak", "id": "greeting", "text": GREETING})
                )
            elif kind == "dtmf":
                digit = str(event.get("digit", ""))
                word = _DIGIT_WORDS.get(digit, digit)
                await ws.send_text(
                    json.dumps({"type": "speak", "text": f"You pressed {word}.", "preempt": True})
                )
            elif kind == "turn.ended" and event.get("text"):
                await ws.send_text(
                    json.dumps({"type": "speak", "text": f"You said: {event['text']}"})
                )
            elif kind == "session.end":
                return
