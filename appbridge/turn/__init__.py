"""Turn-taking: voice activity detection and the turn detector (docs/turn-taking.md).

Both are sans-I/O cores; the call engine feeds them frames, transcripts and time.
"""

from appbridge.turn.detector import (
    PATIENCE_WAIT_S,
    Backchannel,
    Ended,
    Estimate,
    LikelyEnded,
    Patience,
    Phase,
    Resumed,
    TurnDetector,
    TurnEvent,
    TurnTiming,
    UserStarted,
)
from appbridge.turn.vad import Vad, frame_dbfs

__all__ = [
    "PATIENCE_WAIT_S",
    "Backchannel",
    "Ended",
    "Estimate",
    "LikelyEnded",
    "Patience",
    "Phase",
    "Resumed",
    "TurnDetector",
    "TurnEvent",
    "TurnTiming",
    "UserStarted",
    "Vad",
    "frame_dbfs",
]
