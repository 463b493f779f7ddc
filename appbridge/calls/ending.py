"""The single way out of a call: every end goes through :func:`end_call` (``Call.end``).

``session.end`` goes to the app and its listeners (not to an app that is already gone), the
call's tasks and its ears stop, a transfer under way is abandoned, and the carrier is hung up, or
only let go after a transfer the carrier carried out. A call whose caller a transfer joined to a
new party stays ``bridged`` until one of them hangs up; a second end (a DELETE, a drain) then
hangs up the bridge. The states are those of ``calls/state.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from appbridge.calls.state import CallState

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.protocol import session_v1 as sv1

log = logging.getLogger(__name__)


async def end_call(
    call: Call,
    reason: sv1.EndReason,
    command_id: str | None = None,
    *,
    app_gone: bool = False,
    carrier_gone: bool = False,
) -> None:
    if call.ending:
        if call.bridge is not None and not call.bridge.done:
            await call.bridge.hangup()  # DELETE or a drain on a bridged call
        return
    call.ending = True
    call.end_reason = reason
    call.lifecycle.move(CallState.ENDING)
    call.leave_media_clock()
    call.commands.run(call.core.shutdown())
    if call.ears is not None:
        await call.ears.close()
    call.cancel_tasks()
    if app_gone:
        call.close_link(reason)  # no session.end to an app that is gone
    call.close_session(reason, command_id)
    transfer = call.transfer
    if transfer is not None and call.bridge is None:
        await transfer.abandon()
    if call.bridge is not None:
        call.gw.metrics.calls_ended[reason] = call.gw.metrics.calls_ended.get(reason, 0) + 1
        if call.bridge.done:
            call.finish(count=False)
        else:
            call.lifecycle.move(CallState.BRIDGED)
        log.info("call %s: session ended (%s); the call stays bridged", call.call_ref, reason)
        return
    if call.leg is not None and not carrier_gone:
        try:
            if reason == "transfer":
                await call.leg.close()  # the carrier bridges the caller on; never end it
            else:
                await call.leg.hangup()
        except Exception:
            log.exception("call %s: carrier hang-up failed", call.call_ref)
    call.finish()
