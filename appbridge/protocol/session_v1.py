"""The ``fonoster.session.v1`` wire codec (docs/protocol-session-v1.md).

Theory of operation
-------------------
Every text frame on an app link holds one JSON object with a ``type``. Each message type is a
:class:`msgspec.Struct` tagged by that ``type``; the commands an app sends form one tagged union
(:data:`Command`) and the events the gateway sends form another (:data:`Event`). msgspec decodes
and validates a frame against the whole union in one pass, which is what the app link's hot path
needs.

:func:`decode_command` never raises. It answers with a command, :class:`Ignored` for a well-formed
message whose ``type`` this version does not know (docs/protocol-session-v1.md, "Connection and
frames": the protocol only ever adds types, so an app built for a later version must keep working),
or :class:`BadMessage` carrying the text and the ``relatesTo`` of the ``error`` ``bad_message`` the
gateway answers with (docs/protocol-session-v1.md, "Errors for bad input": the command's ``id`` when
it carried one, else its ``type``). Only when the one-pass decode fails does it parse the frame a
second time, generically, to tell those cases apart.

Unknown fields are ignored (``forbid_unknown_fields=False``), optional fields that are absent are
left out on the wire (``omit_defaults=True``), and ``session.start`` always carries every field,
``handoff: null`` included. Sans-I/O: no sockets, no clock.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeAlias, get_args

import msgspec
from msgspec import Meta, Struct, field

from appbridge.protocol.json_bounds import TOO_DEEP, top_level_strings
from appbridge.protocol.limits import utf8_size_over
from appbridge.protocol.session_v1_ext import (
    EXT_COMMAND_TYPES,
    EXT_EVENT_TYPES,
    EventsLost,
    ExtCommand,
    ExtEvent,
    OutputQueueLevel,
    Reconnect,
    SessionUpdate,
)
from appbridge.protocol.session_v1_terms import (
    DTMF_PAUSE_MS,
    END_REASONS,
    ERROR_CODE_MEANINGS,
    ERROR_CODES,
    MAX_BINARY_FRAME_BYTES,
    MAX_HANDOFF_PAYLOAD_BYTES,
    MAX_ID_CHARS,
    MAX_TEXT_FRAME_BYTES,
    OPT_IN_EVENTS,
    PROTOCOL,
    BadMessage,
    Codec,
    Direction,
    DtmfDigit,
    DtmfDigits,
    EndReason,
    ErrorCode,
    Id,
    Ignored,
    NonNegativeMs,
    RateHz,
    Unit,
)

__all__ = [
    "ANY_COMMAND_TYPES",
    "ANY_EVENT_TYPES",
    "COMMAND_TYPES",
    "DTMF_PAUSE_MS",
    "END_REASONS",
    "ERROR_CODES",
    "ERROR_CODE_MEANINGS",
    "EVENT_TYPES",
    "MAX_BINARY_FRAME_BYTES",
    "MAX_HANDOFF_PAYLOAD_BYTES",
    "MAX_ID_CHARS",
    "MAX_TEXT_FRAME_BYTES",
    "OPT_IN_EVENTS",
    "PROTOCOL",
    "AnyCommand",
    "AnyEvent",
    "AudioFormat",
    "BadMessage",
    "Clear",
    "Codec",
    "Command",
    "Direction",
    "DtmfEvent",
    "DtmfSend",
    "EndReason",
    "ErrorCode",
    "ErrorEvent",
    "Event",
    "EventsLost",
    "Handoff",
    "Hangup",
    "Hold",
    "Ignored",
    "ListenUpdate",
    "MarkCommand",
    "MarkEvent",
    "OutputDone",
    "OutputInterrupted",
    "OutputQueueLevel",
    "OutputStarted",
    "Play",
    "RateHz",
    "Reconnect",
    "Resume",
    "SessionEnd",
    "SessionStart",
    "SessionUpdate",
    "Speak",
    "SpeechDefaults",
    "Subscribe",
    "Track",
    "TranscriptPartial",
    "Transfer",
    "TransferComplete",
    "TurnBackchannel",
    "TurnEnded",
    "TurnEstimate",
    "TurnLikelyEnded",
    "TurnResumed",
    "TurnUserStarted",
    "decode_command",
    "decode_event",
    "encode_command",
    "encode_event",
    "encode_json",
    "error_event",
]

# --------------------------------------------------------------------------------------------
# Commands, app -> gateway


class _Command(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every command: tagged by ``type``, unknown fields ignored."""


class Speak(_Command, tag="speak", kw_only=True):
    """Text to speak; ``last: false`` pieces with one ``id`` stream into one utterance."""

    text: str
    id: Id | None = None
    last: bool = True
    voice: str | None = None
    language: str | None = None
    interruptible: bool = True
    preempt: bool = False


class Play(_Command, tag="play", kw_only=True):
    """A WAV file fetched from ``url`` and played into the output queue."""

    url: str
    id: Id | None = None
    loop: bool = False
    interruptible: bool = True
    preempt: bool = False


class MarkCommand(_Command, tag="mark", kw_only=True):
    """A position in the output queue, answered by a ``mark`` event."""

    name: str
    id: Id | None = None


class Clear(_Command, tag="clear", kw_only=True):
    """Empties the output queue; the caller hears silence within 40 ms."""

    id: Id | None = None


class Subscribe(_Command, tag="subscribe", kw_only=True):
    """Turns on opt-in events. Unknown names are kept (a later version may add events)."""

    events: list[str]
    id: Id | None = None


class ListenUpdate(_Command, tag="listen.update", kw_only=True):
    """Changes recognition (language, hints, turn patience) from now on."""

    language: str | None = None
    hints: list[str] | None = None
    patience: Literal["low", "normal", "high"] | None = None
    id: Id | None = None


class Hangup(_Command, tag="hangup", kw_only=True):
    """Ends the call; the session ends with ``app_hangup``."""

    id: Id | None = None


class DtmfSend(_Command, tag="dtmf.send", kw_only=True):
    """Keypresses to send on the call: 0-9, ``*``, ``#``, A-D, and ``,`` for a pause."""

    digits: DtmfDigits
    id: Id | None = None


class Transfer(_Command, tag="transfer", kw_only=True):
    """Hands the caller to another party: ``cold``, ``warm`` or SIP ``refer``."""

    to: str
    mode: Literal["cold", "warm", "refer"] = "cold"
    headers: dict[str, str] | None = None
    music: str | None = None
    id: Id | None = None


class TransferComplete(_Command, tag="transfer.complete", kw_only=True):
    """Leaves a warm transfer; ``id`` names the ``transfer`` command it completes."""

    id: Id


class Hold(_Command, tag="hold", kw_only=True):
    """Puts the caller on hold with looped ``music`` or silence."""

    music: str | None = None
    id: Id | None = None


class Resume(_Command, tag="resume", kw_only=True):
    """Takes the caller off hold."""

    id: Id | None = None


class Handoff(_Command, tag="handoff", kw_only=True):
    """Hands the call to another app, which gets ``payload`` in its ``session.start``."""

    app: str
    payload: Any = None
    id: Id | None = None


Command: TypeAlias = (
    Speak
    | Play
    | MarkCommand
    | Clear
    | Subscribe
    | ListenUpdate
    | Hangup
    | DtmfSend
    | Transfer
    | TransferComplete
    | Hold
    | Resume
    | Handoff
)
COMMAND_TYPES: Final[dict[str, type[Struct]]] = {
    cls.__struct_config__.tag: cls for cls in get_args(Command)
}


# --------------------------------------------------------------------------------------------
# Events, gateway -> app


class _Event(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every event: tagged by ``type``, absent optional fields left out."""


class AudioFormat(Struct, kw_only=True):
    """The session's audio format (``session.start``: pcm16 at 8/16/24 kHz, or pcmu at 8 kHz)."""

    codec: Codec
    rate: RateHz


class Track(Struct, kw_only=True):
    """A track; its ``id`` is the first byte of every binary frame the gateway sends."""

    id: Annotated[int, Meta(ge=0, le=255)]
    side: Direction
    kind: Literal["audio"] = "audio"
    codec: Codec


class SpeechDefaults(Struct, kw_only=True):
    """The app's default voice and language, as catalog ids."""

    voice: str
    language: str


class SessionStart(_Event, tag="session.start", kw_only=True, omit_defaults=False):
    """Always the first message; every field is present, ``handoff`` is ``null`` when none."""

    protocol: Literal["fonoster.session.v1"] = PROTOCOL
    session_ref: str = field(name="sessionRef")
    call_ref: str = field(name="callRef")
    app_ref: str = field(name="appRef")
    direction: Direction
    from_: str = field(name="from")
    to: str
    metadata: dict[str, Any] = field(default_factory=dict)
    handoff: Any = None
    audio: AudioFormat
    tracks: list[Track]
    speech: SpeechDefaults


class SessionEnd(_Event, tag="session.end", kw_only=True):
    """The last message; the gateway then closes the socket."""

    reason: EndReason
    id: Id | None = None


class OutputStarted(_Event, tag="output.started", kw_only=True):
    """The output item began to be heard."""

    id: Id


class OutputDone(_Event, tag="output.done", kw_only=True):
    """The output item was heard completely."""

    id: Id
    heard_ms: NonNegativeMs = field(name="heardMs")


class OutputInterrupted(_Event, tag="output.interrupted", kw_only=True):
    """The output item was cut off; ``heardText`` holds only the words already spoken."""

    id: Id
    heard_text: str = field(name="heardText")
    heard_ms: NonNegativeMs = field(name="heardMs")


class MarkEvent(_Event, tag="mark", kw_only=True):
    """A mark was reached (``cleared: false``) or dropped by ``clear`` (``cleared: true``)."""

    name: str
    cleared: bool
    id: Id | None = None


class DtmfEvent(_Event, tag="dtmf", kw_only=True):
    """A keypress of the caller."""

    digit: DtmfDigit


class ErrorEvent(_Event, tag="error", kw_only=True):
    """A problem; ``relatesTo`` names the command that caused it (``null`` when none did)."""

    code: ErrorCode
    message: str
    fatal: bool
    relates_to: str | None = field(name="relatesTo")


class TurnUserStarted(_Event, tag="turn.user_started", kw_only=True):
    """The caller started talking."""


class TurnLikelyEnded(_Event, tag="turn.likely_ended", kw_only=True):
    """The caller probably finished; a good moment to prepare a reply."""

    text: str


class TurnResumed(_Event, tag="turn.resumed", kw_only=True):
    """The caller kept talking after ``turn.likely_ended``."""


class TurnEnded(_Event, tag="turn.ended", kw_only=True):
    """The turn is over; ``abandoned`` means 10 s passed with no speech."""

    text: str
    language: str
    confidence: Unit
    duration_ms: NonNegativeMs = field(name="durationMs")
    abandoned: bool


class TurnBackchannel(_Event, tag="turn.backchannel", kw_only=True):
    """A short acknowledgment ("uh-huh") that is not a turn."""

    text: str


class TurnEstimate(_Event, tag="turn.estimate", kw_only=True):
    """Opt-in: the detector's end-of-thought estimate, at most every 100 ms."""

    eot: Unit
    speaking: bool
    kind: str


class TranscriptPartial(_Event, tag="transcript.partial", kw_only=True):
    """Opt-in: an interim transcript."""

    text: str
    language: str


Event: TypeAlias = (
    SessionStart
    | SessionEnd
    | OutputStarted
    | OutputDone
    | OutputInterrupted
    | MarkEvent
    | DtmfEvent
    | ErrorEvent
    | TurnUserStarted
    | TurnLikelyEnded
    | TurnResumed
    | TurnEnded
    | TurnBackchannel
    | TurnEstimate
    | TranscriptPartial
)
EVENT_TYPES: Final[dict[str, type[Struct]]] = {
    cls.__struct_config__.tag: cls for cls in get_args(Event)
}


#: The extensions (``protocol/session_v1_ext.py``) decode in the same pass as the core messages;
#: :data:`COMMAND_TYPES` and :data:`EVENT_TYPES` stay the core protocol's.
AnyCommand: TypeAlias = Command | ExtCommand
AnyEvent: TypeAlias = Event | ExtEvent
ANY_COMMAND_TYPES: Final[dict[str, type[Struct]]] = {**COMMAND_TYPES, **EXT_COMMAND_TYPES}
ANY_EVENT_TYPES: Final[dict[str, type[Struct]]] = {**EVENT_TYPES, **EXT_EVENT_TYPES}


# --------------------------------------------------------------------------------------------
# Codec

_command_decoder: Final = msgspec.json.Decoder(AnyCommand)
_event_decoder: Final = msgspec.json.Decoder(AnyEvent)
_any_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()

_UNKNOWN: Final = "unknown"


def _frame_too_large(frame: bytes | str) -> bool:
    return utf8_size_over(frame, MAX_TEXT_FRAME_BYTES)


def _relates_to(obj: dict[str, Any], fallback: str) -> str:
    """The command's ``id`` when it carried a valid one, else ``fallback``.

    An id over 128 characters broke the limit, so it is not echoed: the gateway never sends
    back unbounded text it refused.
    """
    msg_id = obj.get("id")
    if isinstance(msg_id, str) and len(msg_id) <= MAX_ID_CHARS:
        return msg_id
    return fallback


class _Envelope(Struct):
    """Only what ``relatesTo`` needs; every other field is skipped unparsed."""

    type: Any = None
    id: Any = None


_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)


def _oversized_relates_to(frame: bytes | str) -> str:
    """``relatesTo`` of a frame refused for its size (the link bounds it at a few MiB)."""
    try:
        env = _envelope_decoder.decode(frame)
    except msgspec.MsgspecError:
        return _UNKNOWN
    if isinstance(env.id, str) and len(env.id) <= MAX_ID_CHARS:
        return env.id
    return env.type if isinstance(env.type, str) and env.type in ANY_COMMAND_TYPES else _UNKNOWN


def _classify_failure(
    frame: bytes | str, error: Exception, known: dict[str, type[Struct]]
) -> Ignored | BadMessage:
    """The slow path, taken only when the one-pass decode failed."""
    if isinstance(error, RecursionError):
        return _too_deep(frame, known)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return BadMessage(f"not valid JSON: {error}", _UNKNOWN)
    try:
        obj = _any_decoder.decode(frame)
    except RecursionError:
        return _too_deep(frame, known)
    except msgspec.MsgspecError as exc:
        # The typed pass stops at the first invalid value, before any later syntax error.
        return BadMessage(f"not valid JSON: {exc}", _UNKNOWN)
    if not isinstance(obj, dict):
        return BadMessage(f"expected a JSON object, got {type(obj).__name__}", _UNKNOWN)
    msg_type = obj.get("type")
    if not isinstance(msg_type, str):
        what = "missing" if msg_type is None and "type" not in obj else "not a string"
        return BadMessage(f"`type` is {what}", _relates_to(obj, _UNKNOWN))
    if msg_type not in known:
        return Ignored(msg_type)
    return BadMessage(f"{msg_type}: {error}", _relates_to(obj, msg_type))


def _too_deep(frame: bytes | str, known: dict[str, type[Struct]]) -> Ignored | BadMessage:
    """A message nested too deeply to decode (``protocol/json_bounds.py``): ``bad_message``,
    related to its ``id`` or ``type`` when its top level names them; a type this version does
    not know is ignored, however it is shaped."""
    fields = top_level_strings(frame, ("type", "id"))
    msg_type = fields.get("type")
    if msg_type is None:
        return BadMessage(TOO_DEEP, _relates_to(fields, _UNKNOWN))
    if msg_type not in known:
        return Ignored(msg_type)
    return BadMessage(f"{msg_type}: {TOO_DEEP}", _relates_to(fields, msg_type))


def decode_command(frame: bytes | str) -> AnyCommand | Ignored | BadMessage:
    """Decodes one text frame from an app; never raises.

    Known types are decoded and validated in one pass by a tagged-union decoder; the frame is
    parsed again only when that fails, to compute ``relatesTo`` or to recognise an unknown type.
    """
    if _frame_too_large(frame):
        return BadMessage(
            f"text frame is over {MAX_TEXT_FRAME_BYTES} bytes", _oversized_relates_to(frame)
        )
    try:
        command = _command_decoder.decode(frame)
    except (msgspec.MsgspecError, RecursionError) as exc:
        return _classify_failure(frame, exc, ANY_COMMAND_TYPES)
    if type(command) is Handoff and command.payload is not None:
        size_bytes = len(_encoder.encode(command.payload))
        if size_bytes > MAX_HANDOFF_PAYLOAD_BYTES:
            return BadMessage(
                f"handoff: payload is {size_bytes} bytes, over {MAX_HANDOFF_PAYLOAD_BYTES}",
                command.id if command.id is not None else "handoff",
            )
    return command


def decode_event(frame: bytes | str) -> AnyEvent | Ignored | BadMessage:
    """Decodes one text frame from the gateway, for SDKs, test apps and listeners.

    Follows :func:`decode_command`'s rules, without its size limit (the app's side decides).
    """
    try:
        return _event_decoder.decode(frame)
    except (msgspec.MsgspecError, RecursionError) as exc:
        return _classify_failure(frame, exc, ANY_EVENT_TYPES)


def encode_event(event: AnyEvent) -> bytes:
    """Encodes one event as a compact JSON text frame."""
    return _encoder.encode(event)


def encode_command(command: AnyCommand) -> bytes:
    """Encodes one command as a compact JSON text frame (for SDKs and test apps)."""
    return _encoder.encode(command)


def error_event(
    code: ErrorCode, message: str, relates_to: str | None, *, fatal: bool = False
) -> bytes:
    """Encodes an ``error`` event. No error is fatal in this version (docs/protocol-session-v1.md,
    "Errors")."""
    return _encoder.encode(
        ErrorEvent(code=code, message=message, fatal=fatal, relates_to=relates_to)
    )


def encode_json(value: Any) -> bytes:
    """Any JSON value, compactly (metadata values passed on as Twilio custom parameters)."""
    return _encoder.encode(value)
