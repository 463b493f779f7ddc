"""How many frames a carrier leg takes per media-clock tick (docs/ARCHITECTURE.md, the media
clock), and when the output events of what it took were heard.

A carrier that buffers (Twilio plays what it receives in order) is kept a small, fixed lead ahead
of its playout: enough that a late tick never leaves the caller with a gap. The estimate of the
far end's buffer is frames sent minus ticks elapsed, never below zero; ``clear`` empties it.

The session protocol times the output events by what the caller heard
(docs/protocol-session-v1.md, "Output events" and ``mark``): ``output.started`` when the item
began to be heard, ``output.done`` when it was heard completely, ``mark`` when everything queued
before it was heard. The output queue reports them as frames are pulled, which on a leg with a
lead is up to the lead's length before the far end plays them. :class:`HeardLine` holds each
event until the frames sent before it have played (the leg's estimate, one frame per tick); a
leg without a lead (SIP sends each frame on its tick) lets them through at once. When ``clear``
drops the lead, what was held is settled by what was heard: a mark becomes ``cleared: true``, an
item whose tail was dropped becomes ``output.interrupted`` with the part heard, and an item none
of whose audio played never started.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from appbridge.media.output_queue import (
    MarkReached,
    OutputDone,
    OutputEvent,
    OutputInterrupted,
    OutputStarted,
    heard_text,
)

#: Frames whose item is remembered: more than any leg's lead plus the frame playing.
_OWNERS_KEPT: Final = 16


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


class HeardLine:
    """One call's output events, each held until the far end has played what came before it
    (module doc). Sans-I/O: the call reports ticks, frames sent and the leg's unplayed count."""

    def __init__(self, frame_ms: int = 20) -> None:
        self.frame_ms = frame_ms
        self.tick = 0  # the last media-clock tick seen
        self._held: deque[tuple[int, OutputEvent]] = deque()  # (due tick, event), in order
        # The item of each of the last frames sent on a leg with a lead (None: the app's raw
        # audio), newest last: which items the frames a ``clear`` drops belonged to.
        self._owners: deque[str | None] = deque(maxlen=_OWNERS_KEPT)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def sent(self, owner: str | None) -> None:
        """A frame of ``owner`` (an item id; None for raw audio) went to a leg with a lead."""
        self._owners.append(owner)

    def hold(self, events: list[OutputEvent], unplayed: int) -> list[OutputEvent]:
        """Events caused now, while the far end still has ``unplayed`` frames to play: the
        ones that may go at once (nothing before them is unheard), the rest held in order."""
        held = self._held
        if unplayed <= 0 and not held:
            return events
        due = self.tick + max(unplayed, 0)
        if held and held[-1][0] > due:
            due = held[-1][0]  # never ahead of an earlier event
        for ev in events:
            held.append((due, ev))
        return []

    def advance(self, tick: int) -> list[OutputEvent]:
        """A new tick: one more frame played. Returns the events heard by now."""
        self.tick = tick
        held = self._held
        ready: list[OutputEvent] = []
        while held and held[0][0] <= tick:
            ready.append(held.popleft()[1])
        return ready

    def unheard_by_item(self, unplayed: int) -> dict[str, int]:
        """Of the ``unplayed`` frames sent last, how many each item had."""
        counts: dict[str, int] = {}
        owners = self._owners
        n = min(unplayed, len(owners))
        for i in range(len(owners) - n, len(owners)):
            owner = owners[i]
            if owner is not None:
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    def settle_on_clear(self, unheard: dict[str, int]) -> list[OutputEvent]:
        """``clear`` dropped the far end's lead, with ``unheard`` frames of each item: every
        held event as it stands now, in order. An item none of whose audio was heard never
        started: its ``output.started`` is withdrawn, and it reports 0 ms."""
        never_started: set[str] = set()
        out: list[OutputEvent] = []
        frame_ms = self.frame_ms
        for _, ev in self._held:
            if isinstance(ev, OutputStarted):
                never_started.add(ev.item_id)  # its first frame was among those dropped
            elif isinstance(ev, MarkReached):
                out.append(MarkReached(ev.name, cleared=True))
            elif isinstance(ev, OutputDone):
                if ev.item_id in never_started:
                    out.append(OutputInterrupted(ev.item_id, 0, ""))
                    continue
                heard_ms = max(0, ev.heard_ms - unheard.get(ev.item_id, 0) * frame_ms)
                if heard_ms >= ev.heard_ms:
                    out.append(ev)  # its last frame was heard before the clear
                else:
                    text = heard_text(ev.words, heard_ms)
                    out.append(OutputInterrupted(ev.item_id, heard_ms, text))
            elif isinstance(ev, OutputInterrupted) and ev.item_id in never_started:
                out.append(OutputInterrupted(ev.item_id, 0, ""))
            else:
                out.append(ev)
        self.drop()
        return out

    def drop(self) -> None:
        """The app's output is gone (a handoff, the end): held events go nowhere."""
        self._held.clear()
        self._owners.clear()
