"""Every event, to as many consumers as an app wants (docs/sdk.md, "Events").

``async for event in session`` hands each event that did not answer an await to one reader, which
suits one loop per call. An app that also logs a transcript, feeds a dashboard and drives an LLM
wants each of them to see every event without coordinating. Two ways, both fed before the session
decides whether an event answers an await:

- :meth:`Fanout.on` registers a callback for an event type (a class from ``appbridge.sdk``,
  matched with ``isinstance``); a coroutine function's calls run as tasks of the session.
- :meth:`Fanout.events` opens an iterator of its own that sees every event from then on until the
  session ends, bounded like the session's queue (old caller audio drops first).

A callback that raises is logged and stays registered; it never ends the session.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from appbridge.sdk.event_queue import MAX_QUEUED_AUDIO_FRAMES, EventQueue
from appbridge.sdk.events import Event

__all__ = ["Fanout"]

log = logging.getLogger("appbridge.sdk")

E = TypeVar("E")
Callback = Callable[[Any], "Awaitable[None] | None"]


class Fanout:
    """The callbacks and the extra iterators of one session."""

    def __init__(self, name: str) -> None:
        self._fanout_name = name
        self._callbacks: list[tuple[type[Any], Callback]] = []
        self._taps: list[EventQueue] = []
        self._fanout_closed = False

    def on(
        self, event_type: type[E], callback: Callable[[E], Awaitable[None] | None]
    ) -> Callable[[], None]:
        """Calls ``callback(event)`` for every event of ``event_type`` (subclasses too); returns
        a function that removes it. ``on(object, fn)`` sees everything."""
        entry: tuple[type[Any], Callback] = (event_type, callback)
        self._callbacks.append(entry)

        def remove() -> None:
            if entry in self._callbacks:
                self._callbacks.remove(entry)

        return remove

    def events(
        self, *, max_queued_audio_frames: int = MAX_QUEUED_AUDIO_FRAMES
    ) -> AsyncIterator[Event]:
        """A new iterator over every event from now until the session ends."""
        tap = EventQueue(f"{self._fanout_name} tap", max_queued_audio_frames)
        if not self._fanout_closed:
            self._taps.append(tap)
        return self._drain(tap)

    async def _drain(self, tap: EventQueue) -> AsyncIterator[Event]:
        try:
            while True:
                event = tap.pop()
                if event is not None:
                    yield event
                elif self._fanout_closed or tap not in self._taps:
                    return
                else:
                    tap.wakeup.clear()
                    await tap.wakeup.wait()
        finally:
            if tap in self._taps:
                self._taps.remove(tap)

    def _publish(self, event: Event) -> None:
        for tap in self._taps:
            tap.push(event)
        for event_type, callback in list(self._callbacks):
            if isinstance(event, event_type):
                self._call(callback, event)

    def _call(self, callback: Callback, event: Event) -> None:
        try:
            outcome = callback(event)
        except Exception:
            log.exception("%s: a callback for %s raised", self._fanout_name, type(event).__name__)
            return
        if inspect.isawaitable(outcome):
            self._spawn(_guarded(outcome, self._fanout_name), f"sdk-callback-{self._fanout_name}")

    def _close_taps(self) -> None:
        self._fanout_closed = True
        for tap in self._taps:
            tap.wakeup.set()

    # Provided by the session.
    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> Any:
        raise NotImplementedError


async def _guarded(outcome: Awaitable[None], name: str) -> None:
    try:
        await outcome
    except Exception:
        log.exception("%s: an async callback raised", name)
