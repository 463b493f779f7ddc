"""What the console knows of one call: its row, and its timeline of messages, audio, levels
and state changes (docs/operations.md, "The console and the softphone").

The recorder is the app link's tap (apps/link.py ``LinkTap``): every JSON message between the
gateway and the app reaches it, parsed only here. Audio never does: the link and the call count
frames and keep a reference to the last one, and the console's timer (console/board.py) asks
the recorder four times a second to turn those into a level entry, and once a second into a
frame count per direction. So the media path pays a counter and an assignment per frame.

Twilio-dialect apps send their audio as JSON ``media`` events (docs/protocol-twilio.md); those
are recognised by their first bytes and counted as audio, not kept as messages.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

from appbridge.console.levels import SILENCE_DBFS, dbfs
from appbridge.console.timeline import Timeline, parse_message

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from appbridge.apps.link import AppLink
    from appbridge.calls.call import Call

#: How far into a Twilio-dialect text frame ``"media"`` must appear for it to be audio: the
#: event name comes first in the frames apps send (``{"event": "media", ...}``).
_MEDIA_HEAD: Final = 48
_MEDIA_EVENT: Final = b'"media"'


def iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class _Counts:
    """Frames and bytes of one direction, as last summarised."""

    __slots__ = ("bytes", "frames")

    def __init__(self) -> None:
        self.frames = 0
        self.bytes = 0


class CallRecorder:
    """One call's console record; it holds the call only while the call is live."""

    def __init__(self, call: Call) -> None:
        self.call: Call | None = call
        self._clock = call.gw.clock
        self._t0 = self._clock.now()
        self.call_ref = call.call_ref
        self.timeline = Timeline()
        self._row: dict[str, Any] = {
            "callRef": call.call_ref,
            "app": call.app.ref,
            "carrier": call.carrier,
            "from": call.from_,
            "to": call.to,
            "state": call.state.value,
            "durationMs": 0,
            "startedAt": iso(call.started_wall),
        }
        self._state = ""
        self.ended_at: str | None = None
        self.reason: str | None = None
        # What the last summaries counted, per direction; the counts of the links the call
        # had before its current one (a reconnect, a handoff); Twilio-dialect media received.
        self._link: AppLink | None = None
        self._seen = {d: _Counts() for d in ("caller_in", "caller_out", "to_app", "from_app")}
        self._earlier_out = _Counts()
        self._earlier_in = _Counts()
        self._twilio_frames = 0
        self._twilio_bytes = 0
        self._level_in = self._level_out = -1  # call.frames_in / frames_out at the last level
        self.note_state()

    # -- the link's tap (apps/link.py) ----------------------------------------------------------
    def text_out(self, data: bytes) -> None:
        self._message("to_app", data)

    def text_in(self, data: bytes) -> None:
        call = self.call
        twilio = call is not None and call.encoder.protocol == "twilio"
        if twilio and data.find(_MEDIA_EVENT, 0, _MEDIA_HEAD) >= 0:
            self._twilio_frames += 1
            self._twilio_bytes += len(data)
            return
        self._message("from_app", data)

    def _message(self, dir_: str, data: bytes) -> None:
        if self.call is None:
            return
        self.note_state()
        try:
            type_, summary, parsed = parse_message(data)
        except Exception:  # the console never costs a call anything: the message goes unkept
            log.debug(
                "console: a message of call %s was not recorded", self.call.call_ref, exc_info=True
            )
            type_, summary, parsed = "unrecorded", f"{len(data)} bytes", None
        self.timeline.add(self.ms(), dir_, "message", type_, summary, parsed)

    # -- sampled by the console's timer ---------------------------------------------------------
    def ms(self) -> int:
        return int((self._clock.now() - self._t0) * 1000)

    def note_state(self) -> None:
        """A state entry when the call's state is not the one last recorded."""
        call = self.call
        if call is None:
            return
        state = call.state.value
        if state != self._state:
            self._state = state
            self._row["state"] = state
            self.timeline.add(self.ms(), None, "state", state, f"state: {state}", None)

    def sample_level(self) -> None:
        """One level entry from the last frame of each direction (-100 when none came since)."""
        call = self.call
        if call is None or call.leg is None:
            return
        codec = call.leg.audio_format.codec
        level_in = dbfs(call.last_in, codec) if call.frames_in != self._level_in else SILENCE_DBFS
        level_out = (
            dbfs(call.last_out, codec) if call.frames_out != self._level_out else SILENCE_DBFS
        )
        self._level_in, self._level_out = call.frames_in, call.frames_out
        self.timeline.add_level(self.ms(), level_in, level_out)

    def sample_audio(self) -> None:
        """One ``frames`` entry per direction that carried audio since the last one."""
        call = self.call
        if call is None:
            return
        self._watch_link(call)
        link = self._link
        out, in_ = self._earlier_out, self._earlier_in
        totals = {
            "caller_in": (call.frames_in, call.frames_in * len(call.last_in)),
            "caller_out": (call.frames_out, call.frames_out * len(call.last_out)),
            "to_app": (
                out.frames + (link.audio_out_frames if link else 0),
                out.bytes + (link.audio_out_bytes if link else 0),
            ),
            "from_app": (
                in_.frames + (link.audio_in_frames if link else 0) + self._twilio_frames,
                in_.bytes + (link.audio_in_bytes if link else 0) + self._twilio_bytes,
            ),
        }
        ms = self.ms()
        for dir_, (frames, size) in totals.items():
            seen = self._seen[dir_]
            n, b = frames - seen.frames, size - seen.bytes
            seen.frames, seen.bytes = frames, size
            if n > 0:
                self.timeline.add_frames(ms, dir_, n, max(b, 0))

    def _watch_link(self, call: Call) -> None:
        """Tap a link the call took since (a reconnect, a handoff), and keep what the one before
        counted: a new link's counters start at 0."""
        link = call.link
        if link is None or link is self._link:
            return
        if link.tap is None:
            link.tap = self
        old = self._link
        if old is not None:
            self._earlier_out.frames += old.audio_out_frames
            self._earlier_out.bytes += old.audio_out_bytes
            self._earlier_in.frames += old.audio_in_frames
            self._earlier_in.bytes += old.audio_in_bytes
        self._link = link

    # -- the end --------------------------------------------------------------------------------
    @property
    def over(self) -> bool:
        call = self.call
        return call is None or call.ended.is_set()

    def close(self) -> None:
        """The call ended: the last counts and state, then let go of the call."""
        call = self.call
        if call is None:
            return
        self.sample_audio()
        self.note_state()
        self._row["durationMs"] = self.ms()
        self.ended_at = iso(call.ended_wall or self._clock.wall())
        self.reason = call.end_reason or "error"
        self.call = None
        self._link = None

    def row(self) -> dict[str, Any]:
        """The call as ``GET /v1/console/calls`` lists it."""
        row = dict(self._row)
        if self.call is not None:
            row["state"] = self.call.state.value
            row["durationMs"] = self.ms()
        else:
            row["endedAt"] = self.ended_at
            row["reason"] = self.reason
        return row

    def timeline_page(self, after: int) -> dict[str, Any]:
        entries = self.timeline.after(after)
        return {
            "callRef": self.call_ref,
            "live": self.call is not None,
            "next": entries[-1]["seq"] if entries else min(max(after, 0), self.timeline.seq),
            "dropped": self.timeline.dropped,
            "entries": entries,
        }
