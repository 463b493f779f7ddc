"""The vocabulary of ``fonoster.session.v1``: its limits, end reasons and error codes, and what
a frame that is no message decodes to (docs/protocol-session-v1.md, "Limits", "Errors").

The message types (``protocol/session_v1.py``) are built from these; SDKs, schemas and the
gateway read them from there.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias, get_args

from msgspec import Meta, Struct

PROTOCOL: Final = "fonoster.session.v1"

MAX_ID_CHARS: Final = 128
"""Commands may carry an ``id``, any string up to 128 characters (docs/protocol-session-v1.md,
"Limits")."""

MAX_TEXT_FRAME_BYTES: Final = 65536
"""Largest JSON text frame accepted from an app (64 KiB; docs/protocol-session-v1.md, "Limits")."""

MAX_BINARY_FRAME_BYTES: Final = 1 << 20
"""Largest binary audio frame accepted from an app (1 MiB, about 33 s of pcm16 at 16 kHz)."""

MAX_HANDOFF_PAYLOAD_BYTES: Final = 16384
"""docs/protocol-session-v1.md, "Limits": a ``handoff`` payload is JSON of at most 16 KiB,
measured as its compact JSON encoding."""

DTMF_PAUSE_MS: Final = 500
"""A ``,`` in ``dtmf.send`` digits is a pause of this length (the usual dialler convention)."""

Id = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
# ``(?!\n)$``: Python's ``$`` also matches before a final newline, ECMA-262's does not; the
# lookahead makes the code (Python ``re``) and JSON Schema validators agree on "end of string".
DtmfDigits = Annotated[str, Meta(pattern=r"^[0-9*#A-D,]+(?!\n)$")]
DtmfDigit = Annotated[str, Meta(pattern=r"^[0-9*#A-D](?!\n)$")]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
NonNegativeMs = Annotated[int, Meta(ge=0)]

Codec: TypeAlias = Literal["pcm16", "pcmu"]
RateHz: TypeAlias = Literal[8000, 16000, 24000]
Direction: TypeAlias = Literal["inbound", "outbound"]

EndReason: TypeAlias = Literal[
    "caller_hangup", "app_hangup", "transfer", "handoff", "error", "timeout"
]
END_REASONS: Final[frozenset[str]] = frozenset(get_args(EndReason))

ErrorCode: TypeAlias = Literal[
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
]
ERROR_CODE_MEANINGS: Final[dict[str, str]] = {
    "bad_message": "Unparseable JSON, a missing required field, or a limit exceeded",
    "read_only": "A listen-only socket sent a command",
    "provider_unavailable": "The speech or language provider failed",
    "provider_timeout": "The provider did not answer in time",
    "invalid_catalog_id": "A voice or language id is not in the catalog",
    "feature_not_supported": "The provider cannot do what was asked",
    "transfer_failed": "The transfer target could not be reached",
    "on_hold": "The command is not allowed while the caller is on hold",
    "queue_full": "More than 120 s of output is queued",
    "play_fetch_failed": "The media could not be fetched",
    "internal": "Anything else",
}
ERROR_CODES: Final[frozenset[str]] = frozenset(get_args(ErrorCode))

OPT_IN_EVENTS: Final[frozenset[str]] = frozenset({"turn.estimate", "transcript.partial"})
"""docs/protocol-session-v1.md, ``subscribe``: the events an app receives only after subscribing to
them."""


# Decode results that are not messages


class Ignored(Struct, frozen=True):
    """A well-formed message of a type this version does not know; the gateway drops it."""

    type: str


class BadMessage(Struct, frozen=True):
    """A frame the gateway answers with ``error`` ``bad_message``.

    ``relates_to`` is the ``relatesTo`` of that error (docs/protocol-session-v1.md, "Errors for
    bad input"): the command's ``id`` when it carried a valid one, else its ``type``, else
    ``"unknown"``.
    """

    message: str
    relates_to: str
