"""The extension messages (appbridge/protocol/session_v1_ext.py) in the codec and the schema.

docs/protocol-session-v1.md, "Extensions within version 1": ``session.update``, ``events.lost``,
``output.queue`` and the ``reconnect`` field of ``session.start``, which is absent on a normal
start. Every ``jsonc`` example of that section is checked against the codec and the schema.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.session_v1_ext import reconnect_of, with_reconnect
from tests.unit.test_session_v1 import example_session_start

REPO = Path(__file__).resolve().parents[2]
SCHEMA: dict[str, Any] = json.loads((REPO / "schema" / "session.v1.json").read_text("utf-8"))
DOC = (REPO / "docs" / "protocol-session-v1.md").read_text("utf-8")
_REGISTRY: Registry = Registry().with_resource(SCHEMA["$id"], Resource.from_contents(SCHEMA))


def validator(definition: str) -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"{SCHEMA['$id']}#/$defs/{definition}"}, registry=_REGISTRY
    )


EXT_COMMAND = validator("ExtensionCommand")
EXT_EVENT = validator("ExtensionEvent")
RECONNECT = validator("Reconnect")
DOCUMENT = Draft202012Validator(SCHEMA, registry=_REGISTRY)


def test_session_update_decodes_and_validates() -> None:
    for wire in (
        {"type": "session.update", "reconnect": True},
        {"type": "session.update", "reconnect": False, "id": "u1"},
    ):
        decoded = sv1.decode_command(json.dumps(wire))
        assert type(decoded) is sv1.SessionUpdate and decoded.reconnect is wire["reconnect"]
        EXT_COMMAND.validate(wire)
        DOCUMENT.validate(wire)


@pytest.mark.parametrize(
    "wire",
    [
        {"type": "session.update"},
        {"type": "session.update", "reconnect": "yes"},
        {"type": "session.update", "reconnect": True, "id": "x" * 129},
    ],
)
def test_bad_session_updates_fail_code_and_schema(wire: dict[str, Any]) -> None:
    decoded = sv1.decode_command(json.dumps(wire))
    assert isinstance(decoded, sv1.BadMessage) and decoded.relates_to == "session.update"
    assert not EXT_COMMAND.is_valid(wire)


def test_the_core_type_tables_are_unchanged_and_the_extensions_known() -> None:
    assert "session.update" not in sv1.COMMAND_TYPES
    assert sv1.ANY_COMMAND_TYPES["session.update"] is sv1.SessionUpdate
    assert sv1.ANY_EVENT_TYPES["events.lost"] is sv1.EventsLost
    assert sv1.ANY_EVENT_TYPES["output.queue"] is sv1.OutputQueueLevel


def test_extension_events_round_trip_and_validate() -> None:
    for event in (sv1.EventsLost(count=3), sv1.OutputQueueLevel(queued_ms=0)):
        wire = json.loads(sv1.encode_event(event))
        EXT_EVENT.validate(wire)
        DOCUMENT.validate(wire)
        assert sv1.decode_event(json.dumps(wire)) == event
    assert json.loads(sv1.encode_event(sv1.OutputQueueLevel(queued_ms=4380))) == {
        "type": "output.queue",
        "queuedMs": 4380,
    }
    assert not EXT_EVENT.is_valid({"type": "events.lost", "count": -1})
    assert not EXT_EVENT.is_valid({"type": "output.queue"})


def test_a_normal_session_start_has_no_reconnect_field() -> None:
    encoded = sv1.encode_event(example_session_start())
    assert "reconnect" not in json.loads(encoded)
    assert reconnect_of(encoded) is None


def test_a_redialled_session_start_carries_reconnect_last() -> None:
    encoded = sv1.encode_event(example_session_start())
    frame = with_reconnect(encoded, sv1.Reconnect(attempt=2, down_ms=350))
    wire = json.loads(frame)
    assert wire["reconnect"] == {"attempt": 2, "downMs": 350}
    assert list(wire)[-1] == "reconnect"
    assert {k: v for k, v in wire.items() if k != "reconnect"} == json.loads(encoded)
    assert reconnect_of(frame) == sv1.Reconnect(attempt=2, down_ms=350)
    assert sv1.decode_event(frame) == example_session_start()  # the field is extra to SessionStart
    RECONNECT.validate(wire["reconnect"])
    DOCUMENT.validate(wire)
    assert not RECONNECT.is_valid({"attempt": 0, "downMs": 1})


def test_reconnect_of_answers_none_for_garbage() -> None:
    assert reconnect_of(b"not json") is None
    assert reconnect_of('{"type":"session.start","reconnect":{"attempt":"x"}}') is None


def test_the_extension_examples_on_the_protocol_page_are_valid() -> None:
    blocks = re.findall(r"```jsonc\n(.*?)```", DOC, flags=re.DOTALL)
    seen = set()
    for block in blocks:
        wire = json.loads(block)
        DOCUMENT.validate(wire)
        seen.add(wire["type"])
        if wire["type"] == "session.update":
            assert type(sv1.decode_command(block)) is sv1.SessionUpdate
        elif wire["type"] == "session.start":
            assert reconnect_of(block) is not None
            assert type(sv1.decode_event(block)) is sv1.SessionStart
        else:
            assert type(sv1.decode_event(block)) is sv1.ANY_EVENT_TYPES[wire["type"]]
    assert seen == {"session.update", "session.start", "events.lost", "output.queue"}
