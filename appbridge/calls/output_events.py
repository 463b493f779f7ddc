"""The output queue's events as the app hears of them (docs/protocol-session-v1.md, "Output").

The queue reports items starting, ending and being interrupted, and marks being reached; the
app gets ``output.started``, ``output.done``, ``output.interrupted`` and ``mark`` for them. Items
the gateway plays for itself (a fallback message, queued keypress tones) are not the app's: they
produce no event, and the end of a fallback message ends the call. Sans-I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from appbridge.calls import effects as fx
from appbridge.media.output_queue import (
    MarkReached,
    OutputDone,
    OutputEvent,
    OutputInterrupted,
    OutputStarted,
)
from appbridge.protocol import session_v1 as sv1


def to_app(
    events: Sequence[OutputEvent],
    marks: dict[str, tuple[str, str | None]],
    internal_items: set[str],
    *,
    fallback: bool,
) -> list[fx.Effect]:
    """The effects for ``events``: marks are taken out of ``marks`` (the app's name and id by
    queue key) and the gateway's own items out of ``internal_items`` as they end."""
    out: list[fx.Effect] = []
    for ev in events:
        if isinstance(ev, MarkReached):
            name, mark_id = marks.pop(ev.name, (ev.name, None))
            out.append(fx.SendEvent(sv1.MarkEvent(name=name, cleared=ev.cleared, id=mark_id)))
            continue
        if ev.item_id in internal_items:
            if isinstance(ev, OutputDone | OutputInterrupted):
                internal_items.discard(ev.item_id)
                if fallback:
                    out.append(fx.EndCall("error"))
            continue
        if isinstance(ev, OutputStarted):
            out.append(fx.SendEvent(sv1.OutputStarted(id=ev.item_id)))
        elif isinstance(ev, OutputDone):
            out.append(fx.SendEvent(sv1.OutputDone(id=ev.item_id, heard_ms=ev.heard_ms)))
        elif isinstance(ev, OutputInterrupted):
            interrupted = sv1.OutputInterrupted(
                id=ev.item_id, heard_text=ev.heard_text, heard_ms=ev.heard_ms
            )
            out.append(fx.SendEvent(interrupted))
    return out


def new_item_id() -> str:
    """The id AppBridge gives an output item the app sent without one."""
    return f"ab-{uuid.uuid4().hex[:16]}"
