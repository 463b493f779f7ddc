"""What the call core (``calls/core.py``) asks its shell to do.

The core decides; it never sends, spawns, fetches or synthesises. Each of its inputs returns a
list of these effects, in the order they must happen, and the shell (``calls/commands.py``)
carries them out. Every effect is a plain value, so a unit test reads the core's decisions off
the list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appbridge.protocol import session_v1 as sv1
from appbridge.speech.base import TtsProvider, VoiceInfo


@dataclass(frozen=True, slots=True)
class SendEvent:
    """An event to the app and its listeners (docs/protocol-session-v1.md)."""

    event: Any


@dataclass(frozen=True, slots=True)
class SendError:
    """``error`` to the app, ``relatesTo`` the command's id or type (docs/protocol-session-v1.md,
    "Errors")."""

    code: str
    message: str
    relates_to: str


@dataclass(frozen=True, slots=True)
class OpenSession:
    """The carrier's media is here and the app was reached: ``session.start`` goes out."""

    handoff: Any = None


@dataclass(frozen=True, slots=True)
class ReportBadMessage:
    """A Twilio-dialect app sent something malformed: that dialect has no error message, so it
    is counted and logged (docs/protocol-twilio.md)."""

    message: str


@dataclass(frozen=True, slots=True)
class EndCall:
    """The call ends: ``hangup``, a fallback message that is over or failed, or the carrier's
    side gone (``carrier_gone``: nothing left to hang up there)."""

    reason: sv1.EndReason
    command_id: str | None = None
    carrier_gone: bool = False


@dataclass(eq=False, slots=True)
class Utterance:
    """One ``speak`` item, possibly streamed in ``last: false`` pieces
    (docs/protocol-session-v1.md, ``speak``). Compared by identity: a new utterance may reuse
    the id of one that ``clear`` ended."""

    item_id: str
    relates_to: str  # an error's ``relatesTo``: the command's id, else "speak"
    provider: TtsProvider
    voice: VoiceInfo
    language: str
    last_seen: bool = False


@dataclass(frozen=True, slots=True)
class StartTts:
    """Synthesise ``utterance`` as its text arrives (:class:`SpeakText`)."""

    utterance: Utterance


@dataclass(frozen=True, slots=True)
class SpeakText:
    """More text for ``utterance``; ``last`` when no more will come."""

    utterance: Utterance
    text: str
    last: bool


@dataclass(frozen=True, slots=True)
class StopTts:
    """The utterance left the queue unfinished (``clear``, ``preempt``, a failure, the end):
    stop synthesising it."""

    utterance: Utterance


@dataclass(frozen=True, slots=True)
class FetchAudio:
    """Fetch ``url`` for the ``play`` item ``item_id``."""

    item_id: str
    url: str
    relates_to: str


@dataclass(frozen=True, slots=True)
class ClearLeg:
    """Drop what the carrier leg holds of the app's audio and has not played yet."""


@dataclass(frozen=True, slots=True)
class SendDtmf:
    """Keypresses out of band where the carrier can (``dtmf.send``); else the shell hands them
    back to :meth:`CallCore.queue_tones`."""

    digits: str
    relates_to: str


@dataclass(frozen=True, slots=True)
class StartHold:
    """The caller hears ``music`` (looped) or silence; the app's queue waits."""

    music: str | None
    command_id: str | None


@dataclass(frozen=True, slots=True)
class StopHold:
    """The caller is back with the app."""


@dataclass(frozen=True, slots=True)
class CancelTransfer:
    """``resume`` during a warm transfer: the caller is back, the party let go."""


@dataclass(frozen=True, slots=True)
class StartTransfer:
    """A transfer the core accepted (its target and id are checked)."""

    command: sv1.Transfer


@dataclass(frozen=True, slots=True)
class CompleteTransfer:
    """``transfer.complete`` for the warm transfer under way."""

    command_id: str


@dataclass(frozen=True, slots=True)
class StartHandoff:
    """Dial ``app`` and move the call to it; the shell reports back with
    :meth:`CallCore.handoff_over`."""

    app: str
    payload: Any
    command_id: str | None


@dataclass(frozen=True, slots=True)
class UpdateEars:
    """``listen.update``: what the turn detector and the recogniser listen with now."""

    language: str | None
    hints: list[str] | None
    patience: str | None


Effect = (
    SendEvent
    | SendError
    | OpenSession
    | ReportBadMessage
    | EndCall
    | StartTts
    | SpeakText
    | StopTts
    | FetchAudio
    | ClearLeg
    | SendDtmf
    | StartHold
    | StopHold
    | CancelTransfer
    | StartTransfer
    | CompleteTransfer
    | StartHandoff
    | UpdateEars
)
