"""Every state of a call and every legal move between them, in one table.

A call's state is what ``GET /v1/calls/{callRef}`` reports as ``state`` (docs/configuration.md,
`[api]`; docs/protocol-session-v1.md, "Session lifecycle"). The engine changes it only through
:meth:`Lifecycle.move`, which refuses a move the table does not list: a bug that would have left a
call in a state it cannot be in fails loudly where it happens. Carriers never assign it; they
report what happened on their side (the callee is ringing, has answered) and the call moves.

::

    inbound:   dialing ──────────────► active ──┐ (handoff: active again)
                  │                      │   ◄──┘
                  └──► fallback          │
    outbound:  dialing ─► ringing ─► answered ─► active / fallback
    any live state ─► ending ─► ended
                        └─► bridged ─► ended   (a transfer joined the caller to a new party)

``dialing``: the app is being dialled (inbound), or the callee (outbound). ``ringing`` and
``answered``: an outbound callee's progress. ``active``: a session is open with an app.
``fallback``: no app could be reached; the gateway speaks the configured message, then hangs up.
``ending``: the single way out has begun (``session.end`` sent, the carrier being hung up).
``bridged``: the session ended with ``transfer`` but the caller and the new party are still
joined by the gateway. ``ended``: over on every side.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class CallState(StrEnum):
    """A string enum: ``describe()`` and the REST API carry the plain value."""

    DIALING = "dialing"
    RINGING = "ringing"
    ANSWERED = "answered"
    ACTIVE = "active"
    FALLBACK = "fallback"
    ENDING = "ending"
    BRIDGED = "bridged"
    ENDED = "ended"


S = CallState

#: Where each state may go. ``active → active`` is a handoff: a new session on the same call.
TRANSITIONS: Final[Mapping[CallState, frozenset[CallState]]] = {
    S.DIALING: frozenset({S.RINGING, S.ANSWERED, S.ACTIVE, S.FALLBACK, S.ENDING}),
    S.RINGING: frozenset({S.ANSWERED, S.ENDING}),
    S.ANSWERED: frozenset({S.ACTIVE, S.FALLBACK, S.ENDING}),
    S.ACTIVE: frozenset({S.ACTIVE, S.FALLBACK, S.ENDING}),
    S.FALLBACK: frozenset({S.ENDING}),
    S.ENDING: frozenset({S.BRIDGED, S.ENDED}),
    S.BRIDGED: frozenset({S.ENDED}),
    S.ENDED: frozenset(),
}

#: States in which the call is going or gone: nothing new may start on it.
OVER: Final = frozenset({S.ENDING, S.ENDED})


class IllegalTransition(RuntimeError):
    """A move the table does not allow: a bug in the engine, never a peer's doing."""

    def __init__(self, call_ref: str, current: CallState, wanted: CallState) -> None:
        super().__init__(f"call {call_ref}: no move from {current.value} to {wanted.value}")
        self.current = current
        self.wanted = wanted


class Lifecycle:
    """One call's state, moved only along :data:`TRANSITIONS`."""

    __slots__ = ("call_ref", "state")

    def __init__(self, call_ref: str, state: CallState = S.DIALING) -> None:
        self.call_ref = call_ref
        self.state = state

    def move(self, to: CallState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.call_ref, self.state, to)
        self.state = to

    @property
    def over(self) -> bool:
        return self.state in OVER

    def ringing(self) -> bool:
        """The outbound callee is ringing. A late report (after the answer, or once the call is
        ending) changes nothing. True when the state moved."""
        if self.state is S.DIALING:
            self.state = S.RINGING
            return True
        return False

    def answered(self) -> bool:
        """The outbound callee answered; reported once the call is over it changes nothing.
        True when the state moved."""
        if self.state in (S.DIALING, S.RINGING):
            self.state = S.ANSWERED
            return True
        return False
