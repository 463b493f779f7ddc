"""Generates ``schema/session.v1.json``, the machine-readable ``fonoster.session.v1``.

The protocol has a JSON Schema with one definition per message (docs/protocol-session-v1.md, "The
schema file"). Writing it by hand would let it drift from the codec, so it is generated from the
Structs of :mod:`appbridge.protocol.session_v1` (``msgspec.json.schema_components``) and
post-processed into a tidy draft 2020-12 document: one ``$defs`` entry per message titled by its
wire ``type``, with the protocol's descriptions, a ``oneOf`` of commands (``#/$defs/Command``) and
one of events (``#/$defs/Event``). The top level is an ``anyOf`` of the two, because ``mark`` is
both a command and an event and a ``mark`` event is also a valid ``mark`` command.

``python -m appbridge.protocol.schema_gen`` writes the file; ``--check`` exits 1 when the
committed file differs from what the code generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final, get_args

import msgspec

from appbridge.protocol import session_v1 as s
from appbridge.protocol import session_v1_ext as ext

__all__ = ["DEFAULT_PATH", "build_schema", "main", "render_schema"]

DEFAULT_PATH: Final = Path(__file__).resolve().parents[2] / "schema" / "session.v1.json"

_ID = "Any string up to 128 characters. Every event the command causes echoes it."

_MESSAGE_DOCS: Final[dict[type[msgspec.Struct], tuple[str, dict[str, str]]]] = {
    # Commands, app -> gateway.
    s.Speak: (
        "Speaks text through the output queue.",
        {
            "text": "Text to speak (may be empty on the last piece).",
            "id": _ID + " The gateway assigns one when it is left out.",
            "last": "Several speak with one id and last: false stream text into one continuous "
            "utterance; the piece with last: true ends it.",
            "voice": "Catalog voice id overriding the app's default for this item.",
            "language": "Catalog language id overriding the app's default for this item.",
            "interruptible": "A hint for the app: the gateway never stops output on caller "
            "speech; the SDKs send clear when the caller talks over an interruptible item.",
            "preempt": "Stop what is playing and play this first.",
        },
    ),
    s.Play: (
        "Plays a WAV file (PCM or µ-law, any rate), converted to the call's format.",
        {
            "url": "The file; one that cannot be fetched produces error play_fetch_failed.",
            "id": _ID,
            "loop": "Play the file again until it is cleared.",
            "interruptible": "As in speak.",
            "preempt": "Stop what is playing and play this first.",
        },
    ),
    s.MarkCommand: (
        "Marks a position in the output queue; answered by a mark event.",
        {"name": "Echoed in the mark event.", "id": _ID},
    ),
    s.Clear: (
        "Empties the whole output queue; the caller hears silence within 40 ms.",
        {"id": _ID},
    ),
    s.Subscribe: (
        "Turns on opt-in events.",
        {"events": "Event types to turn on: turn.estimate, transcript.partial.", "id": _ID},
    ),
    s.ListenUpdate: (
        "Changes recognition from now on.",
        {
            "language": "Catalog language id to recognise.",
            "hints": "Words and names recognition should expect.",
            "patience": "How long the turn detector waits for more speech before turn.ended.",
            "id": _ID,
        },
    ),
    s.Hangup: ("Ends the call: session.end with app_hangup.", {"id": _ID}),
    s.DtmfSend: (
        "Sends keypresses on the call.",
        {"digits": "Keys 0-9, *, #, A-D; a comma is a 500 ms pause.", "id": _ID},
    ),
    s.Transfer: (
        "Transfers the caller. Cold: the new party joins and the session ends with transfer. "
        "Warm: the caller waits on hold while the app talks to the new party; "
        "transfer.complete connects them (no answer in 30 s: error transfer_failed). "
        "Refer: SIP REFER, the session ends.",
        {
            "to": "An E.164 number, or a sip: URI whose host is a configured trunk's.",
            "mode": "cold (default), warm or refer.",
            "headers": "SIP headers to add to the new call.",
            "music": "URL of what the caller hears while waiting.",
            "id": _ID,
        },
    ),
    s.TransferComplete: (
        "Leaves a warm transfer: connects the caller and the new party, ending the session.",
        {"id": "The id of the warm transfer."},
    ),
    s.Hold: (
        "Puts the caller on hold: they hear music (looped) or silence; the app gets no caller "
        "audio and no turn events, keypresses still arrive, and every command except resume, "
        "hangup, transfer and handoff gets error on_hold.",
        {"music": "URL of the music; silence when absent.", "id": _ID},
    ),
    s.Resume: ("Takes the caller off hold.", {"id": _ID}),
    s.Handoff: (
        "Hands the call to another app: session.end with handoff here, session.start with the "
        "payload there. At most 5 handoffs per call.",
        {
            "app": "The appRef of the app that takes the call.",
            "payload": "Any JSON, 16 KiB at most, delivered as handoff in session.start.",
            "id": _ID,
        },
    ),
    # Events, gateway -> app.
    s.SessionStart: (
        "Always the first message. Inbound calls are answered as soon as it is sent; outbound "
        "calls open their session when the callee answers.",
        {
            "protocol": "The protocol name.",
            "sessionRef": "A fresh UUID per app session (a handoff opens a new one).",
            "callRef": "The carrier's call id.",
            "appRef": "The app's configured ref.",
            "direction": "inbound or outbound.",
            "from": "The caller.",
            "to": "The called number.",
            "metadata": "The metadata of the outbound call request; {} otherwise.",
            "handoff": "The payload when another app handed the call over; null when none.",
            "audio": "The format of every binary audio frame, both ways.",
            "tracks": "Binary frames from the gateway start with one byte holding a track id.",
            "speech": "The app's default voice and language.",
        },
    ),
    s.SessionEnd: (
        "The last message; the gateway then closes the socket.",
        {"reason": "Why the session ended.", "id": "The id of the command that ended it."},
    ),
    s.OutputStarted: ("The item began to be heard.", {"id": "The item's id."}),
    s.OutputDone: (
        "The item was heard completely.",
        {"id": "The item's id.", "heardMs": "Milliseconds heard."},
    ),
    s.OutputInterrupted: (
        "The item was cut off (clear or preempt). Items dropped before they started report "
        "heardMs: 0.",
        {
            "id": "The item's id.",
            "heardText": "Only the words already spoken.",
            "heardMs": "Milliseconds heard.",
        },
    ),
    s.MarkEvent: (
        "Answers a mark command.",
        {
            "name": "The mark's name.",
            "cleared": "false: everything queued before it was heard; true: clear dropped it.",
            "id": "The mark command's id.",
        },
    ),
    s.DtmfEvent: ("A keypress of the caller.", {"digit": "0-9, *, #, or A-D."}),
    s.ErrorEvent: (
        "A problem. A session that cannot continue ends with session.end.",
        {
            "code": "; ".join(f"{c}: {m}" for c, m in s.ERROR_CODE_MEANINGS.items()) + ".",
            "message": "Human-readable detail.",
            "fatal": "No error is fatal on its own in this version.",
            "relatesTo": "The command's id when it carried one, else its type; null when no "
            "command caused the error.",
        },
    ),
    s.TurnUserStarted: ("The caller started talking.", {}),
    s.TurnLikelyEnded: (
        "The caller probably finished; a good moment to start preparing a reply.",
        {"text": "What was heard so far."},
    ),
    s.TurnResumed: ("The caller kept talking after turn.likely_ended.", {}),
    s.TurnEnded: (
        "The turn is over; reply now.",
        {
            "text": "What the caller said (empty when abandoned).",
            "language": "The recognised language.",
            "confidence": "Recognition confidence, 0 to 1.",
            "durationMs": "How long the turn lasted.",
            "abandoned": "10 s passed with no speech after turn.user_started.",
        },
    ),
    s.TurnBackchannel: (
        'A short acknowledgment ("uh-huh") that is not a turn.',
        {"text": "What was heard."},
    ),
    s.TurnEstimate: (
        "Opt-in: the turn detector's estimate, at most every 100 ms.",
        {
            "eot": "End-of-thought estimate, 0 to 1.",
            "speaking": "Whether the caller is speaking now.",
            "kind": "Which detector stage produced the estimate.",
        },
    ),
    s.TranscriptPartial: (
        "Opt-in: an interim transcript.",
        {"text": "The transcript so far.", "language": "The recognised language."},
    ),
    # Parts of session.start.
    s.AudioFormat: (
        "pcm16 at 8000, 16000 or 24000 Hz, or pcmu at 8000 Hz.",
        {"codec": "The codec.", "rate": "Samples per second."},
    ),
    s.Track: (
        "A track of binary frames from the gateway.",
        {
            "id": "The first byte of every binary frame of this track.",
            "side": "inbound: the caller; outbound: what the caller hears.",
            "kind": "Always audio.",
            "codec": "The codec of the track's frames.",
        },
    ),
    s.SpeechDefaults: (
        "Catalog ids used when a command names none.",
        {"voice": "provider/voice catalog id.", "language": "BCP-47 language tag."},
    ),
    **ext.EXT_MESSAGE_DOCS,
}


def _tidy(cls: type[msgspec.Struct], schema: dict[str, Any]) -> dict[str, Any]:
    """Titles a message by its wire type and adds the protocol's words to it and its fields."""
    config = cls.__struct_config__
    description, field_docs = _MESSAGE_DOCS[cls]
    properties: dict[str, Any] = schema.get("properties", {})
    tidy: dict[str, Any] = {
        "title": config.tag if isinstance(config.tag, str) else cls.__name__,
        "description": description,
        "type": "object",
        "properties": {},
    }
    for name, prop in properties.items():
        if name == config.tag_field:
            prop = {"const": config.tag}
        elif isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
            prop = {"const": prop["enum"][0], **{k: v for k, v in prop.items() if k != "enum"}}
        elif name in field_docs:
            prop = {"description": field_docs[name], **prop}
        tidy["properties"][name] = prop
    if not config.omit_defaults:
        # These are written with every field, so a consumer may rely on each one.
        tidy["required"] = list(properties)
    elif schema.get("required"):
        tidy["required"] = schema["required"]
    return tidy


def build_schema() -> dict[str, Any]:
    """The whole document as a dict."""
    commands = list(get_args(s.Command))
    events = list(get_args(s.Event))
    ext_commands = list(get_args(ext.ExtCommand)) or [ext.ExtCommand]
    ext_events = list(get_args(ext.ExtEvent))
    _, components = msgspec.json.schema_components(
        [s.Command, s.Event, ext.ExtCommand, ext.ExtEvent, ext.Reconnect],
        ref_template="#/$defs/{name}",
    )
    by_name = {cls.__name__: cls for cls in _MESSAGE_DOCS}
    missing = set(components) - set(by_name)
    if missing:
        raise RuntimeError(f"no docs for {sorted(missing)}")
    listed = commands + events + ext_commands + ext_events
    ordered = listed + [by_name[n] for n in components if by_name[n] not in listed]
    defs: dict[str, Any] = {
        "Command": {
            "title": "Command",
            "description": "A message from the app to the gateway. A message of another type "
            "is ignored: the protocol only ever adds types.",
            "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in commands],
        },
        "Event": {
            "title": "Event",
            "description": "A message from the gateway to the app. Apps ignore types they do "
            "not know.",
            "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in events],
        },
        "ExtensionCommand": {
            "title": "ExtensionCommand",
            "description": "Optional extensions within version 1, from the app "
            "(docs/protocol-session-v1.md, Reconnecting).",
            "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in ext_commands],
        },
        "ExtensionEvent": {
            "title": "ExtensionEvent",
            "description": "Optional extensions within version 1, from the gateway: sent only "
            "to an app that asked for them (docs/protocol-session-v1.md, Reconnecting, Queue "
            "level). A session.start that redials a lost link also carries reconnect "
            "(#/$defs/Reconnect).",
            "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in ext_events],
        },
    }
    for cls in ordered:
        defs[cls.__name__] = _tidy(cls, components[cls.__name__])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:appbridge:schema:session.v1",
        "title": s.PROTOCOL,
        "description": "The session protocol between AppBridge and an app: JSON text frames, "
        "each an object with a type. Unknown fields are ignored. Limits the schema cannot "
        "express: text frames of at most 65536 bytes, handoff payloads of at most 16384 bytes. "
        "Generated by appbridge.protocol.schema_gen; do not edit.",
        "anyOf": [
            {"$ref": "#/$defs/Command"},
            {"$ref": "#/$defs/Event"},
            {"$ref": "#/$defs/ExtensionCommand"},
            {"$ref": "#/$defs/ExtensionEvent"},
        ],
        "$defs": defs,
    }


def render_schema() -> str:
    """The document as the committed file's text."""
    return json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m appbridge.protocol.schema_gen", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    parser.add_argument("--output", type=Path, default=DEFAULT_PATH, help="the schema file")
    args = parser.parse_args(argv)
    path: Path = args.output
    text = render_schema()
    if args.check:
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            print(
                f"{path} is out of date; run python -m appbridge.protocol.schema_gen",
                file=sys.stderr,
            )
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
