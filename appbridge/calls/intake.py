"""The one way in: every carrier admits and opens its new calls here.

A call offered by a carrier (the Twilio webhook, a SIP INVITE) or placed by ``POST /v1/calls``
(over a SIP trunk or Twilio) is admitted the same way (draining, ``max_calls``, the CPU limit;
docs/configuration.md, "Admission control"), counted once when refused, and registered the
same way once it is taken. What differs per carrier (how it says no, when it routes, when it
dials the app) stays with the carrier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from appbridge.calls.call import Call
from appbridge.calls.services import CallServices

if TYPE_CHECKING:
    from appbridge.config import AppConfig
    from appbridge.protocol.session_v1 import Direction


class Admitting(CallServices, Protocol):
    def admission_refusal(self) -> str | None: ...


def refusal(services: Admitting) -> str | None:
    """Why a new call is refused now, counted in ``registry.total_rejected``; None to take it."""
    refused = services.admission_refusal()
    if refused is not None:
        services.registry.total_rejected += 1
    return refused


def open_call(
    services: CallServices,
    *,
    call_ref: str,
    app: AppConfig,
    direction: Direction,
    from_: str,
    to: str,
    carrier: str,
    metadata: dict[str, Any] | None = None,
) -> Call:
    """A new call in state ``dialing``, in the registry (``GET /v1/calls`` lists it)."""
    call = Call(
        services,
        call_ref=call_ref,
        app=app,
        direction=direction,
        from_=from_,
        to=to,
        carrier=carrier,
        metadata=metadata,
    )
    services.registry.add(call)
    services.registry.console.open(call)
    return call
