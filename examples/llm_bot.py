"""A streaming "LLM" bot: replies are generated token by token and spoken as they come.

The "model" is a local text generator that yields words with small delays, as an LLM's streaming API
does; ``say_stream`` sends them as ``last: false`` pieces of one utterance, so the caller starts
hearing the reply before it is fully written (docs/protocol-session-v1.md, ``speak``). If the caller
talks over it, the SDK's automatic barge-in clears it and the generator is closed, so no more tokens
are paid for. Swap ``generate`` for a real client's stream and the rest stays as is.

Run it next to the gateway (see examples/README.md)::

    .venv/bin/python examples/llm_bot.py           # listens on ws://127.0.0.1:9003/session
    make run CONFIG=examples/appbridge.examples.toml
    .venv/bin/appbridge call http://127.0.0.1:8080 --to +15550000003 --digits 1
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator

from appbridge.sdk import AppServer, Session

SECRET = os.environ.get("APP_SECRET", "examples-secret")
PORT = int(os.environ.get("APP_PORT", "9003"))
TOKEN_DELAY_S = 0.03


def compose(heard: str | None) -> str:
    """The "model": a canned answer that depends on what it heard."""
    if heard is None:
        return (
            "Hello! I am a streaming assistant. Every word you hear was generated "
            "one token at a time. Ask me something, or press a key."
        )
    return f"You said {heard}. That is a fine thing to say. Is there anything else?"


async def generate(heard: str | None) -> AsyncIterator[str]:
    """Yields the reply token by token, with a delay per token like a hosted model's stream."""
    for word in compose(heard).split(" "):
        await asyncio.sleep(TOKEN_DELAY_S)
        yield word + " "


async def llm_bot(session: Session) -> None:
    reply = session.say_stream(generate(None))
    while True:
        # The reply is the gather's prompt: the caller may answer while it plays (talking over
        # it, or a key, stops it), and the timeout starts once it is over.
        turn = await session.gather(prompt=reply, timeout_s=15, max_digits=1)
        if turn.timed_out:
            await session.say("I did not hear anything. Goodbye.")
            return
        heard = turn.text if turn.kind == "speech" else f"the key {turn.digits}"
        reply = session.say_stream(generate(heard))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(AppServer(llm_bot, secrets=SECRET).serve_forever("127.0.0.1", PORT))
