"""The embedded demo app (docs/configuration.md, "The embedded default"), written with the voice SDK
(:mod:`appbridge.sdk`).

The gateway dials it over a real loopback WebSocket like any other app, so a newcomer's first call
exercises the whole path. It greets the caller, tells them which key they pressed, and repeats
what it heard at the end of each turn. It uses nothing from the gateway's internals: it is an
ordinary SDK app that the gateway happens to serve at ``WS /demo/session``, and a readable first
example of the SDK.

The embedded default dials it without a signing secret (loopback only), so it verifies nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from appbridge.sdk import AppServer, DtmfEvent, Session, TurnEnded

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

GREETING = (
    "Hello, and welcome to the App Bridge demo. "
    "Press any key on your phone and I will tell you which one it was."
)
_DIGIT_WORDS = {"*": "star", "#": "pound"}


async def demo(session: Session) -> None:
    """Greets, then answers every keypress and every turn until the call ends."""
    session.say(GREETING)
    async for event in session:
        if isinstance(event, DtmfEvent):
            word = _DIGIT_WORDS.get(event.digit, event.digit)
            session.say(f"You pressed {word}.", preempt=True)
        elif isinstance(event, TurnEnded) and event.text:
            session.say(f"You said: {event.text}")


class DemoAppEndpoint:
    """The ASGI WebSocket endpoint the gateway mounts at ``/demo/session``."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.server = AppServer(demo, secrets=None, path=None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.server(scope, receive, send)
