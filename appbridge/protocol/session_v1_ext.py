"""Optional extensions of ``fonoster.session.v1``: reconnecting app links and the queue level.

docs/protocol-session-v1.md, "Reconnecting" and "Queue level": both are additions within
version 1, so an app that never asks for them sees nothing new. Their messages live here, apart
from the core protocol's, and :mod:`appbridge.protocol.session_v1` decodes them in the same one
pass as every other message (:data:`ExtCommand` and :data:`ExtEvent` join its unions).

The ``reconnect`` field of ``session.start`` is absent on every normal start, while the rest of
``session.start`` always carries every field; so it is not a field of that Struct but spliced
into the encoded frame (:func:`with_reconnect`) and read back by :func:`reconnect_of`.
Sans-I/O: no sockets, no clock.
"""

from __future__ import annotations

from typing import Annotated, Final, TypeAlias, get_args

import msgspec
from msgspec import Meta, Struct, field

from appbridge.protocol.session_v1_terms import Id, NonNegativeMs

__all__ = [
    "EXT_COMMAND_TYPES",
    "EXT_EVENT_TYPES",
    "EXT_MESSAGE_DOCS",
    "OUTPUT_QUEUE",
    "EventsLost",
    "ExtCommand",
    "ExtEvent",
    "OutputQueueLevel",
    "Reconnect",
    "SessionUpdate",
    "reconnect_of",
    "with_reconnect",
]

#: The opt-in event name of the queue level (``subscribe``).
OUTPUT_QUEUE: Final = "output.queue"


class SessionUpdate(
    Struct, tag_field="type", tag="session.update", kw_only=True, omit_defaults=True
):
    """Turns reconnecting on or off; also the app's answer that takes a session back."""

    reconnect: bool
    id: Id | None = None


class EventsLost(Struct, tag_field="type", tag="events.lost", kw_only=True, omit_defaults=True):
    """After a take-back: how many events the gateway could not deliver while between links."""

    count: NonNegativeMs


class OutputQueueLevel(
    Struct, tag_field="type", tag="output.queue", kw_only=True, omit_defaults=True
):
    """Opt-in: how much audio waits to be heard, synthesised or not yet."""

    queued_ms: NonNegativeMs = field(name="queuedMs")


class Reconnect(Struct, kw_only=True):
    """The ``reconnect`` field of a ``session.start`` that redials a lost app link."""

    attempt: Annotated[int, Meta(ge=1)]
    down_ms: NonNegativeMs = field(name="downMs")


ExtCommand: TypeAlias = SessionUpdate
ExtEvent: TypeAlias = EventsLost | OutputQueueLevel

EXT_COMMAND_TYPES: Final[dict[str, type[Struct]]] = {
    SessionUpdate.__struct_config__.tag: SessionUpdate  # type: ignore[dict-item]
}
EXT_EVENT_TYPES: Final[dict[str, type[Struct]]] = {
    cls.__struct_config__.tag: cls for cls in get_args(ExtEvent)
}

_encoder: Final = msgspec.json.Encoder()


class _StartEnvelope(Struct):
    """Only the ``reconnect`` field of a ``session.start``; the rest is skipped unparsed."""

    reconnect: Reconnect | None = None


_start_decoder: Final = msgspec.json.Decoder(_StartEnvelope)


def with_reconnect(encoded_start: bytes, info: Reconnect) -> bytes:
    """An encoded ``session.start`` (a JSON object) with the ``reconnect`` field added last."""
    if not encoded_start.endswith(b"}"):
        raise ValueError("not an encoded JSON object")
    return encoded_start[:-1] + b',"reconnect":' + _encoder.encode(info) + b"}"


def reconnect_of(frame: bytes | str) -> Reconnect | None:
    """The ``reconnect`` field of a ``session.start`` frame; ``None`` when absent or invalid."""
    try:
        return _start_decoder.decode(frame).reconnect
    except msgspec.MsgspecError:
        return None


#: What the schema says of each extension message and field (``protocol/schema_gen.py``).
EXT_MESSAGE_DOCS: Final[dict[type[Struct], tuple[str, dict[str, str]]]] = {
    SessionUpdate: (
        "Extension (Reconnecting): turns reconnecting on or off; after a reconnect, "
        "sending it with reconnect: true within 2 s takes the session back.",
        {
            "reconnect": "true: keep the call going when this app's link is lost, and redial.",
            "id": "Any string up to 128 characters.",
        },
    ),
    EventsLost: (
        "Extension (Reconnecting): sent once a session was taken back.",
        {"count": "Events that could not be delivered between links (audio frames excluded)."},
    ),
    OutputQueueLevel: (
        "Extension (Queue level), opt-in: the output queue's length changed by 200 ms or "
        "more, or became 0; at most every 100 ms.",
        {"queuedMs": "Audio waiting to be heard; a speak counts by its synthesised part."},
    ),
    Reconnect: (
        "Extension (Reconnecting): present on a session.start that redials a lost link.",
        {
            "attempt": "1 for the first attempt of a series, at most 5.",
            "downMs": "Milliseconds since the link was lost.",
        },
    ),
}
