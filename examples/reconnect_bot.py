"""Reconnect bot: a call that survives its app restarting (docs/sdk.md, "Reconnecting").

The caller presses keys; the bot counts them and says the count, and ``#`` ends the call. The
count lives in a small JSON file keyed by ``sessionRef`` (:class:`JsonStore`), so that when this
process is killed mid-call and started again, the gateway's redial (docs/protocol-session-v1.md,
"Reconnecting") finds a process that can take the session back: the resume hook says yes for a
``sessionRef`` the store knows, and the handler re-attaches that session's state. A lost socket
while the process lives is handled by the SDK alone (the session is parked and resumed).

Run it next to the gateway (see examples/README.md), with this app in the gateway's
configuration (docs/configuration.md, `[[apps]]`; the fallback is what the caller hears when
the bot does not come back)::

    [[apps]]
    ref = "reconnect"
    url = "ws://127.0.0.1:9005/session"
    signing_secret = "examples-secret"
    fallback = { message = "The reconnect bot did not come back. Goodbye." }

    [[numbers]]
    number = "+15550000005"
    app = "reconnect"

    .venv/bin/python examples/reconnect_bot.py   # ws://127.0.0.1:9005/session
    .venv/bin/appbridge call http://127.0.0.1:8080 --to +15550000005 --digits 12

Kill it (``kill -9``) while the call is up and start it again at once (the gateway's attempts
end 1.5 to 3 s after the loss): the call goes on, and the bot says how many keys were pressed
before. ``APP_STATE_FILE`` names the store (default: reconnect_bot.json in the temp directory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from appbridge.sdk import (
    AppServer,
    DtmfEvent,
    EventsLost,
    Resumed,
    Session,
    SessionClosed,
    SessionStart,
)

SECRET = os.environ.get("APP_SECRET", "examples-secret")
PORT = int(os.environ.get("APP_PORT", "9005"))
HOST = os.environ.get("APP_HOST", "127.0.0.1")
STATE_FILE = Path(
    os.environ.get("APP_STATE_FILE", Path(tempfile.gettempdir()) / "reconnect_bot.json")
)

log = logging.getLogger("reconnect_bot")


class JsonStore:
    """Per-session state in one JSON file, written whole and renamed into place on each change,
    so a process killed mid-write leaves the previous version. A real deployment would use a
    shared store (Redis, a database) with the same shape: one record per ``sessionRef``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, session_ref: str) -> dict[str, Any] | None:
        record = self._read().get(session_ref)
        return record if isinstance(record, dict) else None

    def put(self, session_ref: str, record: dict[str, Any]) -> None:
        data = self._read()
        data[session_ref] = record
        self._write(data)

    def drop(self, session_ref: str) -> None:
        data = self._read()
        if data.pop(session_ref, None) is not None:
            self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.path)


STORE = JsonStore(STATE_FILE)


async def can_resume(start: SessionStart) -> bool:
    """The resume hook: a redialled session this process does not know is taken back only
    when the store has its state (else the gateway applies the app's fallback)."""
    return STORE.get(start.session_ref) is not None


def speak(session: Session, text: str) -> None:
    """Say ``text`` without waiting: while the session is parked, nothing is said."""
    try:
        session.say(text)
    except SessionClosed:
        pass


async def handle(session: Session, state: dict[str, Any]) -> bool:
    """Serve events until ``#`` (True) or the session's end (False)."""
    async for event in session:
        match event:
            case Resumed(restored=restored):
                log.info("session %s resumed (restored: %s)", session.session_ref, restored)
                speak(session, f"Welcome back. You pressed {state['presses']} keys so far.")
            case EventsLost(count=count):
                state["lost"] = state.get("lost", 0) + count
                STORE.put(session.session_ref, state)
            case DtmfEvent(digit="#"):
                return True
            case DtmfEvent():
                state["presses"] += 1
                STORE.put(session.session_ref, state)
                speak(session, f"{state['presses']}.")
    return False


async def reconnect_bot(session: Session) -> None:
    state = STORE.get(session.session_ref)
    if state is None:
        state = {"presses": 0}
        STORE.put(session.session_ref, state)
        speak(session, "Hello. Press keys and I will count them. Press pound to finish.")
    try:
        while True:
            try:
                if await handle(session, state):
                    await session.say(f"You pressed {state['presses']} keys. Goodbye.")
                    await session.hangup()
                return
            except SessionClosed:
                if not await session.wait_resumed():  # parked: wait for the redial
                    return
    finally:
        if session.closed:
            STORE.drop(session.session_ref)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = AppServer(reconnect_bot, secrets=SECRET, reconnect=True, on_resume=can_resume)
    await server.serve_forever(HOST, PORT)


if __name__ == "__main__":
    asyncio.run(main())
