"""A call as the REST API shows it (docs/configuration.md, ``[api]``: ``GET /v1/calls``).

The same description goes to the registry's memory of ended calls and, in a cluster, to the
directory (docs/scaling.md), so it is one function of the call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appbridge.calls.call import Call


def describe(call: Call) -> dict[str, Any]:
    """The call's fields, its state and end reason, times in ISO 8601 UTC."""
    return {
        "callRef": call.call_ref,
        "sessionRef": call.session_ref,
        "app": call.app.ref,
        "direction": call.direction,
        "from": call.from_,
        "to": call.to,
        "carrier": call.carrier,
        "started": _iso(call.started_wall),
        "ended": _iso(call.ended_wall) if call.ended_wall else None,
        "state": call.state.value,
        "endReason": call.end_reason,
        "onHold": call.control.on_hold,
        "handoffs": call.control.handoffs,
    }


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))
