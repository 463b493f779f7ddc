"""Twilio Media Streams codec, both roles (docs/protocol-twilio.md)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appbridge.protocol import twilio_streams as t

ULAW_20MS = bytes(range(160))

# The reference's examples, with its ellipses filled in.
FROM_TWILIO = {
    "connected": '{"event":"connected","protocol":"Call","version":"1.0.0"}',
    "start": '{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1",'
    '"callSid":"CA1","tracks":["inbound"],"mediaFormat":{"encoding":"audio/x-mulaw",'
    '"sampleRate":8000,"channels":1},"customParameters":{"from":"+15550001111"}},'
    '"streamSid":"MZ1"}',
    "media": '{"event":"media","sequenceNumber":"2","media":{"track":"inbound","chunk":"1",'
    '"timestamp":"5","payload":"' + base64.b64encode(ULAW_20MS).decode() + '"},"streamSid":"MZ1"}',
    "dtmf": '{"event":"dtmf","streamSid":"MZ1","sequenceNumber":"5",'
    '"dtmf":{"track":"inbound_track","digit":"1"}}',
    "mark": '{"event":"mark","sequenceNumber":"4","streamSid":"MZ1","mark":{"name":"my label"}}',
    "stop": '{"event":"stop","sequenceNumber":"352","streamSid":"MZ1",'
    '"stop":{"accountSid":"AC1","callSid":"CA1"}}',
}


def started_writer() -> t.TwilioStreamWriter:
    writer = t.TwilioStreamWriter()
    writer.connected()
    writer.start("AC1", "MZ1", "CA1", {"from": "+15550001111"})
    return writer


# --- decoding what Twilio sends (carrier side) ------------------------------------------------


def test_decodes_every_reference_message_from_twilio() -> None:
    assert t.decode_twilio(FROM_TWILIO["connected"]) == t.Connected(
        protocol="Call", version="1.0.0"
    )

    start = t.decode_twilio(FROM_TWILIO["start"])
    assert isinstance(start, t.TwilioStart)
    assert (start.sequence_number, start.stream_sid) == ("1", "MZ1")
    assert (start.start.account_sid, start.start.stream_sid, start.start.call_sid) == (
        "AC1",
        "MZ1",
        "CA1",
    )
    assert start.start.tracks == ["inbound"]
    assert start.start.media_format == t.MediaFormat(
        encoding="audio/x-mulaw", sample_rate=8000, channels=1
    )
    assert start.start.custom_parameters == {"from": "+15550001111"}

    media = t.decode_twilio(FROM_TWILIO["media"])
    assert isinstance(media, t.TwilioMedia)
    assert media.media == t.MediaPayload(
        track="inbound", chunk="1", timestamp="5", payload=ULAW_20MS
    )
    assert (media.sequence_number, media.stream_sid) == ("2", "MZ1")

    dtmf = t.decode_twilio(FROM_TWILIO["dtmf"])
    assert isinstance(dtmf, t.TwilioDtmf)
    assert dtmf.dtmf == t.TwilioDtmfInfo(track="inbound_track", digit="1")

    mark = t.decode_twilio(FROM_TWILIO["mark"])
    assert isinstance(mark, t.TwilioMark)
    assert mark.mark.name == "my label"

    stop = t.decode_twilio(FROM_TWILIO["stop"])
    assert isinstance(stop, t.TwilioStop)
    assert stop.stop == t.TwilioStopInfo(account_sid="AC1", call_sid="CA1")
    assert stop.sequence_number == "352"


def test_twilio_side_ignores_clear_and_unknown_events() -> None:
    assert t.decode_twilio('{"event":"clear","streamSid":"MZ1"}') == t.TwilioIgnored("clear")
    assert t.decode_twilio('{"event":"future","x":1}') == t.TwilioIgnored("future")


def test_unknown_fields_are_ignored() -> None:
    msg = t.decode_twilio(
        '{"event":"mark","streamSid":"MZ1","mark":{"name":"a","extra":1},"new":true}'
    )
    assert isinstance(msg, t.TwilioMark)
    assert msg.mark.name == "a"


# --- decoding what an app sends (app side) ----------------------------------------------------


def test_decodes_pipecat_style_media_and_clear_from_an_app() -> None:
    payload = base64.b64encode(b"\x7f" * 320).decode()
    media = t.decode_twilio(
        '{"event":"media","streamSid":"MZ1","media":{"payload":"' + payload + '"}}', sender="app"
    )
    assert media == t.TwilioMedia(media=t.MediaPayload(payload=b"\x7f" * 320), stream_sid="MZ1")
    assert t.decode_twilio('{"event":"clear","streamSid":"MZ1"}', sender="app") == t.TwilioClear(
        stream_sid="MZ1"
    )
    mark = t.decode_twilio('{"event":"mark","streamSid":"MZ1","mark":{"name":"x"}}', sender="app")
    assert mark == t.TwilioMark(stream_sid="MZ1", mark=t.TwilioMarkInfo(name="x"))


def test_app_side_ignores_everything_but_media_mark_and_clear() -> None:
    for event in ("connected", "start", "dtmf", "stop"):
        assert t.decode_twilio(FROM_TWILIO[event], sender="app") == t.TwilioIgnored(event)
    # Even malformed messages of ignored events are only ignored.
    assert t.decode_twilio('{"event":"start"}', sender="app") == t.TwilioIgnored("start")


def test_app_media_of_any_length_and_without_stream_sid() -> None:
    media = t.decode_twilio('{"event":"media","media":{"payload":""}}', sender="app")
    assert media == t.TwilioMedia(media=t.MediaPayload(payload=b""))


# --- bad frames never raise -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message_part"),
    [
        ("nope", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        ('{"event":"media","media":{"payload":"a"},', "not valid JSON"),
        ("[]", "expected a JSON object"),
        ("{}", "`event` is missing"),
        ('{"event":7}', "`event` is not a string"),
        ('{"event":"media","media":{"payload":"!!!"}}', "Invalid base64"),
        ('{"event":"media","media":{"payload":"abc"}}', "Invalid base64"),
        ('{"event":"media","media":{}}', "missing required field `payload`"),
        ('{"event":"media"}', "missing required field `media`"),
        ('{"event":"media","media":{"payload":5}}', "$.media.payload"),
        ('{"event":"mark","mark":{}}', "missing required field `name`"),
        ('{"event":"mark","mark":{"name":1}}', "$.mark.name"),
        ('{"event":"clear","streamSid":5}', "$.streamSid"),
    ],
)
def test_bad_app_frames_are_bad_messages(raw: str | bytes, message_part: str) -> None:
    bad = t.decode_twilio(raw, sender="app")
    assert isinstance(bad, t.TwilioBadMessage)
    assert message_part in bad.message


@pytest.mark.parametrize(
    ("raw", "message_part"),
    [
        ('{"event":"start","start":{"streamSid":"MZ","callSid":"CA"}}', "`accountSid`"),
        ('{"event":"start","sequenceNumber":1,"start":{}}', "$.sequenceNumber"),
        ('{"event":"media","sequenceNumber":2,"media":{"payload":""}}', "$.sequenceNumber"),
        ('{"event":"media","media":{"chunk":1,"payload":""}}', "$.media.chunk"),
        ('{"event":"media","media":{"timestamp":null,"payload":"","track":1}}', "$.media.track"),
        ('{"event":"dtmf","dtmf":{"track":"inbound_track"}}', "`digit`"),
        ('{"event":"stop","stop":{"accountSid":"AC"}}', "`callSid`"),
        (
            '{"event":"start","start":{"accountSid":"A","streamSid":"M","callSid":"C",'
            '"mediaFormat":{"sampleRate":"8000"}}}',
            "$.start.mediaFormat.sampleRate",
        ),
    ],
)
def test_bad_twilio_frames_are_bad_messages(raw: str, message_part: str) -> None:
    bad = t.decode_twilio(raw)
    assert isinstance(bad, t.TwilioBadMessage)
    assert message_part in bad.message
    assert bad.message.startswith(json.loads(raw)["event"] + ": ")


def test_frame_size_limit() -> None:
    payload = base64.b64encode(b"\x00" * 780_000).decode()
    raw = '{"event":"media","media":{"payload":"' + payload + '"}}'
    assert len(raw) < t.MAX_TWILIO_FRAME_BYTES
    assert isinstance(t.decode_twilio(raw, sender="app"), t.TwilioMedia)
    big = "x" * (t.MAX_TWILIO_FRAME_BYTES + 1)
    assert t.decode_twilio(big) == t.TwilioBadMessage("text frame is over 1048576 bytes")
    assert isinstance(t.decode_twilio(big.encode(), sender="app"), t.TwilioBadMessage)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from(["twilio", "app"]))
def test_decode_never_raises(raw: bytes, sender: Any) -> None:
    result = t.decode_twilio(raw, sender=sender)
    assert isinstance(
        result,
        (
            t.Connected,
            t.TwilioStart,
            t.TwilioMedia,
            t.TwilioDtmf,
            t.TwilioMark,
            t.TwilioStop,
            t.TwilioClear,
            t.TwilioIgnored,
            t.TwilioBadMessage,
        ),
    )


# --- writing Twilio's role toward an app ------------------------------------------------------


def test_writer_produces_the_reference_messages_in_order() -> None:
    writer = t.TwilioStreamWriter()
    assert json.loads(writer.connected()) == json.loads(FROM_TWILIO["connected"])
    start = writer.start("AC1", "MZ1", "CA1", {"from": "+15550001111"})
    assert json.loads(start) == json.loads(FROM_TWILIO["start"])
    media = json.loads(writer.media(ULAW_20MS))
    assert media == {
        "event": "media",
        "sequenceNumber": "2",
        "media": {
            "track": "inbound",
            "chunk": "1",
            "timestamp": "0",
            "payload": base64.b64encode(ULAW_20MS).decode(),
        },
        "streamSid": "MZ1",
    }
    assert json.loads(writer.dtmf("1")) == {
        "event": "dtmf",
        "streamSid": "MZ1",
        "sequenceNumber": "3",
        "dtmf": {"track": "inbound_track", "digit": "1"},
    }
    assert json.loads(writer.mark("my label")) == {
        "event": "mark",
        "sequenceNumber": "4",
        "streamSid": "MZ1",
        "mark": {"name": "my label"},
    }
    assert json.loads(writer.stop()) == {
        "event": "stop",
        "sequenceNumber": "5",
        "streamSid": "MZ1",
        "stop": {"accountSid": "AC1", "callSid": "CA1"},
    }


def test_counters_are_decimal_strings_counted_exactly() -> None:
    writer = started_writer()
    seen = []
    for _ in range(5):
        msg = json.loads(writer.media(ULAW_20MS))
        seen.append((msg["sequenceNumber"], msg["media"]["chunk"], msg["media"]["timestamp"]))
    assert seen == [
        ("2", "1", "0"),
        ("3", "2", "20"),
        ("4", "3", "40"),
        ("5", "4", "60"),
        ("6", "5", "80"),
    ]
    # A dtmf counts in sequenceNumber but not in chunk or timestamp.
    writer.dtmf("#")
    msg = json.loads(writer.media(ULAW_20MS))
    assert (msg["sequenceNumber"], msg["media"]["chunk"], msg["media"]["timestamp"]) == (
        "8",
        "6",
        "100",
    )
    assert (writer.sequence_number, writer.chunk, writer.elapsed_ms) == (8, 6, 120)


def test_timestamp_follows_audio_length_or_the_given_clock() -> None:
    writer = started_writer()
    writer.media(b"\xff" * 80)  # 10 ms
    assert json.loads(writer.media(ULAW_20MS))["media"]["timestamp"] == "10"
    # After a hold the shell passes the stream's own clock.
    assert json.loads(writer.media(ULAW_20MS, timestamp_ms=5000))["media"]["timestamp"] == "5000"


def test_writer_output_decodes_back() -> None:
    writer = started_writer()
    media = t.decode_twilio(writer.media(ULAW_20MS))
    assert isinstance(media, t.TwilioMedia)
    assert media.media.payload == ULAW_20MS
    assert media.stream_sid == "MZ1"
    stop = t.decode_twilio(writer.stop("AC2", "CA2"))
    assert isinstance(stop, t.TwilioStop)
    assert stop.stop == t.TwilioStopInfo(account_sid="AC2", call_sid="CA2")


def test_custom_parameters_default_to_an_empty_map_and_are_escaped() -> None:
    writer = t.TwilioStreamWriter()
    writer.connected()
    start = json.loads(writer.start("AC1", 'MZ"1', "CA1"))
    assert start["start"]["customParameters"] == {}
    assert start["streamSid"] == 'MZ"1'


def test_writer_refuses_out_of_order_messages() -> None:
    writer = t.TwilioStreamWriter()
    with pytest.raises(t.LocalProtocolError):
        writer.start("AC1", "MZ1", "CA1")
    with pytest.raises(t.LocalProtocolError):
        writer.media(ULAW_20MS)
    writer.connected()
    with pytest.raises(t.LocalProtocolError):
        writer.connected()
    with pytest.raises(t.LocalProtocolError):
        writer.dtmf("1")
    writer.start("AC1", "MZ1", "CA1")
    with pytest.raises(t.LocalProtocolError):
        writer.start("AC1", "MZ1", "CA1")
    writer.stop()
    with pytest.raises(t.LocalProtocolError):
        writer.media(ULAW_20MS)
    with pytest.raises(t.LocalProtocolError):
        writer.stop()


# --- writing the app's role toward Twilio (carrier side) --------------------------------------


def test_app_side_writer_matches_the_reference() -> None:
    w = t.TwilioAppSideWriter()
    assert json.loads(w.media("MZ1", b"\x01\x02\x03")) == {
        "event": "media",
        "media": {"payload": base64.b64encode(b"\x01\x02\x03").decode()},
        "streamSid": "MZ1",
    }
    assert w.mark("MZ1", "x") == b'{"event":"mark","streamSid":"MZ1","mark":{"name":"x"}}'
    assert w.clear("MZ1") == b'{"event":"clear","streamSid":"MZ1"}'


def test_app_side_writer_output_decodes_as_app_messages() -> None:
    w = t.TwilioAppSideWriter
    assert t.decode_twilio(w.media("MZ1", ULAW_20MS), sender="app") == t.TwilioMedia(
        media=t.MediaPayload(payload=ULAW_20MS), stream_sid="MZ1"
    )
    assert t.decode_twilio(w.clear("MZ1"), sender="app") == t.TwilioClear(stream_sid="MZ1")
