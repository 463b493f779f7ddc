"""A transfer's decisions, sans I/O (docs/protocol-session-v1.md, "Call control").

:class:`TransferCore` decides what one ``transfer`` does next; the shell (``calls/transfer.py``)
dials, hangs up, plays and bridges. It is fed what happened (the transfer starts, a media-clock
tick, the dial's result, ``transfer.complete``, the party hanging up, ``resume``, the call
ending) with ``now`` passed in, and it returns the steps below, in order. It imports no asyncio
and reads no clock, so the answer timeout is tested in virtual time.

The phases: ``carrier`` (a REFER, or a cold transfer the carrier does itself), ``dialing`` (the
gateway dials the new party while the caller waits), ``consulting`` (a warm transfer's party
answered and talks to the app), then ``done`` (joined or handed over) or ``failed`` (the caller
is back with the app, with ``error transfer_failed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from appbridge.protocol import session_v1 as sv1

#: The session protocol: "no answer in 30 s: ``error`` ``transfer_failed`` and the caller is back".
ANSWER_TIMEOUT_S: Final = 30.0
#: The carrier's own dial timer runs this much longer: it is only a backstop, the tick decides.
DIAL_BACKSTOP_S: Final = 5.0


class Phase(StrEnum):
    """Where one transfer is (module doc)."""

    NEW = "new"
    CARRIER = "carrier"
    DIALING = "dialing"
    CONSULTING = "consulting"
    DONE = "done"
    FAILED = "failed"


# -- the steps it asks for ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HandToCarrier:
    """The carrier carries the transfer out: a REFER (RFC 3515), or its own cold transfer."""

    mode: str
    target: str
    headers: dict[str, str] | None
    music: str | None


@dataclass(frozen=True, slots=True)
class WaitCaller:
    """The caller waits unheard, hearing ``music``, else ringback (cold) or silence (warm)."""

    ringback: bool
    music: str | None


@dataclass(frozen=True, slots=True)
class DialParty:
    """Dial the new party on the call's own trunk; the carrier's timer is ``timeout_s``."""

    target: str
    headers: dict[str, str] | None
    timeout_s: float


@dataclass(frozen=True, slots=True)
class CancelDial:
    """Stop dialling the new party (the answer timeout, ``resume``)."""


@dataclass(frozen=True, slots=True)
class HangUpParty:
    """Let the new party go."""


@dataclass(frozen=True, slots=True)
class Consult:
    """A warm transfer's party takes the caller's place toward the app."""


@dataclass(frozen=True, slots=True)
class Join:
    """Bridge the caller and the new party (``calls/bridge.py``)."""


@dataclass(frozen=True, slots=True)
class EndSession:
    """The session ends with ``transfer`` and the command's id; the call lives on bridged, or
    the carrier lets the caller go."""

    command_id: str | None


@dataclass(frozen=True, slots=True)
class StopWaiting:
    """The caller is back with the app."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The transfer is over without success: ``error`` ``code`` to the app, unless the call is
    ending anyway; the call goes on as before it."""

    code: sv1.ErrorCode
    message: str
    relates_to: str


Step = (
    HandToCarrier
    | WaitCaller
    | DialParty
    | CancelDial
    | HangUpParty
    | Consult
    | Join
    | EndSession
    | StopWaiting
    | Failed
)


class TransferCore:
    """One transfer's phases and decisions (module doc)."""

    def __init__(self, cmd: sv1.Transfer, *, native_cold: bool) -> None:
        self.mode = cmd.mode
        self.command_id = cmd.id
        self.relates_to = cmd.id or "transfer"
        self.target = cmd.to
        self.headers = cmd.headers
        self.music = cmd.music
        self.native_cold = native_cold
        self.phase = Phase.NEW
        self.deadline: float | None = None
        self.caller_waiting = False  # the caller hears music or ringback and is not heard
        self.timed_out = False

    @property
    def hands_over(self) -> bool:
        """The carrier takes the caller away (native cold, REFER): its hang-up is the end."""
        return self.mode == "refer" or (self.mode == "cold" and self.native_cold)

    @property
    def consulting(self) -> bool:
        return self.phase is Phase.CONSULTING

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.FAILED)

    # -- inputs --------------------------------------------------------------------------------
    def start(self, now: float, *, has_leg: bool) -> list[Step]:
        """The transfer begins: the carrier does it, or the gateway dials the party."""
        if not has_leg:
            return self._fail("the call has no carrier leg")
        if self.hands_over:
            self.phase = Phase.CARRIER
            return [HandToCarrier(self.mode, self.target, self.headers, self.music)]
        self.phase = Phase.DIALING
        self.caller_waiting = True
        self.deadline = now + ANSWER_TIMEOUT_S
        return [
            WaitCaller(ringback=self.mode == "cold", music=self.music),
            DialParty(self.target, self.headers, ANSWER_TIMEOUT_S + DIAL_BACKSTOP_S),
        ]

    def carrier_done(self) -> list[Step]:
        """The carrier took the caller (the REFER's NOTIFY said so, or its cold transfer ran)."""
        self.phase = Phase.DONE
        return [EndSession(self.command_id)]

    def on_tick(self, now: float) -> list[Step]:
        """The answer timeout, checked on the media clock."""
        if self.phase is Phase.DIALING and self.deadline is not None and now >= self.deadline:
            self.deadline = None
            self.timed_out = True
            return [CancelDial()]
        return []

    def dial_answered(self, *, call_over: bool) -> list[Step]:
        """The new party answered: a cold transfer joins it, a warm one consults it."""
        self.deadline = None
        if self.phase is not Phase.DIALING or call_over:
            return [HangUpParty()]
        if self.mode == "cold":
            self.phase = Phase.DONE
            return [Join(), EndSession(self.command_id)]
        self.phase = Phase.CONSULTING
        return [Consult()]

    def dial_timed_out(self) -> list[Step]:
        self.deadline = None
        return self._fail(f"{self.target} did not answer within {ANSWER_TIMEOUT_S:.0f} s")

    def failed(self, code: sv1.ErrorCode, message: str) -> list[Step]:
        """The carrier refused the REFER or the transfer, or the dial failed (busy, rejected)."""
        self.deadline = None
        return self._fail(message, code)

    def complete(self, command_id: str) -> tuple[tuple[sv1.ErrorCode, str] | None, list[Step]]:
        """``transfer.complete``: the error to answer, or the steps that join the two."""
        if self.mode != "warm" or command_id != self.command_id:
            message = f"transfer.complete: no warm transfer with id {command_id!r}"
            return ("bad_message", message), []
        if self.phase is not Phase.CONSULTING:
            return ("bad_message", "transfer.complete: the new party has not answered yet"), []
        self.phase = Phase.DONE
        return None, [Join(), EndSession(self.command_id)]

    def party_hung_up(self) -> list[Step]:
        """The new party hung up during the consultation: the caller is back with the app."""
        if self.finished:
            return []
        return self._fail(f"{self.target} hung up before completion")

    def cancel(self, reason: str) -> list[Step]:
        """``resume`` during a warm transfer: the party is let go, the caller is back."""
        if self.finished:
            return []
        steps: list[Step] = []
        if self.phase is Phase.DIALING:
            steps.append(CancelDial())
        elif self.phase is Phase.CONSULTING:
            steps.append(HangUpParty())
        return steps + self._fail(f"the warm transfer was cancelled by {reason}")

    def abandon(self) -> list[Step]:
        """The call is ending: a consulted party is let go (a dial is cancelled with the call)."""
        was_consulting = self.phase is Phase.CONSULTING
        self.phase = Phase.DONE
        return [HangUpParty()] if was_consulting else []

    def _fail(self, message: str, code: sv1.ErrorCode = "transfer_failed") -> list[Step]:
        if self.phase is Phase.FAILED:
            return []
        self.phase = Phase.FAILED
        steps: list[Step] = []
        if self.caller_waiting:
            self.caller_waiting = False
            steps.append(StopWaiting())
        steps.append(Failed(code, message, self.relates_to))
        return steps
