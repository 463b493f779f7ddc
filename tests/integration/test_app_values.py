"""Odd values an app may send reach the speech engines, the recogniser's settings and the
carriers without ending the call: each command gets its usual answer (or a clear error) and the
call goes on (docs/protocol-session-v1.md, "Errors"). Real gateway, real sockets."""

from __future__ import annotations

import json

from tests.integration.conftest import Env
from tests.integration.test_bad_input import still_works
from tests.integration.test_session_protocol import connect

ODD_TEXTS = [
    "a\x00b",  # NUL inside the text
    "\u202e\u2028 reversed and a line separator",
    "\ufeff" * 50,  # only byte-order marks
    "<speak><prosody rate='x-fast'>markup</prosody></speak>",
    "\x07\x1b[31m control characters",
    "\U0001f600" * 200,  # emoji only
    "x" * 4000,  # one long word
    "ﷺ" * 300,  # a ligature that expands when normalised
]


async def test_odd_speak_texts_are_spoken_or_refused_and_the_call_goes_on(env: Env) -> None:
    """Each text starts playing (or is refused with an error); a clear then ends it, so a text
    that would speak for minutes (4,000 letters spelled out) is still answered promptly."""
    _, session, _ = await connect(env)
    for i, text in enumerate(ODD_TEXTS):
        item = f"odd-{i}"
        await session.send({"type": "speak", "id": item, "text": text})
        first = await session.wait_for(lambda m, item=item: _about(m, item), timeout=20)
        if first["type"] == "error":
            assert first["fatal"] is False, first
            continue
        await session.send({"type": "clear", "id": f"clear-{i}"})
        await session.wait_for(
            lambda m, item=item: _about(m, item) and m["type"] != "output.started", timeout=20
        )
    assert not [m for m in session.messages if m["type"] == "session.end"]
    await still_works(session)


def _about(message: dict[str, object], item: str) -> bool:
    if message["type"] == "error":
        return message.get("relatesTo") == item
    return message.get("id") == item and str(message["type"]).startswith("output.")


async def test_odd_listen_and_mark_values_keep_the_call_up(env: Env) -> None:
    _, session, _ = await connect(env)
    odd = ["\u0000", "&keyterm=injected", "a" * 500, "\u202e", "%zz", "é" * 100]
    await session.send({"type": "listen.update", "language": "en-US", "hints": odd})
    await session.send({"type": "listen.update", "patience": "low", "hints": ["?", "#", "/"]})
    await session.send({"type": "mark", "id": "m-odd", "name": "\u2028\u0000" * 20})
    mark = await session.wait_for(lambda m: m["type"] == "mark" and m.get("id") == "m-odd", 10)
    assert mark["name"] == "\u2028\u0000" * 20
    errors = [m for m in session.messages if m["type"] == "error"]
    assert all(not e["fatal"] for e in errors), json.dumps(errors)
    await still_works(session)
