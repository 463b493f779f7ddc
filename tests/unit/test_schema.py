"""schema/session.v1.json: generated from the codec, committed, and equal to it in what it
accepts (docs/protocol-session-v1.md: one definition per message)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from appbridge.protocol import schema_gen
from appbridge.protocol import session_v1 as s

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "schema" / "session.v1.json"
DOC_PATH = REPO / "docs" / "protocol-session-v1.md"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
_REGISTRY: Registry = Registry().with_resource(SCHEMA["$id"], Resource.from_contents(SCHEMA))


def validator(definition: str | None = None) -> Draft202012Validator:
    """A validator for the whole document, or for one of its ``$defs``."""
    if definition is None:
        return Draft202012Validator(SCHEMA, registry=_REGISTRY)
    return Draft202012Validator(
        {"$ref": f"{SCHEMA['$id']}#/$defs/{definition}"}, registry=_REGISTRY
    )


COMMAND = validator("Command")
EVENT = validator("Event")
DOCUMENT = validator()

VALID_COMMANDS: list[dict[str, Any]] = [
    {"type": "speak", "text": "Hello"},
    {
        "type": "speak",
        "id": "s1",
        "text": "",
        "last": False,
        "voice": "local/en-US",
        "language": "en-US",
        "interruptible": False,
        "preempt": True,
    },
    {"type": "speak", "text": "x", "id": None},
    {"type": "play", "id": "p1", "url": "https://example.com/hold.wav", "loop": False},
    {
        "type": "play",
        "url": "https://e/x.wav",
        "loop": True,
        "interruptible": False,
        "preempt": True,
    },
    {"type": "mark", "name": "after-greeting", "id": "m1"},
    {"type": "clear"},
    {"type": "clear", "id": "x" * 128},
    {"type": "subscribe", "events": ["turn.estimate", "transcript.partial"]},
    {"type": "subscribe", "events": []},
    {"type": "listen.update", "language": "es", "hints": ["Fonoster"], "patience": "high"},
    {"type": "listen.update"},
    {"type": "hangup", "id": "bye"},
    {"type": "dtmf.send", "digits": "1234#*ABCD,5"},
    {"type": "transfer", "to": "+15550003333"},
    {
        "type": "transfer",
        "to": "sip:desk@sip.carrier.example",
        "mode": "refer",
        "headers": {"X-Ticket": "42"},
        "music": "https://e/m.wav",
        "id": "t1",
    },
    {"type": "transfer", "to": "+15550003333", "mode": "warm"},
    {"type": "transfer.complete", "id": "t1"},
    {"type": "hold", "music": "https://e/m.wav"},
    {"type": "hold"},
    {"type": "resume"},
    {"type": "handoff", "app": "overflow", "payload": {"reason": "busy", "tries": [1, 2]}},
    {"type": "handoff", "app": "overflow"},
    {"type": "speak", "text": "unknown fields are fine", "future": {"x": 1}},
]

INVALID_COMMANDS: list[dict[str, Any]] = [
    {"type": "speak"},
    {"type": "speak", "text": 5},
    {"type": "speak", "text": "x", "last": "yes"},
    {"type": "speak", "text": "x", "id": 7},
    {"type": "speak", "text": "x", "id": "x" * 129},
    {"type": "play"},
    {"type": "play", "url": "https://e", "loop": 1},
    {"type": "mark"},
    {"type": "mark", "name": None},
    {"type": "clear", "id": ["a"]},
    {"type": "subscribe"},
    {"type": "subscribe", "events": "turn.estimate"},
    {"type": "subscribe", "events": [1]},
    {"type": "listen.update", "patience": "forever"},
    {"type": "listen.update", "hints": [1]},
    {"type": "hangup", "id": 1.5},
    {"type": "dtmf.send"},
    {"type": "dtmf.send", "digits": ""},
    {"type": "dtmf.send", "digits": "12x"},
    {"type": "dtmf.send", "digits": "12\n"},
    {"type": "transfer"},
    {"type": "transfer", "to": "+1", "mode": "blind"},
    {"type": "transfer", "to": "+1", "headers": {"X-A": 1}},
    {"type": "transfer", "to": "+1", "headers": ["X-A"]},
    {"type": "transfer.complete"},
    {"type": "hold", "music": 3},
    {"type": "resume", "id": False},
    {"type": "handoff"},
    {"type": "handoff", "app": None},
]


def example_events() -> list[s.Event]:
    return [
        s.SessionStart(
            session_ref="8aa0b7b7-3f75-427e-86c2-14c2834ed4b1",
            call_ref="CA" + "0" * 32,
            app_ref="support-line",
            direction="outbound",
            from_="+15550001111",
            to="+15550002222",
            metadata={"crm": {"id": 7}},
            handoff={"from": "triage"},
            audio=s.AudioFormat(codec="pcmu", rate=8000),
            tracks=[s.Track(id=1, side="inbound", codec="pcmu")],
            speech=s.SpeechDefaults(voice="local/en-US", language="en-US"),
        ),
        s.SessionEnd(reason="handoff"),
        s.SessionEnd(reason="app_hangup", id="bye"),
        s.OutputStarted(id="s1"),
        s.OutputDone(id="s1", heard_ms=2140),
        s.OutputInterrupted(id="s1", heard_text="Hello, I", heard_ms=640),
        s.MarkEvent(name="m", cleared=False),
        s.MarkEvent(name="m", cleared=True, id="m1"),
        s.DtmfEvent(digit="7"),
        s.ErrorEvent(code="bad_message", message="speak: x", fatal=False, relates_to="speak"),
        s.ErrorEvent(code="provider_timeout", message="stt", fatal=False, relates_to=None),
        s.TurnUserStarted(),
        s.TurnLikelyEnded(text="I'd like to"),
        s.TurnResumed(),
        s.TurnEnded(
            text="book a table",
            language="en-US",
            confidence=0.93,
            duration_ms=1800,
            abandoned=False,
        ),
        s.TurnBackchannel(text="uh-huh"),
        s.TurnEstimate(eot=0.72, speaking=False, kind="semantic"),
        s.TranscriptPartial(text="book a", language="en-US"),
    ]


# --- the file is what the code generates -----------------------------------------------------


def test_committed_schema_equals_the_generated_one() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_gen.render_schema()
    assert schema_gen.main(["--check", "--output", str(SCHEMA_PATH)]) == 0


def test_check_fails_on_a_stale_or_missing_file(tmp_path: Path) -> None:
    stale = tmp_path / "session.v1.json"
    stale.write_text(schema_gen.render_schema().replace("Speaks", "Says"), encoding="utf-8")
    assert schema_gen.main(["--check", "--output", str(stale)]) == 1
    assert schema_gen.main(["--check", "--output", str(tmp_path / "absent.json")]) == 1
    assert schema_gen.main(["--output", str(stale)]) == 0
    assert schema_gen.main(["--check", "--output", str(stale)]) == 0


def test_schema_is_valid_draft_2020_12_with_one_definition_per_message() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    defs = SCHEMA["$defs"]
    command_titles = [defs[r["$ref"].rsplit("/", 1)[1]]["title"] for r in defs["Command"]["oneOf"]]
    event_titles = [defs[r["$ref"].rsplit("/", 1)[1]]["title"] for r in defs["Event"]["oneOf"]]
    assert command_titles == list(s.COMMAND_TYPES)
    assert event_titles == list(s.EVENT_TYPES)
    for ref in defs["Command"]["oneOf"] + defs["Event"]["oneOf"]:
        message = defs[ref["$ref"].rsplit("/", 1)[1]]
        assert message["description"]
        assert message["properties"]["type"] == {"const": message["title"]}
        assert "additionalProperties" not in message  # unknown fields are ignored


def test_session_start_requires_every_field_and_nullable_handoff() -> None:
    start = SCHEMA["$defs"]["SessionStart"]
    assert set(start["required"]) == set(start["properties"])
    assert "handoff" in start["required"]


# --- code and schema accept the same messages ------------------------------------------------


def test_every_command_type_has_a_valid_example() -> None:
    assert {c["type"] for c in VALID_COMMANDS} == set(s.COMMAND_TYPES)
    assert {c["type"] for c in INVALID_COMMANDS} == set(s.COMMAND_TYPES)


@pytest.mark.parametrize("wire", VALID_COMMANDS, ids=lambda c: c["type"])
def test_valid_commands_pass_code_and_schema(wire: dict[str, Any]) -> None:
    decoded = s.decode_command(json.dumps(wire))
    assert type(decoded) is s.COMMAND_TYPES[wire["type"]]
    COMMAND.validate(wire)
    DOCUMENT.validate(wire)


@pytest.mark.parametrize("wire", INVALID_COMMANDS, ids=lambda c: c["type"])
def test_invalid_commands_fail_code_and_schema(wire: dict[str, Any]) -> None:
    assert isinstance(s.decode_command(json.dumps(wire)), s.BadMessage)
    assert not COMMAND.is_valid(wire)


@pytest.mark.parametrize("wire", [[1], "speak", None, {"text": "x"}, {"type": 5}])
def test_non_messages_fail_code_and_schema(wire: Any) -> None:
    assert isinstance(s.decode_command(json.dumps(wire)), s.BadMessage)
    assert not DOCUMENT.is_valid(wire)


def test_every_event_type_is_produced_and_validates() -> None:
    events = example_events()
    assert {type(e) for e in events} == set(s.EVENT_TYPES.values())
    for event in events:
        wire = json.loads(s.encode_event(event))
        EVENT.validate(wire)
        DOCUMENT.validate(wire)
        definition = validator(type(event).__name__)
        definition.validate(wire)


def test_error_event_helper_validates() -> None:
    EVENT.validate(json.loads(s.error_event("on_hold", "caller is on hold", "s1")))
    assert not EVENT.is_valid(
        {"type": "error", "code": "nope", "message": "", "fatal": False, "relatesTo": None}
    )


def test_events_missing_required_fields_fail_the_schema() -> None:
    start = json.loads(s.encode_event(example_events()[0]))
    del start["handoff"]
    assert not EVENT.is_valid(start)
    assert not EVENT.is_valid({"type": "output.done", "id": "s1"})
    assert not EVENT.is_valid({"type": "mark", "name": "m"})


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from(
        [
            "",
            "x",
            "+1555",
            "cold",
            "warm",
            "refer",
            "blind",
            "low",
            "high",
            "12#",
            "1\n",
            "ABCD",
            "turn.estimate",
            "x" * 128,
            "x" * 129,
        ]
    ),
    st.lists(st.sampled_from(["a", "turn.estimate"]), max_size=2),
    st.lists(st.integers(0, 1), min_size=1, max_size=1),
    st.dictionaries(st.sampled_from(["X-A", "k"]), st.sampled_from(["v", 1]), max_size=2),
)
_FIELD_NAMES = st.sampled_from(
    [
        "id",
        "text",
        "url",
        "name",
        "digits",
        "to",
        "app",
        "events",
        "mode",
        "last",
        "loop",
        "hints",
        "patience",
        "headers",
        "music",
        "payload",
        "voice",
        "preempt",
        "extra",
    ]
)


@settings(max_examples=400)
@given(
    st.sampled_from(list(s.COMMAND_TYPES)), st.dictionaries(_FIELD_NAMES, _FIELD_VALUES, max_size=5)
)
def test_code_and_schema_agree_on_random_commands(msg_type: str, fields: dict[str, Any]) -> None:
    wire = {"type": msg_type, **fields}
    decoded = s.decode_command(json.dumps(wire))
    assert not isinstance(decoded, s.Ignored)
    assert isinstance(decoded, s.BadMessage) != COMMAND.is_valid(wire), wire


def doc_examples() -> list[dict[str, Any]]:
    """Every JSON message in the protocol page: a block is one object or one object a line."""
    text = DOC_PATH.read_text(encoding="utf-8")
    messages: list[dict[str, Any]] = []
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL):
        try:
            messages.append(json.loads(block))
        except json.JSONDecodeError:
            messages.extend(json.loads(line) for line in block.splitlines() if line.strip())
    return messages


def test_the_protocol_page_examples_are_valid() -> None:
    examples = doc_examples()
    seen: set[str] = set()
    for wire in examples:
        DOCUMENT.validate(wire)
        frame = json.dumps(wire)
        decoded: object
        if EVENT.is_valid(wire) and not (wire["type"] == "mark" and "cleared" not in wire):
            decoded = s.decode_event(frame)
            assert type(decoded) is s.EVENT_TYPES[wire["type"]]
            seen.add("event:" + wire["type"])
        else:
            decoded = s.decode_command(frame)
            assert type(decoded) is s.COMMAND_TYPES[wire["type"]]
            seen.add("command:" + wire["type"])
    # The page shows every message of the protocol.
    assert seen == {"command:" + c for c in s.COMMAND_TYPES} | {"event:" + e for e in s.EVENT_TYPES}
