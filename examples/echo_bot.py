"""Echo bot: the caller hears themselves back. The smallest useful AppBridge app.

It shows the three basics of the voice SDK (docs/sdk.md): saying something, reading the caller's
audio as frames from ``async for event in session``, and sending audio back with
``send_audio``. A keypress ends the call.

Run it next to the gateway (see examples/README.md)::

    .venv/bin/python examples/echo_bot.py          # listens on ws://127.0.0.1:9001/session
    make run CONFIG=examples/appbridge.examples.toml
    .venv/bin/appbridge call http://127.0.0.1:8080 --to +15550000001 --play some.wav
"""

from __future__ import annotations

import asyncio
import logging
import os

from appbridge.sdk import AppServer, AudioFrame, DtmfEvent, Session

GREETING = "Echo bot. Say something and you will hear it back. Press any key to hang up."
SECRET = os.environ.get("APP_SECRET", "examples-secret")
PORT = int(os.environ.get("APP_PORT", "9001"))


async def echo(session: Session) -> None:
    greeting = session.say(GREETING)
    async for event in session:
        if isinstance(event, AudioFrame) and greeting.done():
            # Caller frames are already in the session's format: send them straight back.
            session.send_audio(event.data)
        elif isinstance(event, DtmfEvent):
            session.clear()
            await session.say("Goodbye.")
            return  # returning from the handler hangs up


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(AppServer(echo, secrets=SECRET).serve_forever("127.0.0.1", PORT))
