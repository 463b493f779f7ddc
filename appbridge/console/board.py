"""The console's record of this node's calls: the live ones, and the 20 that ended last
(docs/operations.md, "The console and the softphone").

Every call gets a recorder when it opens (calls/intake.py ``open_call``). One timer for all
calls, armed only while some call is live, samples each call's levels four times a second and
its frame counts once a second (console/recorder.py), and moves the calls that ended to the
ended list. With ``[cluster]`` each node knows only its own calls (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from appbridge.console.recorder import CallRecorder

if TYPE_CHECKING:
    from appbridge.calls.call import Call

log = logging.getLogger(__name__)

TICK_S: Final = 0.25
TICKS_PER_SUMMARY: Final = 4  # one audio summary a second
ENDED_KEPT: Final = 20


class CallConsole:
    def __init__(self, ended_kept: int = ENDED_KEPT) -> None:
        self.live: dict[str, CallRecorder] = {}
        self.ended: OrderedDict[str, CallRecorder] = OrderedDict()
        self.ended_kept = ended_kept
        self._timer: asyncio.TimerHandle | None = None
        self._ticks = 0

    def open(self, call: Call) -> CallRecorder:
        """Start recording ``call``; the call's link taps into the recorder (``call.tap``)."""
        recorder = CallRecorder(call)
        call.tap = recorder
        self.live[call.call_ref] = recorder
        self.ended.pop(call.call_ref, None)
        self._arm()
        return recorder

    def _arm(self) -> None:
        if self._timer is not None or not self.live:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test drives tick() itself)
        self._timer = loop.call_later(TICK_S, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self.tick()
        except Exception:
            log.exception("console: sampling the calls failed")
        self._arm()

    def tick(self) -> None:
        """One sampling round: levels always, frame counts every fourth round."""
        self._ticks += 1
        summary = self._ticks % TICKS_PER_SUMMARY == 0
        self.sweep()
        for recorder in list(self.live.values()):
            recorder.note_state()
            recorder.sample_level()
            if summary:
                recorder.sample_audio()

    def sweep(self) -> None:
        """Move the calls that ended from the live list to the ended one."""
        for call_ref, recorder in list(self.live.items()):
            if recorder.over:
                recorder.close()
                del self.live[call_ref]
                self.ended[call_ref] = recorder
                self.ended.move_to_end(call_ref)
        while len(self.ended) > self.ended_kept:
            self.ended.popitem(last=False)

    def get(self, call_ref: str) -> CallRecorder | None:
        self.sweep()
        return self.live.get(call_ref) or self.ended.get(call_ref)

    def listing(self) -> dict[str, Any]:
        """``GET /v1/console/calls``: live calls oldest first, ended ones newest first."""
        self.sweep()
        return {
            "live": [r.row() for r in self.live.values()],
            "ended": [r.row() for r in reversed(self.ended.values())],
        }

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
