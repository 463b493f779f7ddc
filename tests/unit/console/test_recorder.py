"""A call's console record in virtual time (console/recorder.py, console/board.py): messages
through the link's tap, audio only counted and summarised, levels from the last frames, state
changes, the end, and the bounded ended list. The call is a stand-in with the members the
recorder reads; no timer runs, the test ticks the console itself."""

from __future__ import annotations

import asyncio
import json
import math
import struct
from types import SimpleNamespace
from typing import Any

from appbridge.calls.state import CallState
from appbridge.clock import VirtualClock
from appbridge.console.board import TICKS_PER_SUMMARY, CallConsole
from appbridge.console.levels import SILENCE_DBFS
from appbridge.console.timeline import SAMPLES_KEPT
from appbridge.media.codecs import PCM16_8K


def tone(amplitude: float) -> bytes:
    n = 160
    return struct.pack(f"<{n}h", *(round(amplitude * 32767 * math.sin(i / 3.0)) for i in range(n)))


def fake_link() -> SimpleNamespace:
    return SimpleNamespace(
        tap=None, audio_in_frames=0, audio_in_bytes=0, audio_out_frames=0, audio_out_bytes=0
    )


def fake_call(clock: VirtualClock, ref: str = "CA1", protocol: str = "fonoster") -> Any:
    return SimpleNamespace(
        gw=SimpleNamespace(clock=clock),
        call_ref=ref,
        app=SimpleNamespace(ref="main"),
        carrier="twilio",
        from_="+15550001111",
        to="+15550002222",
        state=CallState.DIALING,
        started_wall=clock.wall(),
        ended_wall=None,
        end_reason=None,
        encoder=SimpleNamespace(protocol=protocol),
        leg=SimpleNamespace(audio_format=PCM16_8K),
        link=None,
        tap=None,
        frames_in=0,
        frames_out=0,
        last_in=b"",
        last_out=b"",
        ended=asyncio.Event(),
    )


def entries(console: CallConsole, ref: str = "CA1", kind: str | None = None) -> list[Any]:
    recorder = console.get(ref)
    assert recorder is not None
    found = recorder.timeline_page(0)["entries"]
    return [e for e in found if kind is None or e["kind"] == kind]


def test_messages_state_audio_and_levels() -> None:
    clock = VirtualClock()
    console = CallConsole()
    call = fake_call(clock)
    recorder = console.open(call)
    assert call.tap is recorder
    assert [e["type"] for e in entries(console, kind="state")] == ["dialing"]

    link = fake_link()
    call.link = link
    call.state = CallState.ACTIVE
    clock.advance(0.1)
    recorder.text_out(json.dumps({"type": "session.start", "callRef": "CA1"}).encode())
    recorder.text_in(b'{"type": "speak", "id": "s1", "text": "Hi"}')
    for _ in range(50):  # a second of audio each way
        call.frames_in += 1
        call.last_in = tone(0.1)
        call.frames_out += 1
        call.last_out = bytes(320)
        link.audio_out_frames += 1
        link.audio_out_bytes += 320
    for _ in range(TICKS_PER_SUMMARY):
        clock.advance(0.25)
        console.tick()
    states = [e["type"] for e in entries(console, kind="state")]
    assert states == ["dialing", "active"]
    messages = entries(console, kind="message")
    assert [(m["dir"], m["type"]) for m in messages] == [
        ("to_app", "session.start"),
        ("from_app", "speak"),
    ]
    assert messages[0]["ms"] == 100 and messages[1]["summary"] == "text: Hi"
    audio = {e["dir"]: e["data"] for e in entries(console, kind="audio")}
    assert audio == {
        "caller_in": {"frames": 50, "bytes": 16000},
        "caller_out": {"frames": 50, "bytes": 16000},
        "to_app": {"frames": 50, "bytes": 16000},
    }
    levels = entries(console, kind="level")
    assert len(levels) == TICKS_PER_SUMMARY
    first = levels[0]["data"]
    assert -30 < first["in_dbfs"] < -15 and first["out_dbfs"] == SILENCE_DBFS
    assert levels[1]["data"]["in_dbfs"] == SILENCE_DBFS  # no frame came since the last reading
    assert link.tap is recorder  # a link taken since is tapped at the next summary


def test_twilio_media_messages_count_as_audio() -> None:
    clock = VirtualClock()
    console = CallConsole()
    call = fake_call(clock, protocol="twilio")
    recorder = console.open(call)
    call.link = fake_link()
    media = b'{"event": "media", "streamSid": "MZ1", "media": {"payload": "AAAA"}}'
    for _ in range(50):
        recorder.text_in(media)
    recorder.text_in(b'{"event": "mark", "streamSid": "MZ1", "mark": {"name": "media"}}')
    for _ in range(TICKS_PER_SUMMARY):
        console.tick()
    assert [m["type"] for m in entries(console, kind="message")] == ["mark"]
    audio = [e for e in entries(console, kind="audio") if e["dir"] == "from_app"]
    assert audio[0]["data"] == {"frames": 50, "bytes": 50 * len(media)}


def test_an_ended_call_moves_to_the_ended_list_and_lets_go() -> None:
    clock = VirtualClock()
    console = CallConsole(ended_kept=2)
    calls = [fake_call(clock, ref=f"CA{n}") for n in range(3)]
    for call in calls:
        console.open(call)
    listing = console.listing()
    assert [r["callRef"] for r in listing["live"]] == ["CA0", "CA1", "CA2"]
    assert listing["ended"] == []
    row = listing["live"][0]
    assert row["startedAt"] == "2023-11-14T22:13:20Z" and row["durationMs"] == 0
    for n, call in enumerate(calls):
        clock.advance(1.0)
        call.state = CallState.ENDED
        call.end_reason = "caller_hangup"
        call.ended_wall = clock.wall()
        call.ended.set()
        console.tick()
        assert console.get(f"CA{n}").call is None  # type: ignore[union-attr]
    listing = console.listing()
    assert listing["live"] == []
    assert [r["callRef"] for r in listing["ended"]] == ["CA2", "CA1"]  # newest first, 2 kept
    ended = listing["ended"][0]
    assert ended["reason"] == "caller_hangup" and ended["state"] == "ended"
    assert ended["endedAt"] == "2023-11-14T22:13:23Z" and ended["durationMs"] == 3000
    assert console.get("CA0") is None
    page = console.get("CA2").timeline_page(0)  # type: ignore[union-attr]
    assert page["live"] is False and page["entries"][-1]["type"] == "ended"


def test_the_timeline_is_bounded_per_call() -> None:
    clock = VirtualClock()
    console = CallConsole()
    call = fake_call(clock)
    recorder = console.open(call)
    call.link = fake_link()
    for n in range(2100):
        recorder.text_in(json.dumps({"type": "dtmf", "digit": str(n % 10)}).encode())
    for _ in range(1000):
        call.frames_in += 1
        call.last_in = tone(0.1)
        console.tick()
    page = recorder.timeline_page(0)
    kept = page["entries"]
    assert len(kept) <= 2000 and page["dropped"] + len(kept) == recorder.timeline.seq
    assert sum(e["kind"] in ("level", "audio") for e in kept) == SAMPLES_KEPT
    messages = [e for e in kept if e["kind"] == "message"]
    assert 0 < len(messages) < 2100 and messages[-1]["data"]["digit"] == "9"
    assert page["next"] == recorder.timeline.seq
    assert recorder.timeline_page(page["next"])["entries"] == []
    assert recorder.timeline_page(99_999)["next"] == recorder.timeline.seq


def test_a_new_link_keeps_the_counts_of_the_one_before() -> None:
    clock = VirtualClock()
    console = CallConsole()
    recorder = console.open(fake_call(clock))
    call = recorder.call
    assert call is not None
    first = fake_link()
    call.link = first
    first.audio_out_frames, first.audio_out_bytes = 10, 1000
    recorder.sample_audio()
    first.audio_out_frames, first.audio_out_bytes = 15, 1500
    second = fake_link()
    call.link = second  # a reconnect: the first link's last 5 frames still count
    second.audio_out_frames, second.audio_out_bytes = 2, 200
    recorder.sample_audio()
    audio = [e["data"] for e in entries(console, kind="audio") if e["dir"] == "to_app"]
    assert audio == [{"frames": 10, "bytes": 1000}, {"frames": 7, "bytes": 700}]
    assert second.tap is recorder
