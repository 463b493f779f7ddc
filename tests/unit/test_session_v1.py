"""The fonoster.session.v1 codec: docs/protocol-session-v1.md as executable checks."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appbridge.protocol import session_v1 as s

EXAMPLE_SESSION_START: dict[str, Any] = {
    "type": "session.start",
    "protocol": "fonoster.session.v1",
    "sessionRef": "8aa0b7b7-3f75-427e-86c2-14c2834ed4b1",
    "callRef": "room-1",
    "appRef": "support-line",
    "direction": "inbound",
    "from": "+15550001111",
    "to": "+15550002222",
    "metadata": {},
    "handoff": None,
    "audio": {"codec": "pcm16", "rate": 16000},
    "tracks": [
        {"id": 1, "side": "inbound", "kind": "audio", "codec": "pcm16"},
        {"id": 2, "side": "outbound", "kind": "audio", "codec": "pcm16"},
    ],
    "speech": {"voice": "deepgram/aura-2-thalia-en", "language": "en-US"},
}


def example_session_start() -> s.SessionStart:
    return s.SessionStart(
        session_ref="8aa0b7b7-3f75-427e-86c2-14c2834ed4b1",
        call_ref="room-1",
        app_ref="support-line",
        direction="inbound",
        from_="+15550001111",
        to="+15550002222",
        audio=s.AudioFormat(codec="pcm16", rate=16000),
        tracks=[
            s.Track(id=1, side="inbound", codec="pcm16"),
            s.Track(id=2, side="outbound", codec="pcm16"),
        ],
        speech=s.SpeechDefaults(voice="deepgram/aura-2-thalia-en", language="en-US"),
    )


def frame(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# --- commands ---------------------------------------------------------------------------------


def test_speak_defaults_follow_the_protocol_table() -> None:
    cmd = s.decode_command(b'{"type":"speak","text":"Hello"}')
    assert cmd == s.Speak(text="Hello")
    assert isinstance(cmd, s.Speak)
    assert (cmd.id, cmd.last, cmd.interruptible, cmd.preempt) == (None, True, True, False)
    assert (cmd.voice, cmd.language) == (None, None)


def test_speak_streaming_piece_keeps_every_field() -> None:
    cmd = s.decode_command(
        frame(
            {
                "type": "speak",
                "id": "s1",
                "text": "",
                "last": False,
                "voice": "local/en-US",
                "language": "en-US",
                "interruptible": False,
                "preempt": True,
            }
        )
    )
    assert cmd == s.Speak(
        text="",
        id="s1",
        last=False,
        voice="local/en-US",
        language="en-US",
        interruptible=False,
        preempt=True,
    )


def test_documented_play_example_decodes() -> None:
    cmd = s.decode_command(
        '{ "type": "play", "id": "p1", "url": "https://example.com/hold.wav", "loop": false }'
    )
    assert cmd == s.Play(url="https://example.com/hold.wav", id="p1", loop=False)


def test_documented_subscribe_and_listen_update_examples_decode() -> None:
    sub = s.decode_command(
        '{ "type": "subscribe", "events": ["turn.estimate", "transcript.partial"] }'
    )
    assert sub == s.Subscribe(events=["turn.estimate", "transcript.partial"])
    assert isinstance(sub, s.Subscribe)
    assert set(sub.events) == s.OPT_IN_EVENTS
    upd = s.decode_command(
        '{ "type": "listen.update", "language": "es", "hints": ["Fonoster"], "patience": "high" }'
    )
    assert upd == s.ListenUpdate(language="es", hints=["Fonoster"], patience="high")


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ({"type": "mark", "name": "m1"}, s.MarkCommand(name="m1")),
        ({"type": "clear", "id": "c"}, s.Clear(id="c")),
        ({"type": "hangup"}, s.Hangup()),
        (
            {"type": "dtmf.send", "digits": "0123456789*#ABCD,1"},
            s.DtmfSend(digits="0123456789*#ABCD,1"),
        ),
        ({"type": "transfer", "to": "+15550003333"}, s.Transfer(to="+15550003333", mode="cold")),
        (
            {"type": "transfer", "to": "sip:a@trunk", "mode": "refer", "headers": {"X-A": "1"}},
            s.Transfer(to="sip:a@trunk", mode="refer", headers={"X-A": "1"}),
        ),
        ({"type": "transfer.complete", "id": "t1"}, s.TransferComplete(id="t1")),
        ({"type": "hold", "music": "https://m/x.wav"}, s.Hold(music="https://m/x.wav")),
        ({"type": "resume"}, s.Resume()),
        ({"type": "handoff", "app": "b"}, s.Handoff(app="b", payload=None)),
        (
            {"type": "handoff", "app": "b", "payload": {"cart": [1, 2], "vip": True}},
            s.Handoff(app="b", payload={"cart": [1, 2], "vip": True}),
        ),
    ],
)
def test_commands_decode_to_their_structs(wire: dict[str, Any], expected: s.Command) -> None:
    assert s.decode_command(frame(wire)) == expected


def test_unknown_fields_are_ignored() -> None:
    assert s.decode_command(b'{"type":"hangup","reason":"bye","x":{"y":[1]}}') == s.Hangup()


def test_unknown_types_are_ignored_not_errors() -> None:
    assert s.decode_command(b'{"type":"speak.ssml","ssml":"<s/>"}') == s.Ignored("speak.ssml")
    # An event type sent back by an app is not a command either.
    assert s.decode_command(b'{"type":"session.start"}') == s.Ignored("session.start")
    # Even with fields that would be wrong for a known type.
    assert s.decode_command(b'{"type":"future","text":5,"id":7}') == s.Ignored("future")


def test_decode_accepts_str_and_bytes_alike() -> None:
    assert s.decode_command('{"type":"clear"}') == s.decode_command(b'{"type":"clear"}')


def test_encode_command_round_trips_and_omits_defaults() -> None:
    cmd = s.Speak(text="hi", id="a")
    assert s.encode_command(cmd) == b'{"type":"speak","text":"hi","id":"a"}'
    assert s.decode_command(s.encode_command(cmd)) == cmd
    t = s.Transfer(to="+1", mode="warm", music="https://m")
    assert s.decode_command(s.encode_command(t)) == t


# --- bad messages and relatesTo ("Errors for bad input") -----------------------------------------


def test_wrong_field_type_names_the_field_and_relates_to_the_id() -> None:
    bad = s.decode_command(b'{"type":"speak","id":"s9","text":5}')
    assert bad == s.BadMessage("speak: Expected `str`, got `int` - at `$.text`", "s9")


def test_missing_required_field_relates_to_the_type_without_an_id() -> None:
    bad = s.decode_command(b'{"type":"play"}')
    assert isinstance(bad, s.BadMessage)
    assert bad.relates_to == "play"
    assert bad.message == "play: Object missing required field `url`"


def test_non_string_id_falls_back_to_the_type() -> None:
    bad = s.decode_command(b'{"type":"mark","id":42,"name":"m"}')
    assert isinstance(bad, s.BadMessage)
    assert bad.relates_to == "mark"
    assert "$.id" in bad.message


def test_id_limit_is_128_characters() -> None:
    ok = s.decode_command(frame({"type": "clear", "id": "é" * 128}))
    assert ok == s.Clear(id="é" * 128)
    long_id = "x" * 129
    bad = s.decode_command(frame({"type": "clear", "id": long_id}))
    assert isinstance(bad, s.BadMessage)
    assert "length <= 128" in bad.message
    # The over-long id is not echoed back: relatesTo falls back to the type.
    assert bad.relates_to == "clear"


@pytest.mark.parametrize(
    ("raw", "message_part"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"type":"speak","text":1,', "not valid JSON"),
        (b"[1,2]", "expected a JSON object, got list"),
        (b'"speak"', "expected a JSON object, got str"),
        (b"null", "expected a JSON object, got NoneType"),
        (b'{"text":"hi"}', "`type` is missing"),
        (b'{"type":3}', "`type` is not a string"),
        (b'{"type":null}', "`type` is not a string"),
    ],
)
def test_unparseable_frames_relate_to_unknown(raw: bytes, message_part: str) -> None:
    bad = s.decode_command(raw)
    assert isinstance(bad, s.BadMessage)
    assert message_part in bad.message
    assert bad.relates_to == "unknown"


def test_missing_type_still_relates_to_a_valid_id() -> None:
    assert s.decode_command(b'{"id":"q1","text":"hi"}') == s.BadMessage("`type` is missing", "q1")


@pytest.mark.parametrize(
    "wire",
    [
        {"type": "dtmf.send", "digits": ""},
        {"type": "dtmf.send", "digits": "12e"},
        {"type": "dtmf.send", "digits": "a"},
        {"type": "dtmf.send", "digits": "1\n"},
        {"type": "transfer", "to": "+1", "mode": "blind"},
        {"type": "transfer", "to": "+1", "headers": {"X": 1}},
        {"type": "listen.update", "patience": "forever"},
        {"type": "listen.update", "hints": "Fonoster"},
        {"type": "subscribe"},
        {"type": "subscribe", "events": "turn.estimate"},
        {"type": "speak", "text": "x", "last": "no"},
        {"type": "transfer.complete"},
        {"type": "handoff", "payload": {}},
        {"type": "mark"},
    ],
)
def test_invalid_fields_are_bad_messages(wire: dict[str, Any]) -> None:
    bad = s.decode_command(frame(wire))
    assert isinstance(bad, s.BadMessage)
    assert bad.message.startswith(f"{wire['type']}: ")
    assert bad.relates_to == wire["type"]


def test_text_frame_limit_is_64_kib_in_utf8_bytes() -> None:
    head = b'{"type":"speak","text":"'
    tail = b'"}'
    filler = s.MAX_TEXT_FRAME_BYTES - len(head) - len(tail)
    at_limit = head + b"a" * filler + tail
    assert len(at_limit) == s.MAX_TEXT_FRAME_BYTES
    assert isinstance(s.decode_command(at_limit), s.Speak)
    over = head + b"a" * (filler + 1) + tail
    assert s.decode_command(over) == s.BadMessage("text frame is over 65536 bytes", "speak")
    # A str is measured in UTF-8 bytes: 3 bytes per "€" although 1 character.
    euro_count = filler // 3 + 1
    text_frame = '{"type":"speak","text":"' + "€" * euro_count + '"}'
    assert len(text_frame) < s.MAX_TEXT_FRAME_BYTES
    assert isinstance(s.decode_command(text_frame), s.BadMessage)
    assert isinstance(s.decode_command(text_frame[: -2 - 2] + '"}'), s.Speak)


def test_handoff_payload_limit_is_16_kib_of_json() -> None:
    overhead = len(msgspec.json.encode({"k": ""}))
    fits = {"k": "a" * (s.MAX_HANDOFF_PAYLOAD_BYTES - overhead)}
    ok = s.decode_command(frame({"type": "handoff", "app": "b", "payload": fits}))
    assert isinstance(ok, s.Handoff)
    assert ok.payload == fits
    too_big = {"k": "a" * (s.MAX_HANDOFF_PAYLOAD_BYTES - overhead + 1)}
    bad = s.decode_command(frame({"type": "handoff", "id": "h1", "app": "b", "payload": too_big}))
    assert bad == s.BadMessage("handoff: payload is 16385 bytes, over 16384", "h1")
    bad2 = s.decode_command(frame({"type": "handoff", "app": "b", "payload": too_big}))
    assert isinstance(bad2, s.BadMessage)
    assert bad2.relates_to == "handoff"


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_decode_command_never_raises_on_bytes(raw: bytes) -> None:
    assert isinstance(s.decode_command(raw), (*s.COMMAND_TYPES.values(), s.Ignored, s.BadMessage))


JSON = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=8),
    st.text(min_size=127, max_size=130, alphabet="ab"),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)


@settings(max_examples=300)
@given(
    st.sampled_from([*s.COMMAND_TYPES, "other"]),
    st.dictionaries(
        st.sampled_from(["id", "text", "url", "name", "digits", "to", "app", "events", "mode"]),
        JSON,
        max_size=4,
    ),
)
def test_relates_to_is_always_the_id_or_the_type(msg_type: str, fields: dict[str, Any]) -> None:
    result = s.decode_command(frame({"type": msg_type, **fields}))
    if msg_type == "other":
        assert result == s.Ignored("other")
    elif isinstance(result, s.BadMessage):
        msg_id = fields.get("id")
        valid_id = isinstance(msg_id, str) and len(msg_id) <= s.MAX_ID_CHARS
        assert result.relates_to == (msg_id if valid_id else msg_type)
    else:
        assert type(result) is s.COMMAND_TYPES[msg_type]


# --- events -----------------------------------------------------------------------------------


def test_session_start_matches_the_example_exactly() -> None:
    encoded = s.encode_event(example_session_start())
    assert json.loads(encoded) == EXAMPLE_SESSION_START
    # Same key order as the example, handoff present as null.
    assert list(json.loads(encoded)) == list(EXAMPLE_SESSION_START)
    assert b'"handoff":null' in encoded


def test_session_start_carries_a_handoff_payload() -> None:
    start = example_session_start()
    start.handoff = {"from": "a", "n": 1}
    assert json.loads(s.encode_event(start))["handoff"] == {"from": "a", "n": 1}


@pytest.mark.parametrize(
    ("event", "wire"),
    [
        (s.SessionEnd(reason="app_hangup"), b'{"type":"session.end","reason":"app_hangup"}'),
        (
            s.SessionEnd(reason="caller_hangup", id="h"),
            b'{"type":"session.end","reason":"caller_hangup","id":"h"}',
        ),
        (s.OutputStarted(id="s1"), b'{"type":"output.started","id":"s1"}'),
        (s.OutputDone(id="s1", heard_ms=1200), b'{"type":"output.done","id":"s1","heardMs":1200}'),
        (
            s.OutputInterrupted(id="s1", heard_text="Hello", heard_ms=0),
            b'{"type":"output.interrupted","id":"s1","heardText":"Hello","heardMs":0}',
        ),
        (s.MarkEvent(name="m", cleared=False), b'{"type":"mark","name":"m","cleared":false}'),
        (
            s.MarkEvent(name="m", cleared=True, id="k"),
            b'{"type":"mark","name":"m","cleared":true,"id":"k"}',
        ),
        (s.DtmfEvent(digit="#"), b'{"type":"dtmf","digit":"#"}'),
        (s.TurnUserStarted(), b'{"type":"turn.user_started"}'),
        (s.TurnLikelyEnded(text="I want"), b'{"type":"turn.likely_ended","text":"I want"}'),
        (s.TurnResumed(), b'{"type":"turn.resumed"}'),
        (
            s.TurnEnded(text="", language="en", confidence=0.0, duration_ms=10000, abandoned=True),
            b'{"type":"turn.ended","text":"","language":"en","confidence":0.0,'
            b'"durationMs":10000,"abandoned":true}',
        ),
        (s.TurnBackchannel(text="uh-huh"), b'{"type":"turn.backchannel","text":"uh-huh"}'),
        (
            s.TurnEstimate(eot=0.5, speaking=False, kind="pause"),
            b'{"type":"turn.estimate","eot":0.5,"speaking":false,"kind":"pause"}',
        ),
        (
            s.TranscriptPartial(text="hel", language="en"),
            b'{"type":"transcript.partial","text":"hel","language":"en"}',
        ),
    ],
)
def test_events_encode_exactly_and_round_trip(event: s.Event, wire: bytes) -> None:
    assert s.encode_event(event) == wire
    assert s.decode_event(wire) == event


def test_error_event_always_carries_fatal_and_relates_to() -> None:
    assert s.error_event("bad_message", "speak: missing text", "s1") == (
        b'{"type":"error","code":"bad_message","message":"speak: missing text",'
        b'"fatal":false,"relatesTo":"s1"}'
    )
    assert json.loads(s.error_event("internal", "x", None))["relatesTo"] is None


def test_decode_event_handles_unknown_and_bad_frames() -> None:
    assert s.decode_event(b'{"type":"turn.future"}') == s.Ignored("turn.future")
    bad = s.decode_event(b'{"type":"output.done","id":"a"}')
    assert isinstance(bad, s.BadMessage)
    assert "heardMs" in bad.message
    assert s.decode_event(example_session_start_bytes()) == example_session_start()


def example_session_start_bytes() -> bytes:
    return json.dumps(EXAMPLE_SESSION_START).encode()


def test_tables_match_the_protocol_doc() -> None:
    assert {
        "caller_hangup",
        "app_hangup",
        "transfer",
        "handoff",
        "error",
        "timeout",
    } == s.END_REASONS
    assert {
        "bad_message",
        "read_only",
        "provider_unavailable",
        "provider_timeout",
        "invalid_catalog_id",
        "feature_not_supported",
        "transfer_failed",
        "on_hold",
        "queue_full",
        "play_fetch_failed",
        "internal",
    } == s.ERROR_CODES
    assert set(s.ERROR_CODE_MEANINGS) == s.ERROR_CODES
    assert set(s.COMMAND_TYPES) == {
        "speak",
        "play",
        "mark",
        "clear",
        "subscribe",
        "listen.update",
        "hangup",
        "dtmf.send",
        "transfer",
        "transfer.complete",
        "hold",
        "resume",
        "handoff",
    }
    assert s.PROTOCOL == "fonoster.session.v1"
