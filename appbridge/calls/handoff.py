"""``handoff``: the call moves to another app (docs/protocol-session-v1.md, "Call control").

The call and the carrier leg stay up; only the app session changes. The core has accepted the
command (a known app, within the limits); here the new app is dialled, and if it or one of its
fallbacks answers, the old session ends with ``handoff``, the old app's output and listening
choices are dropped, and a new ``session.start`` carries the payload. When nothing answers, the
old session goes on and the app gets ``error internal``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appbridge.calls.app_session import DialResult
    from appbridge.calls.call import Call
    from appbridge.protocol import session_v1 as sv1

log = logging.getLogger(__name__)


async def hand_off(call: Call, target_ref: str, payload: Any, command_id: str | None) -> None:
    relates_to = command_id or "handoff"
    result = await call.dial_app(call.config.apps[target_ref])
    if call.ending:
        call.core.handoff_over(False)
        if result.link is not None:
            result.link.close(1001, "call ended")
        return
    if result.link is None and result.message is None:
        call.core.handoff_over(False)
        call.send_error(
            "internal",
            f"handoff: app {target_ref!r} and its fallbacks are unreachable",
            relates_to,
        )
        return
    call.core.handoff_over(True)
    if move_to(call, result, end_reason="handoff", command_id=command_id, payload=payload):
        log.info("call %s handed off to %s", call.call_ref, result.app.ref if result.app else "")


def move_to(
    call: Call,
    result: DialResult,
    *,
    end_reason: sv1.EndReason,
    command_id: str | None,
    payload: Any,
) -> bool:
    """The call leaves its session for what ``result`` reached: the app that answered (a new
    ``session.start`` carrying ``payload``; True) or the fallback message (False). The old
    session ends with ``end_reason``; its output, hold and listening choices are dropped."""
    call.close_session(end_reason, command_id)
    call.commands.run(call.core.reset_output())
    if call.control.resume():
        call.stop_hold()
    if result.link is not None and result.app is not None:
        call.link = result.link
        # The new app listens as its own configuration says, from a fresh start: nothing it
        # did not subscribe to, and none of the old app's listen.update.
        call.core.reset_listening()
        if call.ears is not None:
            ears, call.ears = call.ears, None
            call.spawn(ears.close(), "ears-close")
        call.use_app(result.app)
        call.start_session(handoff=payload)
        return True
    assert result.message is not None
    call.commands.run(call.core.fall_back(result.message))
    return False
