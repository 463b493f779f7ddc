"""The messages of the ``"appbridge"`` data channel (docs/webrtc.md, "The data channel").

The browser sends JSON text: ``{"type": "dtmf", "digit": "5"}`` (one of 0-9 * # A-D, the app
gets ``dtmf`` as from a phone's keypad) and ``{"type": "hangup"}`` (the session ends with
``caller_hangup``). The gateway sends ``{"type": "ended", "reason": ...}`` with the
``session.end`` reason when the call ends (docs/protocol-session-v1.md, ``session.end``).

Parsing never raises: a browser's bad message is a :class:`Refused` with a reason to log, and
the call goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

#: The label of the data channel the browser opens before its offer.
CHANNEL_LABEL: Final = "appbridge"
#: The keys of a DTMF keypad, with the fourth column (RFC 4733 §3.2: events 0-15).
DIGITS: Final = frozenset("0123456789*#ABCD")
#: Longer messages are refused unread: none of ours comes near.
MAX_MESSAGE_BYTES: Final = 1024


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class Hangup:
    pass


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


Message = Dtmf | Hangup | Refused


def parse_message(data: str | bytes) -> Message:
    """One data channel message from the browser (module doc)."""
    if len(data) > MAX_MESSAGE_BYTES:
        return Refused(f"message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    if isinstance(data, bytes):
        return Refused("binary message (the channel carries JSON text)")
    try:
        value = json.loads(data)
    except ValueError:
        return Refused("not JSON")
    if not isinstance(value, dict):
        return Refused("not a JSON object")
    kind = value.get("type")
    if kind == "hangup":
        return Hangup()
    if kind == "dtmf":
        digit = value.get("digit")
        if isinstance(digit, str) and digit.upper() in DIGITS and len(digit) == 1:
            return Dtmf(digit.upper())
        return Refused(f"dtmf digit {str(digit)[:20]!r} is not one of 0-9 * # A-D")
    return Refused(f"unknown type {str(kind)[:40]!r}")


def ended_message(reason: str) -> str:
    """What the gateway says when the call ends."""
    return json.dumps({"type": "ended", "reason": reason}, separators=(",", ":"))
