"""The SDK's Session over an in-memory wire: what it sends, how events answer its awaits.

No sockets and no real-time waits: the wire is two lists, and ``settle()`` only lets the
session's reader and writer tasks run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk import (
    AudioFrame,
    CommandError,
    DtmfEvent,
    ErrorEvent,
    GatherResult,
    InvalidCatalogId,
    OnHold,
    OutputResult,
    Pending,
    QueueFull,
    Session,
    SessionClosed,
    SessionEnded,
    TransferFailed,
    TurnEnded,
    event_queue,
)
from appbridge.sdk.wire import Wire

START = {
    "type": "session.start",
    "protocol": "fonoster.session.v1",
    "sessionRef": "8aa0b7b7-3f75-427e-86c2-14c2834ed4b1",
    "callRef": "CA0123456789abcdef0123456789abcdef",
    "appRef": "support-line",
    "direction": "inbound",
    "from": "+15550001111",
    "to": "+15550002222",
    "metadata": {"ticket": 7},
    "handoff": {"from": "ivr"},
    "audio": {"codec": "pcm16", "rate": 16000},
    "tracks": [{"id": 1, "side": "inbound", "kind": "audio", "codec": "pcm16"}],
    "speech": {"voice": "local/en-US", "language": "en-US"},
}
TURN = {
    "type": "turn.ended",
    "text": "a table for two",
    "language": "en-US",
    "confidence": 0.9,
    "durationMs": 1500,
    "abandoned": False,
}


class MemoryWire:
    """A Wire whose far end is the test: ``push`` frames in, read ``sent`` out."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.sent: list[str | bytes] = []
        self.closed = False

    async def recv(self) -> str | bytes | None:
        return await self.inbox.get()

    async def send(self, frame: str | bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.sent.append(frame)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = True
        self.inbox.put_nowait(None)

    def push(self, msg: dict[str, Any] | str | bytes) -> None:
        self.inbox.put_nowait(json.dumps(msg) if isinstance(msg, dict) else msg)

    def commands(self) -> list[dict[str, Any]]:
        return [json.loads(f) for f in self.sent if isinstance(f, str)]

    def last(self) -> dict[str, Any]:
        return self.commands()[-1]


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Session, MemoryWire]]:
    wire = MemoryWire()
    start = sv1.decode_event(json.dumps(START))
    assert isinstance(start, sv1.SessionStart)
    _: Wire = wire  # MemoryWire satisfies the protocol the server's adapters implement
    session = Session(start, wire)
    session._run_io()
    yield session, wire
    await session._shutdown()


async def test_start_data(pair: tuple[Session, MemoryWire]) -> None:
    session, _ = pair
    assert (session.from_, session.to, session.direction) == (
        "+15550001111",
        "+15550002222",
        "inbound",
    )
    assert session.metadata == {"ticket": 7}
    assert session.handoff_payload == {"from": "ivr"}
    assert session.call_ref == START["callRef"] and session.app_ref == "support-line"
    assert session.session_ref == START["sessionRef"]
    assert (session.audio.codec, session.audio.rate) == ("pcm16", 16000)


async def test_say_sends_speak_and_returns_how_it_ended(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    out = session.say("Hello", voice="local/en-US", language="en-US", preempt=True)
    await settle()
    assert wire.last() == {
        "type": "speak",
        "text": "Hello",
        "id": out.id,
        "voice": "local/en-US",
        "language": "en-US",
        "preempt": True,
    }
    wire.push({"type": "output.started", "id": out.id})
    await settle()
    assert out.started and not out.done()
    wire.push({"type": "output.done", "id": out.id, "heardMs": 840})
    assert await out == OutputResult(out.id, "done", 840)
    second = session.say("Long story", interruptible=False)
    wire.push({"type": "output.interrupted", "id": second.id, "heardText": "Long", "heardMs": 300})
    result = await second
    assert result.interrupted and result.heard_text == "Long" and result.heard_ms == 300
    assert wire.last()["interruptible"] is False


async def test_an_error_raises_on_the_awaiting_call_keyed_by_relates_to(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    a = session.say("one", voice="nope/x")
    b = session.say("two")
    await settle()
    wire.push(
        {
            "type": "error",
            "code": "invalid_catalog_id",
            "message": "no such voice",
            "fatal": False,
            "relatesTo": a.id,
        }
    )
    with pytest.raises(InvalidCatalogId) as info:
        await a
    assert info.value.relates_to == a.id and info.value.code == "invalid_catalog_id"
    assert not b.done()
    wire.push(
        {
            "type": "error",
            "code": "queue_full",
            "message": "120 s",
            "fatal": False,
            "relatesTo": b.id,
        }
    )
    with pytest.raises(QueueFull):
        await b
    mark = session.mark("m")
    wire.push(
        {
            "type": "error",
            "code": "on_hold",
            "message": "held",
            "fatal": False,
            "relatesTo": mark.id,
        }
    )
    with pytest.raises(OnHold):
        await mark
    transfer = session.transfer("+15557654321")
    wire.push(
        {
            "type": "error",
            "code": "transfer_failed",
            "message": "busy",
            "fatal": False,
            "relatesTo": transfer.id,
        }
    )
    with pytest.raises(TransferFailed):
        await transfer
    # An error nobody awaits is an event, and so is one that names no command.
    c = session.say("three")
    wire.push(
        {"type": "error", "code": "on_hold", "message": "held", "fatal": False, "relatesTo": c.id}
    )
    wire.push(
        {
            "type": "error",
            "code": "provider_timeout",
            "message": "stt",
            "fatal": False,
            "relatesTo": None,
        }
    )
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    events = [e async for e in session]
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert [(e.code, e.relates_to) for e in errors] == [
        ("on_hold", c.id),
        ("provider_timeout", None),
    ]
    with pytest.raises(OnHold):
        await c  # the handle still carries it


async def test_an_unknown_error_code_still_fails_its_command(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    out = session.say("x")
    wire.push(
        {
            "type": "error",
            "code": "brand_new_code",
            "message": "later version",
            "fatal": False,
            "relatesTo": out.id,
        }
    )
    with pytest.raises(CommandError) as info:
        await out
    assert type(info.value) is CommandError and info.value.code == "brand_new_code"


async def test_say_stream_sends_pieces_of_one_id_then_last(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair

    async def tokens() -> AsyncIterator[str]:
        for token in ("Hello", ", ", "", "world", "."):
            yield token

    out = session.say_stream(tokens(), language="en-US")
    await settle()
    speaks = wire.commands()
    assert [(s["text"], s.get("last", True)) for s in speaks] == [
        ("Hello", False),
        (", ", False),
        ("world", False),
        (".", False),
        ("", True),
    ]
    assert {s["id"] for s in speaks} == {out.id}
    assert all(s["language"] == "en-US" for s in speaks)
    wire.push({"type": "output.done", "id": out.id, "heardMs": 900})
    assert (await out).done


async def test_say_stream_stops_reading_once_interrupted(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    gate = asyncio.Event()
    produced: list[str] = []
    finished = asyncio.Event()

    async def tokens() -> AsyncIterator[str]:
        try:
            for i in range(100):
                produced.append(str(i))
                yield f"{i} "
                await gate.wait()
                gate.clear()
        finally:
            finished.set()

    out = session.say_stream(tokens())
    await settle()
    wire.push({"type": "output.started", "id": out.id})
    wire.push({"type": "output.interrupted", "id": out.id, "heardText": "0", "heardMs": 200})
    await settle()
    gate.set()
    result = await out
    await asyncio.wait_for(finished.wait(), 1)
    assert result.interrupted
    assert len(produced) <= 2  # the generator was closed, not drained
    assert all(c.get("last") is False for c in wire.commands())  # no `last` after the cut


async def test_say_stream_of_nothing_sends_nothing_and_a_failing_source_raises(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    assert (await session.say_stream([])).heard_ms == 0
    assert wire.commands() == []

    async def broken() -> AsyncIterator[str]:
        yield "Partial answer"
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError, match="model crashed"):
        await session.say_stream(broken())
    assert [(c["text"], c.get("last", True)) for c in wire.commands()] == [
        ("Partial answer", False),
        ("", True),
    ]


async def test_automatic_barge_in_clears_an_interruptible_item(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    out = session.say("A long answer")
    wire.push({"type": "output.started", "id": out.id})
    wire.push({"type": "turn.user_started"})
    wire.push({"type": "turn.user_started"})  # once per item
    await settle()
    clears = [c for c in wire.commands() if c["type"] == "clear"]
    assert len(clears) == 1
    wire.push({"type": "output.interrupted", "id": out.id, "heardText": "A long", "heardMs": 400})
    assert (await out).interrupted


async def test_no_barge_in_over_a_non_interruptible_item_or_when_off(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    firm = session.say("Legal notice", interruptible=False)
    wire.push({"type": "output.started", "id": firm.id})
    wire.push({"type": "turn.user_started"})
    wire.push({"type": "output.done", "id": firm.id, "heardMs": 1000})
    await firm
    session.auto_barge_in = False
    soft = session.say("Anything else?")
    wire.push({"type": "output.started", "id": soft.id})
    wire.push({"type": "turn.user_started"})
    await settle()
    assert [c["type"] for c in wire.commands()] == ["speak", "speak"]
    session.auto_barge_in = True
    idle = session.say("queued")
    await settle()
    wire.push({"type": "output.done", "id": soft.id, "heardMs": 10})
    wire.push({"type": "turn.user_started"})  # nothing plays: nothing to clear
    await settle()
    assert "clear" not in [c["type"] for c in wire.commands()]
    assert not idle.done()


async def test_gather_speech_and_digits(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    task = asyncio.create_task(session.gather(timeout_s=30))
    await settle()
    wire.push({"type": "turn.user_started"})
    wire.push(TURN)
    result = await task
    assert result.kind == "speech" and result.text == "a table for two"
    assert isinstance(result.turn, TurnEnded) and result.turn.duration_ms == 1500
    task = asyncio.create_task(session.gather(timeout_s=30, max_digits=4))
    await settle()
    for digit in "12#":
        wire.push({"type": "dtmf", "digit": digit})
    assert await task == GatherResult("dtmf", digits="12", terminator="#")
    # The input a gather took is not yielded again; everything else is.
    wire.push({"type": "dtmf", "digit": "5"})
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    events = [e async for e in session]
    assert [type(e).__name__ for e in events] == ["DtmfEvent", "SessionEnd"]


async def test_gather_with_a_prompt_stops_it_on_a_key(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    task = asyncio.create_task(session.gather(prompt="Press 1 for sales", max_digits=1))
    await settle()
    speak = wire.last()
    assert speak["type"] == "speak" and speak["text"] == "Press 1 for sales"
    wire.push({"type": "output.started", "id": speak["id"]})
    wire.push({"type": "dtmf", "digit": "1"})
    assert await task == GatherResult("dtmf", digits="1")
    await settle()
    assert wire.last()["type"] == "clear"


async def test_a_key_drops_a_prompt_that_has_not_started_yet(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    task = asyncio.create_task(session.gather(prompt="Press 1", max_digits=1))
    await settle()
    wire.push({"type": "dtmf", "digit": "1"})  # before output.started: still queued
    assert (await task).digits == "1"
    await settle()
    assert wire.last()["type"] == "clear"


async def test_no_clear_for_a_prompt_behind_another_playing_item(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    intro = session.say("Welcome")
    wire.push({"type": "output.started", "id": intro.id})
    await settle()
    task = asyncio.create_task(session.gather(prompt="Press 1", max_digits=1))
    await settle()
    wire.push({"type": "dtmf", "digit": "1"})
    assert (await task).digits == "1"
    await settle()
    assert "clear" not in [c["type"] for c in wire.commands()]


async def test_a_sent_item_as_the_prompt_and_a_failing_text_prompt(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    reply = session.say("An answer the caller may talk over")
    task = asyncio.create_task(session.gather(prompt=reply, timeout_s=30))
    await settle()
    assert [c["type"] for c in wire.commands()] == ["speak"]  # nothing said twice
    wire.push({"type": "output.started", "id": reply.id})
    wire.push({"type": "dtmf", "digit": "3"})
    await settle()
    assert wire.last()["type"] == "clear"
    wire.push({"type": "dtmf", "digit": "#"})
    assert await task == GatherResult("dtmf", digits="3", terminator="#")
    task = asyncio.create_task(session.gather(prompt="Hola", voice="nope/x"))
    await settle()
    speak = wire.last()
    wire.push(
        {
            "type": "error",
            "code": "invalid_catalog_id",
            "message": "no such voice",
            "fatal": False,
            "relatesTo": speak["id"],
        }
    )
    with pytest.raises(InvalidCatalogId):
        await task
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    assert not [e async for e in session if isinstance(e, ErrorEvent)]  # raised, not queued


async def test_gather_times_out(pair: tuple[Session, MemoryWire]) -> None:
    session, _ = pair
    # The rules of time are tested in virtual time (test_sdk_gather); this is only the wiring.
    result = await session.gather(timeout_s=0.001)
    assert result.timed_out


async def test_iteration_yields_typed_events_and_audio_frames(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    wire.push(b"\x01" + b"\x10\x00" * 320)
    wire.push({"type": "dtmf", "digit": "7", "extra": "ignored"})
    wire.push({"type": "turn.brand_new", "x": 1})  # unknown type: ignored
    wire.push("not json at all")  # malformed: dropped
    wire.push({"type": "dtmf", "digit": "77"})  # invalid field: dropped
    wire.push({"type": "output.done", "id": "x"})  # missing heardMs: dropped
    wire.push(b"")  # no track byte: dropped
    wire.push(TURN)
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    events = [e async for e in session]
    assert events[0] == AudioFrame(1, b"\x10\x00" * 320)
    assert events[1] == DtmfEvent(digit="7")
    assert isinstance(events[2], TurnEnded)
    assert type(events[3]).__name__ == "SessionEnd"
    assert len(events) == 4


async def test_unread_audio_is_bounded(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    session._events.max_audio_frames = 5
    for i in range(20):
        wire.push(bytes([1, i]))
    wire.push({"type": "dtmf", "digit": "1"})
    wire.push({"type": "session.end", "reason": "caller_hangup"})
    events = [e async for e in session]
    frames = [e for e in events if isinstance(e, AudioFrame)]
    assert [f.data for f in frames] == [bytes([i]) for i in range(15, 20)]
    assert isinstance(events[-2], DtmfEvent)
    assert session._events.dropped_audio_frames == 15
    assert event_queue.MAX_QUEUED_AUDIO_FRAMES == 500


async def test_session_end_resolves_what_asked_for_it_and_fails_the_rest(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    speaking = session.say("never finished")
    transfer = session.transfer("+15557654321", mode="warm")
    gathering = asyncio.create_task(session.gather(timeout_s=60))
    await settle()
    transfer.complete()
    await settle()
    assert wire.last() == {"type": "transfer.complete", "id": transfer.id}
    wire.push({"type": "session.end", "reason": "transfer", "id": transfer.id})
    end = await transfer
    assert end.reason == "transfer"
    with pytest.raises(SessionEnded) as info:
        await speaking
    assert info.value.reason == "transfer"
    with pytest.raises(SessionClosed):
        await gathering
    assert await session.hangup() == "transfer"  # nothing to hang up: no raise
    with pytest.raises(SessionClosed):
        session.say("too late")


async def test_the_socket_closing_makes_every_await_raise(
    pair: tuple[Session, MemoryWire],
) -> None:
    session, wire = pair
    pending: list[Pending[Any]] = [
        session.say("a"),
        session.mark("m"),
        session.handoff("other", {"k": 1}),
    ]
    gathering = asyncio.create_task(session.gather(timeout_s=60))
    hanging = session.hangup()
    await settle()
    wire.inbox.put_nowait(None)  # the peer went away without session.end
    for handle in pending:
        with pytest.raises(SessionClosed):
            await handle
    with pytest.raises(SessionClosed):
        await gathering
    assert await hanging == "closed"
    await asyncio.wait_for(session.wait_closed(), 1)
    assert [e async for e in session] == []


async def test_commands_on_the_wire(pair: tuple[Session, MemoryWire]) -> None:
    session, wire = pair
    session.play("https://example.com/a.wav", loop=True, preempt=True)
    await session.clear()
    await session.send_audio([b"\x00\x01", b"\x02\x03"])
    await session.listen(language="es", hints=["Fonoster"], patience="high")
    await session.subscribe("turn.estimate", "transcript.partial")
    await session.hold("https://example.com/hold.wav")
    await session.resume()
    await session.dtmf("12,#")
    handoff = session.handoff("overflow", {"reason": "after-hours"})
    mark = session.mark("after")
    hangup = session.hangup()
    await settle()
    cmds = wire.commands()
    by_type = {c["type"]: c for c in cmds}
    assert by_type["play"]["url"] == "https://example.com/a.wav" and by_type["play"]["loop"]
    assert set(by_type["clear"]) == {"type", "id"}
    assert by_type["listen.update"] == {
        "type": "listen.update",
        "language": "es",
        "hints": ["Fonoster"],
        "patience": "high",
        "id": by_type["listen.update"]["id"],
    }
    assert by_type["subscribe"]["events"] == ["turn.estimate", "transcript.partial"]
    assert by_type["hold"]["music"] == "https://example.com/hold.wav"
    assert by_type["dtmf.send"]["digits"] == "12,#"
    assert by_type["handoff"]["payload"] == {"reason": "after-hours"}
    assert by_type["mark"] == {"type": "mark", "name": "after", "id": mark.id}
    assert [f for f in wire.sent if isinstance(f, bytes)] == [b"\x00\x01", b"\x02\x03"]
    ids = [c["id"] for c in cmds]
    assert len(set(ids)) == len(ids)  # every command has an id of its own
    wire.push({"type": "mark", "name": "after", "cleared": True, "id": mark.id})
    assert (await mark).cleared is True
    wire.push({"type": "session.end", "reason": "app_hangup", "id": hangup.id})
    assert await hangup == "app_hangup"
    with pytest.raises(SessionEnded):
        await handoff
    with pytest.raises(ValueError):
        session.dtmf("12x")
