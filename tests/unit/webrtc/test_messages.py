"""The data channel's messages (appbridge/carriers/webrtc/messages.py): what a browser may
send, and that nothing it sends raises."""

from __future__ import annotations

import json

import pytest

from appbridge.carriers.webrtc.messages import (
    MAX_MESSAGE_BYTES,
    Dtmf,
    Hangup,
    Refused,
    ended_message,
    parse_message,
)


@pytest.mark.parametrize("digit", [*"0123456789*#ABCD", "a", "d"])
def test_every_keypad_digit_is_a_dtmf(digit: str) -> None:
    assert parse_message(json.dumps({"type": "dtmf", "digit": digit})) == Dtmf(digit.upper())


def test_hangup() -> None:
    assert parse_message('{"type": "hangup"}') == Hangup()
    assert parse_message('{"type": "hangup", "why": "bye"}') == Hangup()  # extra keys are fine


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "dtmf", "digit": "55"}',
        '{"type": "dtmf", "digit": "E"}',
        '{"type": "dtmf", "digit": 5}',
        '{"type": "dtmf"}',
        '{"type": "dtmf", "digit": ""}',
        '{"type": "speak", "text": "hi"}',
        '{"digit": "5"}',
        '["dtmf", "5"]',
        '"hangup"',
        "null",
        "not json",
        "",
        '{"type": "dtmf", "digit": "5"',
        b'{"type": "hangup"}',
        "{" + " " * MAX_MESSAGE_BYTES + "}",
        '{"type": {"nested": [1, 2, 3]}}',
    ],
)
def test_anything_else_is_refused_with_a_reason(raw: str | bytes) -> None:
    parsed = parse_message(raw)
    assert isinstance(parsed, Refused)
    assert parsed.reason and len(parsed.reason) < 200


def test_ended_message() -> None:
    assert json.loads(ended_message("app_hangup")) == {"type": "ended", "reason": "app_hangup"}
