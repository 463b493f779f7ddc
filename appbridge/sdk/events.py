"""What ``async for event in session`` yields, and what the awaitable commands return.

The events are the typed Structs of :mod:`appbridge.protocol.session_v1`
(docs/protocol-session-v1.md names them; the codec decodes and validates them), so an app matches on
classes::

    async for event in session:
        match event:
            case DtmfEvent(digit=digit): ...
            case TurnEnded(text=text): ...
            case AudioFrame(data=pcm): ...

Binary frames become :class:`AudioFrame` (docs/protocol-session-v1.md, "Connection and frames"):
every frame from the gateway starts with one byte holding the track id, then audio in the session's
format; the app's own socket carries the caller's (inbound) track only (``session.start``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from appbridge.protocol.session_v1 import (
    DtmfEvent,
    ErrorEvent,
    EventsLost,
    MarkEvent,
    OutputDone,
    OutputInterrupted,
    OutputQueueLevel,
    OutputStarted,
    SessionEnd,
    SessionStart,
    TranscriptPartial,
    TurnBackchannel,
    TurnEnded,
    TurnEstimate,
    TurnLikelyEnded,
    TurnResumed,
    TurnUserStarted,
)

__all__ = [
    "AudioFrame",
    "DtmfEvent",
    "ErrorEvent",
    "Event",
    "EventsLost",
    "GatherResult",
    "MarkEvent",
    "OutputDone",
    "OutputInterrupted",
    "OutputQueueLevel",
    "OutputResult",
    "OutputStarted",
    "Resumed",
    "SessionEnd",
    "SessionStart",
    "TranscriptPartial",
    "TurnBackchannel",
    "TurnEnded",
    "TurnEstimate",
    "TurnLikelyEnded",
    "TurnResumed",
    "TurnUserStarted",
]


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """One binary frame from the gateway: ``data`` is audio in the session's format
    (``session.audio``), without the track byte; 20 ms per frame for the caller's track."""

    track_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Resumed:
    """SDK-made: the session moved onto a new link after its old one was lost
    (docs/protocol-session-v1.md, "Reconnecting"; docs/sdk.md, "Reconnecting"). ``attempt`` and
    ``down_ms`` are the gateway's ``reconnect`` field; ``restored`` is True when this process did
    not know the session (it restarted) and the resume hook took it back. The gateway's
    ``events.lost`` follows."""

    attempt: int
    down_ms: int
    restored: bool = False


Event: TypeAlias = (
    SessionEnd
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
    | EventsLost
    | OutputQueueLevel
    | Resumed
    | AudioFrame
)
"""Everything the session iterator yields (``session.start`` is ``session.start`` instead)."""


@dataclass(frozen=True, slots=True)
class OutputResult:
    """How a ``say``/``play`` item ended (docs/protocol-session-v1.md, "Output events").

    ``interrupted`` items were cut off by caller barge-in, ``clear`` or a ``preempt`` item;
    ``heard_text`` holds only the words already spoken, and an item dropped before it started
    reports ``heard_ms == 0``.
    """

    id: str
    status: Literal["done", "interrupted"]
    heard_ms: int
    heard_text: str = ""

    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    @property
    def done(self) -> bool:
        return self.status == "done"


@dataclass(frozen=True, slots=True)
class GatherResult:
    """The caller's answer to :meth:`Session.gather`.

    - ``kind == "speech"``: their next turn; ``text`` is what they said, ``turn`` the whole
      ``turn.ended`` event (language, confidence, duration).
    - ``kind == "dtmf"``: ``digits`` up to the terminator (not included; ``terminator`` says which
      key ended it) or the count, or what was pressed before the digit timeout.
    - ``kind == "timeout"``: nothing arrived in time.
    """

    kind: Literal["speech", "dtmf", "timeout"]
    text: str = ""
    digits: str = ""
    terminator: str | None = None
    turn: TurnEnded | None = None

    @property
    def timed_out(self) -> bool:
        return self.kind == "timeout"
