"""The console's bounded timeline and what a message is cut to (console/timeline.py)."""

from __future__ import annotations

import json

import pytest

from appbridge import logs
from appbridge.console.timeline import (
    MAX_DATA_BYTES,
    MAX_STRING,
    Timeline,
    cut,
    parse_message,
)


def test_entries_are_numbered_bounded_and_dropped_oldest_first() -> None:
    timeline = Timeline(limit=5, samples_kept=2)
    for n in range(5):
        timeline.add(n, "to_app", "message", "t", "", {"n": n})
        timeline.add_level(n, -20.0 - n, -100.0)
    assert len(timeline) == 5 and timeline.seq == 10
    assert timeline.dropped == 2 + 3  # 3 kept of 5 messages, 2 of 5 samples
    assert [e["seq"] for e in timeline.after(0)] == [5, 7, 8, 9, 10]
    assert [e["seq"] for e in timeline.after(8)] == [9, 10]
    assert timeline.after(10) == [] and timeline.after(99) == []
    message, level = timeline.after(8)
    assert message == {
        "seq": 9,
        "ms": 4,
        "dir": "to_app",
        "kind": "message",
        "type": "t",
        "summary": "",
        "data": {"n": 4},
    }
    assert level == {
        "seq": 10,
        "ms": 4,
        "dir": None,
        "kind": "level",
        "type": "level",
        "summary": "in -24.0 dBFS, out -100.0 dBFS",
        "data": {"in_dbfs": -24.0, "out_dbfs": -100.0},
    }
    timeline.add_frames(5, "caller_in", 50, 8000)
    assert timeline.after(10)[0]["data"] == {"frames": 50, "bytes": 8000}
    assert timeline.after(10)[0]["summary"] == "50 frames, 8000 bytes"


def test_messages_are_kept_within_a_byte_budget() -> None:
    timeline = Timeline(event_bytes=10_000)
    for n in range(10):
        timeline.add(n, "from_app", "message", "speak", "", {"n": n, "text": "x" * 3000})
    assert [e["data"]["n"] for e in timeline.after(0)] == [7, 8, 9]
    assert timeline.dropped == 7


def test_a_message_keeps_its_type_and_a_summary() -> None:
    type_, summary, data = parse_message(b'{"type": "speak", "id": "s1", "text": "Hello"}')
    assert (type_, summary) == ("speak", "text: Hello")
    assert data == {"type": "speak", "id": "s1", "text": "Hello"}
    type_, _, data = parse_message(b'{"event": "mark", "mark": {"name": "m1"}}')
    assert type_ == "mark" and data == {"event": "mark", "mark": {"name": "m1"}}


def test_bad_messages_are_entries_without_data() -> None:
    assert parse_message(b"{nope") == ("invalid", "not JSON (5 bytes)", None)
    assert parse_message(b"[1, 2]")[0] == "invalid"
    assert parse_message(b"\xff\xfe")[0] == "invalid"
    assert parse_message(b'{"type": 5}')[0] == "unknown"


def test_json_nested_too_deeply_for_any_decoder_keeps_only_its_type() -> None:
    deep = b'{"type": "handoff", "payload": ' + b"[" * 9000 + b"]" * 9000 + b"}"
    type_, summary, data = parse_message(deep)
    assert (type_, data) == ("handoff", None)
    assert summary == f"JSON nested too deeply ({len(deep)} bytes)"


def test_strings_lists_and_the_whole_are_bounded() -> None:
    _, _, data = parse_message(json.dumps({"type": "speak", "text": "a" * 5000}).encode())
    assert data is not None and len(data["text"]) == MAX_STRING + 1
    huge = {"type": "x", **{f"k{i}": "b" * 400 for i in range(40)}}
    _, _, data = parse_message(json.dumps(huge).encode())
    assert data is not None and data["truncated"] is True and data["type"] == "x"
    assert len(json.dumps(data, ensure_ascii=False)) <= MAX_DATA_BYTES
    assert len(cut(list(range(500)))) == 51
    deep: object = "leaf"
    for _ in range(20):
        deep = {"d": deep}
    assert "leaf" not in json.dumps(cut(deep))


def test_secrets_and_urls_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_secrets", logs._secrets)  # the configured secrets come back after
    logs.add_secrets({"sekrit-value-42"})
    message = {
        "type": "session.start",
        "signing_secret": "abc",
        "metadata": {"apiToken": "t0k3n", "note": "uses sekrit-value-42 inside"},
        "url": "wss://user:pw@app.example.com/path/token123?key=1",
    }
    _, _, data = parse_message(json.dumps(message).encode())
    text = json.dumps(data)
    for secret in ("abc", "t0k3n", "sekrit-value-42", "token123", "pw@", "key=1"):
        assert secret not in text
    assert data is not None and data["url"].startswith("wss://app.example.com")
