"""What a carrier needs of the gateway: the engine's services, admission, and its neighbours.

Carriers type against this protocol, not the gateway, so they never import it; the running
``Gateway`` has every member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from appbridge.calls.services import CallServices

if TYPE_CHECKING:
    from appbridge.carriers.sip.inbound import SipService
    from appbridge.carriers.twilio.rest import TwilioRestClient
    from appbridge.carriers.twilio_outbound import TwilioOutbound


class CarrierServices(CallServices, Protocol):
    sip: SipService | None
    twilio_rest: TwilioRestClient | None
    #: Calls placed through Twilio's REST API, made on first use (carriers/twilio_outbound.py).
    twilio_outbound: TwilioOutbound | None

    def admission_refusal(self) -> str | None:
        """Why a new call must be refused now (draining, the call cap, the CPU limit)."""
        ...
