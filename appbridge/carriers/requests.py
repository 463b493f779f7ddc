"""``POST /v1/calls``: the request body, checked, and the errors it is answered with.

One request places a call on either carrier (docs/configuration.md, `[api]`): ``carrier`` is
``"sip:<trunk>"`` or ``"twilio"``. Both carriers' outbound code takes the same checked request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appbridge.carriers.services import CarrierServices
    from appbridge.config import AppConfig, SipTrunk
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
MAX_METADATA_BYTES = 16 * 1024
E164_RE = re.compile(r"\+[1-9][0-9]{1,14}")
REQUEST_KEYS = frozenset({"app", "to", "from", "carrier", "metadata", "timeout_s"})


class OutboundError(Exception):
    """A call request that cannot be placed: ``status`` is the HTTP answer, ``code`` its name."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A checked ``POST /v1/calls`` body."""

    app: AppConfig
    to: str
    from_: str
    carrier: str  # "sip" or "twilio"
    trunk: SipTrunk | None
    metadata: dict[str, Any]
    timeout_s: float


def parse_call_request(gw: CarrierServices, body: Any) -> CallRequest:
    """Check a decoded JSON body (docs/configuration.md, `[api]`); raises
    :class:`OutboundError` (400)."""
    if not isinstance(body, dict):
        raise OutboundError(400, "bad_request", "the body must be a JSON object")
    unknown = sorted(set(body) - REQUEST_KEYS)
    if unknown:
        raise OutboundError(400, "bad_request", f"unknown field(s): {', '.join(unknown)}")
    app_ref = body.get("app")
    if not isinstance(app_ref, str) or not app_ref:
        raise OutboundError(400, "bad_request", "'app' must be the ref of a configured app")
    app = gw.config.apps.get(app_ref)
    if app is None:
        raise OutboundError(400, "unknown_app", f"no app with ref {app_ref!r}")
    numbers: dict[str, str] = {}
    for key in ("to", "from"):
        value = body.get(key)
        if not isinstance(value, str) or E164_RE.fullmatch(value) is None:
            raise OutboundError(
                400, "bad_request", f"'{key}' must be an E.164 number such as +15550001111"
            )
        numbers[key] = value
    metadata = body.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise OutboundError(400, "bad_request", "'metadata' must be a JSON object")
    size_bytes = len(json.dumps(metadata, separators=(",", ":")).encode())
    if size_bytes > MAX_METADATA_BYTES:
        raise OutboundError(
            400, "bad_request", f"'metadata' is {size_bytes} bytes; at most {MAX_METADATA_BYTES}"
        )
    timeout = body.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise OutboundError(400, "bad_request", "'timeout_s' must be a number of seconds")
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise OutboundError(400, "bad_request", f"'timeout_s' must be in (0, {MAX_TIMEOUT_S:g}]")
    carrier = body.get("carrier")
    if carrier == "twilio":
        # Placed through Twilio's REST API (carriers/twilio_outbound.py), which needs its token.
        if gw.config.twilio is None or not gw.config.twilio.auth_token:
            raise OutboundError(
                400, "unknown_carrier", "Twilio calls need [carriers.twilio] with an auth_token"
            )
        return CallRequest(
            app=app,
            to=numbers["to"],
            from_=numbers["from"],
            carrier="twilio",
            trunk=None,
            metadata=metadata,
            timeout_s=float(timeout),
        )
    if not isinstance(carrier, str) or not carrier.startswith("sip:"):
        raise OutboundError(400, "bad_request", '\'carrier\' must be "sip:<trunk>" or "twilio"')
    name = carrier.removeprefix("sip:")
    sip = gw.config.sip
    trunk = next((t for t in sip.trunks if t.name == name), None) if sip else None
    if trunk is None:
        raise OutboundError(400, "unknown_trunk", f"no SIP trunk named {name!r}")
    return CallRequest(
        app=app,
        to=numbers["to"],
        from_=numbers["from"],
        carrier="sip",
        trunk=trunk,
        metadata=metadata,
        timeout_s=float(timeout),
    )
