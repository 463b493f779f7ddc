"""JSON nested deeper than the decoder can go is bad input like any other
(appbridge/protocol/json_bounds.py), on every decoder of peer JSON."""

from __future__ import annotations

import pytest

from appbridge.protocol import session_v1 as sv1
from appbridge.protocol import twilio_streams as ts
from appbridge.protocol.json_bounds import (
    TOO_DEEP,
    JsonBodyError,
    loads_object,
    top_level_strings,
)

DEEP = "[" * 9000 + "]" * 9000  # 18 KB of nesting
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000


@pytest.mark.parametrize("payload", [DEEP, DEEP_OBJECT])
@pytest.mark.parametrize("id_first", [True, False])
def test_a_deep_handoff_payload_is_bad_message_related_to_its_id(
    payload: str, id_first: bool
) -> None:
    head, tail = '"type":"handoff","id":"h1","app":"other"', f'"payload":{payload}'
    frame = "{" + (f"{head},{tail}" if id_first else f"{tail},{head}") + "}"
    result = sv1.decode_command(frame.encode())
    assert result == sv1.BadMessage(f"handoff: {TOO_DEEP}", "h1")


def test_a_deep_message_without_an_id_relates_to_its_type_or_to_unknown() -> None:
    assert sv1.decode_command(f'{{"type":"speak","x":{DEEP}}}') == sv1.BadMessage(
        f"speak: {TOO_DEEP}", "speak"
    )
    assert sv1.decode_command(DEEP) == sv1.BadMessage(TOO_DEEP, "unknown")
    assert sv1.decode_command(f'{{"x":{DEEP}}}') == sv1.BadMessage(TOO_DEEP, "unknown")


def test_a_deep_message_of_an_unknown_type_is_ignored() -> None:
    assert sv1.decode_command(f'{{"type":"later.v2","x":{DEEP}}}') == sv1.Ignored("later.v2")


def test_an_overlong_id_of_a_deep_message_is_not_echoed() -> None:
    frame = f'{{"type":"hangup","id":"{"x" * 200}","x":{DEEP}}}'
    assert sv1.decode_command(frame) == sv1.BadMessage(f"hangup: {TOO_DEEP}", "hangup")


def test_the_sdk_side_decoder_answers_deep_events_too() -> None:
    result = sv1.decode_event(f'{{"type":"mark","x":{DEEP}}}')
    assert isinstance(result, sv1.BadMessage) and TOO_DEEP in result.message


@pytest.mark.parametrize("sender", ["twilio", "app"])
def test_a_deep_twilio_media_stream_message_is_one_bad_message(sender: str) -> None:
    frame = f'{{"event":"media","media":{DEEP}}}'
    assert ts.decode_twilio(frame, sender=sender) == ts.TwilioBadMessage(TOO_DEEP)  # type: ignore[arg-type]


def test_top_level_strings_skips_nested_values_and_non_strings() -> None:
    doc = (
        '{"a": {"type": "inner", "id": "no"}, "n": 5, "type": "speak", "s": ["id"], "id": "x\\"y"}'
    )
    assert top_level_strings(doc, ("type", "id")) == {"type": "speak", "id": 'x"y'}
    assert top_level_strings('["type", "id"]', ("type",)) == {}
    assert top_level_strings('{"id": 7, "type": "mark"}', ("type", "id")) == {"type": "mark"}
    assert top_level_strings("", ("type",)) == {}


def test_loads_object_bounds_size_depth_and_shape() -> None:
    assert loads_object(b'{"to": "+1555"}', max_bytes=100) == {"to": "+1555"}
    for body, words in (
        (b"{" + b" " * 200 + b"}", "over 100 bytes"),
        (('{"a":' * 3000 + "1" + "}" * 3000).encode(), TOO_DEEP),
        (b"[1, 2]", "a JSON object"),
        (b"{nope", "not valid JSON"),
    ):
        with pytest.raises(JsonBodyError, match=words):
            loads_object(body, max_bytes=100 if b" " * 200 in body else 1 << 20)


def test_loads_turns_any_bad_json_into_a_value_error() -> None:
    from appbridge.protocol.json_bounds import loads

    assert loads(b'{"a": [1, 2]}') == {"a": [1, 2]}
    for bad in (DEEP, "{nope", '"\\ud800"'):
        with pytest.raises(ValueError):
            loads(bad)
