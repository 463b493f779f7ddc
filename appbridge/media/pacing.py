"""How many frames a carrier leg takes per media-clock tick (DESIGN.md, "The media path").

A carrier that buffers (Twilio plays what it receives in order) is kept a small, fixed lead ahead
of its playout: enough that a late tick never leaves the caller with a gap, small enough that
``output.*`` events stay within a couple of frames of what the caller hears. The estimate of the
far end's buffer is frames sent minus ticks elapsed, never below zero; ``clear`` empties it.
"""

from __future__ import annotations


class LeadPacer:
    def __init__(self, lead_frames: int) -> None:
        if lead_frames < 0:
            raise ValueError("lead_frames must be >= 0")
        self.lead_frames = lead_frames
        self.buffered = 0  # frames sent that the far end has not played yet (estimate)

    def frames_wanted(self, playing: bool) -> int:
        """Called once per tick, before pulling: the far end played one frame since the last."""
        if self.buffered > 0:
            self.buffered -= 1
        if not playing:
            return 1
        return max(1, self.lead_frames + 1 - self.buffered)

    def on_sent(self) -> None:
        self.buffered += 1

    def on_cleared(self) -> None:
        self.buffered = 0
