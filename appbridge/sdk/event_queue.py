"""The events a session received and the app has not read yet, bounded.

Caller audio arrives every 20 ms whether or not the app reads it (an IVR that only gathers keys
never does), so an unbounded queue would grow for the whole call. Audio frames are kept up to a
limit (10 s by default) and the oldest is dropped beyond it; control events are kept up to a much
larger limit, and dropping one is logged, never silent: the gateway never waits on a slow app, so
the SDK must keep reading. Sans-I/O apart from the wake-up flag the iterator waits on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

from appbridge.sdk.events import AudioFrame, Event

__all__ = ["MAX_QUEUED_AUDIO_FRAMES", "MAX_QUEUED_EVENTS", "EventQueue"]

log = logging.getLogger("appbridge.sdk")

MAX_QUEUED_AUDIO_FRAMES: Final = 500
"""Caller audio kept for an app that is not iterating: 10 s of 20 ms frames; older ones drop."""

MAX_QUEUED_EVENTS: Final = 10_000
"""Control events kept for an app that is not iterating; beyond it the oldest drop (logged)."""


class EventQueue:
    """FIFO of events with separate bounds for audio frames and control events."""

    def __init__(
        self,
        name: str,
        max_audio_frames: int = MAX_QUEUED_AUDIO_FRAMES,
        max_events: int = MAX_QUEUED_EVENTS,
    ) -> None:
        self.name = name
        self.max_audio_frames = max_audio_frames
        self.max_events = max_events
        self.dropped_audio_frames = 0
        self.dropped_events = 0
        self.wakeup = asyncio.Event()
        self._items: deque[Event] = deque()
        self._audio = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, event: Event) -> None:
        if isinstance(event, AudioFrame):
            if self._audio >= self.max_audio_frames:
                self._drop_oldest(audio=True)
            self._audio += 1
        elif len(self._items) - self._audio >= self.max_events:
            self._drop_oldest(audio=False)
        self._items.append(event)
        self.wakeup.set()

    def pop(self) -> Event | None:
        if not self._items:
            return None
        event = self._items.popleft()
        if isinstance(event, AudioFrame):
            self._audio -= 1
        return event

    def _drop_oldest(self, *, audio: bool) -> None:
        for i, queued in enumerate(self._items):
            if isinstance(queued, AudioFrame) is audio:
                del self._items[i]
                break
        if audio:
            self._audio -= 1
            self.dropped_audio_frames += 1
            if self.dropped_audio_frames == 1:
                log.debug("%s: caller audio is not being read; dropping the oldest", self.name)
        else:
            self.dropped_events += 1
            if self.dropped_events == 1:
                log.warning("%s: events are not being read; dropping the oldest", self.name)
