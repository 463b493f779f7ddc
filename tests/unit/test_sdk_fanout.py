"""Several consumers of one session's events: callbacks per type and extra iterators
(docs/sdk.md, "Events"). In memory, no sockets, no real-time waits."""

from __future__ import annotations

import asyncio
import logging

import pytest

from appbridge.sdk import DtmfEvent, ErrorEvent, Session, TurnEnded
from appbridge.sdk.events import Event
from tests.unit.test_sdk_session import TURN, MemoryWire, pair, settle

__all__ = ["pair"]


async def test_every_iterator_sees_every_event(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    first, second = session.events(), session.events()
    wire.push({"type": "dtmf", "digit": "5"})
    wire.push(TURN)
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    seen_first = [e async for e in first]
    seen_second = [e async for e in second]
    shared = [e async for e in session]
    assert [type(e).__name__ for e in seen_first] == ["DtmfEvent", "TurnEnded", "SessionEnd"]
    assert seen_second == seen_first
    assert shared == seen_first  # the session's own iterator is not starved by the taps


async def test_taps_also_see_events_that_answered_an_await(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    tap = session.events()
    output = session.say("hello")
    await settle()
    wire.push({"type": "output.done", "id": output.id, "heardMs": 400})
    assert (await output).heard_ms == 400
    mark = session.mark("m1")
    await settle()
    wire.push({"type": "mark", "name": "m1", "id": mark.id, "cleared": False})
    await mark
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    kinds = [type(e).__name__ async for e in tap]
    assert kinds == ["OutputDone", "MarkEvent", "SessionEnd"]


async def test_callbacks_by_type_sync_and_async(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    keys: list[str] = []
    texts: list[str] = []
    everything: list[Event] = []
    done = asyncio.Event()

    async def on_turn(event: TurnEnded) -> None:
        await asyncio.sleep(0)
        texts.append(event.text)
        done.set()

    session.on(DtmfEvent, lambda e: keys.append(e.digit))
    session.on(TurnEnded, on_turn)
    remove = session.on(object, everything.append)
    wire.push({"type": "dtmf", "digit": "1"})
    wire.push(TURN)
    await asyncio.wait_for(done.wait(), 1)
    remove()
    wire.push({"type": "dtmf", "digit": "2"})
    await settle()
    assert keys == ["1", "2"]
    assert texts == ["a table for two"]
    assert [type(e).__name__ for e in everything] == ["DtmfEvent", "TurnEnded"]


async def test_a_raising_callback_is_logged_and_the_session_goes_on(
    pair: tuple[Session, MemoryWire], caplog: pytest.LogCaptureFixture
) -> None:
    session, wire = pair
    calls: list[str] = []

    def broken(event: DtmfEvent) -> None:
        calls.append(event.digit)
        raise RuntimeError("app bug")

    session.on(DtmfEvent, broken)
    with caplog.at_level(logging.ERROR, logger="appbridge.sdk"):
        wire.push({"type": "dtmf", "digit": "3"})
        wire.push({"type": "dtmf", "digit": "4"})
        await settle()
    assert calls == ["3", "4"]
    assert "a callback for DtmfEvent raised" in caplog.text
    assert not session.closed
    output = session.say("still here")
    await settle()
    wire.push({"type": "output.done", "id": output.id, "heardMs": 1})
    assert (await output).heard_ms == 1


async def test_hold_music_failure_reaches_an_error_callback(
    pair: tuple[Session, MemoryWire],
) -> None:
    """``hold`` resolves once written; a music fetch failure comes later, related to its id."""
    session, wire = pair
    errors: list[ErrorEvent] = []
    session.on(ErrorEvent, errors.append)
    hold = session.hold(music="https://music.example/missing.wav")
    await hold
    wire.push(
        {
            "type": "error",
            "code": "play_fetch_failed",
            "message": "hold music https://music.example/missing.wav: HTTP 404",
            "fatal": False,
            "relatesTo": hold.id,
        }
    )
    await settle()
    assert [(e.code, e.relates_to) for e in errors] == [("play_fetch_failed", hold.id)]


async def test_an_iterator_opened_after_the_end_ends_at_once(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    await session.wait_closed()
    assert [e async for e in session.events()] == []
