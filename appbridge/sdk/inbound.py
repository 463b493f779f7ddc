"""Frames from the gateway, decoded for a session: typed events, audio frames, or nothing.

docs/protocol-session-v1.md, "Connection and frames": text frames carry one JSON message with a
``type``; binary frames carry one byte of track id, then audio. Unknown types and unknown fields are
ignored, because the protocol only ever adds them. A frame that does not decode (not JSON, a known
type with a wrong field, an empty binary frame) is logged and dropped: the app's handler never sees
garbage.

Two events are read leniently, because dropping them would lose something an app cannot do
without: an ``error`` whose ``code`` this version does not know still fails the command it
relates to (as a plain ``CommandError``), and a ``session.end`` with an unknown ``reason`` still
ends the session.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import msgspec

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk.events import AudioFrame, Event

__all__ = ["decode_frame"]

log = logging.getLogger("appbridge.sdk")


class _LenientError(msgspec.Struct):
    code: str
    message: str = ""
    fatal: bool = False
    relatesTo: str | None = None  # the wire name


class _LenientEnd(msgspec.Struct):
    reason: str
    id: str | None = None


def decode_frame(frame: str | bytes) -> Event | sv1.SessionStart | None:
    """The event in ``frame``, or ``None`` when it is to be ignored (and was logged if bad)."""
    if isinstance(frame, bytes):
        if not frame:
            log.warning("dropped an empty binary frame from the gateway")
            return None
        return AudioFrame(frame[0], frame[1:])
    result = sv1.decode_event(frame)
    if isinstance(result, sv1.Ignored):
        log.debug("ignored a message of unknown type %r", result.type)
        return None
    if isinstance(result, sv1.BadMessage):
        lenient = _lenient(frame)
        if lenient is None:
            log.warning("dropped a malformed message from the gateway: %s", result.message)
        return lenient
    return cast(Event | sv1.SessionStart, result)


def _lenient(frame: str) -> Event | None:
    try:
        envelope = msgspec.json.decode(frame)
    except msgspec.DecodeError:
        return None
    if not isinstance(envelope, dict):
        return None
    kind = envelope.get("type")
    try:
        if kind == "error":
            err = msgspec.convert(envelope, _LenientError)
            return sv1.ErrorEvent(
                code=cast(Any, err.code),
                message=err.message,
                fatal=err.fatal,
                relates_to=err.relatesTo,
            )
        if kind == "session.end":
            end = msgspec.convert(envelope, _LenientEnd)
            return sv1.SessionEnd(reason=cast(Any, end.reason), id=end.id)
    except msgspec.ValidationError:
        return None
    return None
