"""What the Twilio and the SIP test callers share: usage errors, keypress timing, exit codes.

Both callers take the same options and print the same kind of lines (docs/caller.md), so a
keypress schedule or an exit code means the same whichever way the call was placed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

__all__ = [
    "DIGITS_START_S",
    "DIGIT_INTERVAL_S",
    "DTMF_DIGITS",
    "EXIT_ABANDONED",
    "EXIT_CONNECTED",
    "EXIT_NOT_CONNECTED",
    "EXIT_USAGE",
    "SILENCE_RMS",
    "CallerUsageError",
    "Emit",
]

#: Keypresses start this long after the call connects, one per ``DIGIT_INTERVAL_S``.
DIGITS_START_S: Final = 2.0
DIGIT_INTERVAL_S: Final = 1.0
DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
#: A frame quieter than this RMS (pcm16 units, about -50 dBFS) counts as silence.
SILENCE_RMS: Final = 100.0
#: Exit codes (docs/caller.md, "Exit codes").
EXIT_CONNECTED: Final = 0
EXIT_NOT_CONNECTED: Final = 1
EXIT_USAGE: Final = 2
EXIT_ABANDONED: Final = 130  # a second Ctrl-C: the shell's convention for SIGINT

#: Receives one printable line per event.
Emit = Callable[[str], None]


class CallerUsageError(ValueError):
    """The command line asked for something impossible; the message says what, for humans."""
