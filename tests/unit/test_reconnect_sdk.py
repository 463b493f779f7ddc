"""Reconnecting in the SDK (appbridge/sdk/resume.py; docs/sdk.md, "Reconnecting"), on in-memory
sockets: no network, the server's ``run_session`` driven directly.

Off by default. With ``reconnect=True``: ``session.update`` follows ``session.start``; a lost
socket parks the session (data and queued events kept, commands raising ``SessionClosed``); a
redialled ``session.start`` for its ``sessionRef`` resumes it with no second handler call
(``Resumed``, then ``events.lost``); an unknown ``sessionRef`` is refused unless the resume hook
restores it; a parked session not resumed in its window ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk import AppServer, EventsLost, Resumed, Session, SessionClosed
from appbridge.sdk.resume import RESUME_WINDOW_S
from tests.unit.test_sdk_session import START, MemoryWire, settle

REDIAL = {**START, "reconnect": {"attempt": 1, "downMs": 120}}


class Harness:
    def __init__(self, **options: Any) -> None:
        self.sessions: list[Session] = []
        self.released = asyncio.Event()
        self.behaviour: Callable[[Session], Awaitable[None]] | None = None

        async def handler(session: Session) -> None:
            self.sessions.append(session)
            if self.behaviour is not None:
                await self.behaviour(session)
            else:
                await session.wait_closed()

        self.server = AppServer(handler, secrets=None, **options)
        self.tasks: list[asyncio.Task[None]] = []

    def connect(self, start: dict[str, Any]) -> MemoryWire:
        wire = MemoryWire()
        wire.push(start)
        self.tasks.append(asyncio.create_task(self.server.run_session(wire)))
        return wire

    async def close(self) -> None:
        for session in self.sessions:
            session._on_closed()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 5)


def lose(wire: MemoryWire) -> None:
    """The socket dies under the session: reads end, writes fail."""
    wire.closed = True
    wire.inbox.put_nowait(None)


async def test_off_by_default_a_lost_socket_closes_the_session() -> None:
    h = Harness()
    wire = h.connect(START)
    await settle()
    session = h.sessions[0]
    assert not session.reconnect and wire.commands() == []
    lose(wire)
    await settle()
    assert session.closed and not session.parked
    await h.close()


async def test_session_update_goes_out_first() -> None:
    h = Harness(reconnect=True)
    wire = h.connect(START)
    await settle()
    h.sessions[0].say("Hello")
    await settle()
    assert [c["type"] for c in wire.commands()] == ["session.update", "speak"]
    assert wire.commands()[0] == {"type": "session.update", "reconnect": True}
    await h.close()


async def test_a_lost_socket_parks_the_session_keeping_its_events() -> None:
    h = Harness(reconnect=True)
    wire = h.connect(START)
    await settle()
    session = h.sessions[0]
    session.scratch = {"step": 3}  # type: ignore[attr-defined]
    out = session.say("Hello")
    wire.push({"type": "dtmf", "digit": "5"})
    await settle()
    lose(wire)
    await settle()
    assert session.parked and not session.closed
    with pytest.raises(SessionClosed):
        await out  # its answer went with the socket
    with pytest.raises(SessionClosed):
        session.say("while parked")
    events = aiter(session)
    assert await anext(events) == sv1.DtmfEvent(digit="5")
    assert session.scratch == {"step": 3}  # type: ignore[attr-defined]
    await h.close()


async def test_a_redial_resumes_the_session_without_a_second_handler_call() -> None:
    h = Harness(reconnect=True)
    first = h.connect(START)
    await settle()
    session = h.sessions[0]
    lose(first)
    await settle()
    second = h.connect(REDIAL)
    await settle()
    assert len(h.sessions) == 1 and not session.parked
    assert second.commands()[0] == {"type": "session.update", "reconnect": True}
    second.push({"type": "events.lost", "count": 2})
    events = aiter(session)
    assert await anext(events) == Resumed(attempt=1, down_ms=120, restored=False)
    assert await anext(events) == EventsLost(count=2)
    out = session.say("Back again")
    await settle()
    assert second.last()["type"] == "speak" and second.last()["id"] == out.id
    assert not [c for c in first.commands() if c["type"] == "speak"]
    second.push({"type": "session.end", "reason": "caller_hangup"})
    await asyncio.wait_for(session.wait_closed(), 5)
    await h.close()


async def test_a_redial_before_this_side_saw_the_loss_moves_the_session() -> None:
    h = Harness(reconnect=True)
    first = h.connect(START)
    await settle()
    session = h.sessions[0]
    second = h.connect(REDIAL)  # the gateway gave up on the first socket (30 s of silence)
    await settle()
    assert first.closed and not session.parked
    assert second.commands()[0]["type"] == "session.update"
    await h.close()


async def test_wait_resumed_answers_once_parking_is_over() -> None:
    h = Harness(reconnect=True)
    first = h.connect(START)
    await settle()
    session = h.sessions[0]
    lose(first)
    await settle()
    waiting = asyncio.create_task(session.wait_resumed())
    await settle()
    assert not waiting.done()
    h.connect(REDIAL)
    assert await asyncio.wait_for(waiting, 5) is True
    await h.close()


async def test_a_parked_session_not_resumed_in_its_window_ends() -> None:
    assert RESUME_WINDOW_S == 15.0
    h = Harness(reconnect=True, resume_window_s=0.05)
    wire = h.connect(START)
    await settle()
    session = h.sessions[0]
    lose(wire)
    await settle()
    assert session.parked
    assert await asyncio.wait_for(session.wait_resumed(), 5) is False
    assert session.closed
    late = h.connect(REDIAL)
    await asyncio.wait_for(h.tasks[-1], 5)
    assert late.closed and late.commands() == []  # refused: the gateway falls back
    await h.close()


async def test_an_unknown_session_ref_is_refused_without_the_handler() -> None:
    h = Harness(reconnect=True)
    wire = h.connect(REDIAL)
    await asyncio.wait_for(h.tasks[-1], 5)
    assert wire.closed and wire.commands() == [] and h.sessions == []
    await h.close()


async def test_the_resume_hook_restores_a_session_this_process_does_not_know() -> None:
    asked: list[str] = []

    async def hook(start: sv1.SessionStart) -> bool:
        asked.append(start.session_ref)
        return start.session_ref == START["sessionRef"]

    h = Harness(reconnect=True, on_resume=hook)
    wire = h.connect(REDIAL)
    await settle()
    assert asked == [START["sessionRef"]] and len(h.sessions) == 1
    session = h.sessions[0]
    assert wire.commands()[0] == {"type": "session.update", "reconnect": True}
    assert await anext(aiter(session)) == Resumed(attempt=1, down_ms=120, restored=True)
    other = h.connect({**REDIAL, "sessionRef": "somebody-else"})
    await asyncio.wait_for(h.tasks[-1], 5)
    assert other.closed and len(h.sessions) == 1
    await h.close()


async def test_hangup_turns_reconnecting_off() -> None:
    h = Harness(reconnect=True)
    wire = h.connect(START)
    await settle()
    session = h.sessions[0]
    session.hangup()
    await settle()
    lose(wire)
    await settle()
    assert session.closed and not session.parked
    assert json.loads(wire.sent[-1])["type"] == "hangup"
    await h.close()
