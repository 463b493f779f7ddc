"""Call-control rules (docs/protocol-session-v1.md, "Call control") as a sans-I/O core: hold gating
and the handoff limits.

Theory of operation: the command handler asks :meth:`CallControl.gate` before running a command;
the answer is ``None`` (go on) or the error code to send. Hold and handoff state changes go
through this class only, so every rule is a plain unit test.

- Hold: "every command except ``resume``, ``hangup``, ``transfer`` and ``handoff`` gets
  ``error on_hold``"; app audio frames are dropped while on hold (the caller hears the music).
- Handoff: at most ``MAX_HANDOFFS`` per call; one at a time.
- Transfer targets: an E.164 number or a trunk's ``sip:`` host (:func:`transfer_target_ok`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

_E164: Final = re.compile(r"^\+[1-9][0-9]{1,14}$")

MAX_HANDOFFS: Final = 5
ALLOWED_ON_HOLD: Final = frozenset({"resume", "hangup", "transfer", "handoff"})


class CallControl:
    def __init__(self) -> None:
        self.on_hold = False
        self.handoffs = 0
        self.handoff_pending = False
        self.transfer_pending: str | None = None  # the mode of a transfer under way
        self.transfer_id: str | None = None  # its command id, echoed by session.end

    def gate(self, command_type: str) -> tuple[str, str] | None:
        """``(error code, message)`` when the command may not run now, else None."""
        if self.on_hold and command_type not in ALLOWED_ON_HOLD:
            return "on_hold", f"{command_type} is not allowed while the caller is on hold"
        if self.transfer_pending is not None and command_type in ("transfer", "handoff", "hold"):
            return "bad_message", f"a {self.transfer_pending} transfer is already under way"
        if self.handoff_pending and command_type in ("transfer", "handoff"):
            return "bad_message", "a handoff is already under way"
        return None

    def hold(self) -> bool:
        """True if the call was not on hold already."""
        was = self.on_hold
        self.on_hold = True
        return not was

    def resume(self) -> bool:
        was = self.on_hold
        self.on_hold = False
        return was

    def begin_handoff(self) -> str | None:
        """An error message when the limit is reached; else the handoff is counted."""
        if self.handoffs >= MAX_HANDOFFS:
            return f"at most {MAX_HANDOFFS} handoffs per call"
        self.handoffs += 1
        self.handoff_pending = True
        return None

    def end_handoff(self, succeeded: bool) -> None:
        self.handoff_pending = False
        if not succeeded:
            self.handoffs -= 1


def transfer_target_ok(target: str, trunk_hosts: Collection[str]) -> bool:
    """docs/protocol-session-v1.md, "Call control": a transfer's ``to`` is an E.164 number, or a
    ``sip:`` URI whose host is a configured trunk's (no calls to arbitrary hosts)."""
    if _E164.match(target):
        return True
    if target.startswith("sip:"):
        host = target[4:].split("@", 1)[-1].split(";", 1)[0].split("?", 1)[0]
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return host in trunk_hosts
    return False
