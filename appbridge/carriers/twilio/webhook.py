"""``POST /twilio/voice``: Twilio's voice webhook, answered with TwiML.

The steps are those of docs/ARCHITECTURE.md, "A call from Twilio, step by step": the
``X-Twilio-Signature`` check over ``public_url + /twilio/voice`` (docs/configuration.md,
``[carriers.twilio]``), admission, routing by ``To``, dialing the app, and then
``<Connect><Stream>``. The webhook waits for the app, not for the stream: when Twilio never opens
it the call is ended after :data:`STREAM_WAIT_S`. In a cluster a repeated webhook, on any node,
gets the same TwiML and dials nothing (docs/scaling.md, "Twilio behind a load balancer"). The
HTTP framing (body size, content type, form parsing) is the route's, in http/routes_twilio.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from appbridge.calls import intake
from appbridge.carriers.twilio.twiml import (
    stream_url,
    twiml_hangup,
    twiml_reject,
    twiml_say_hangup,
    twiml_stream,
)
from appbridge.cluster import cluster_of
from appbridge.protocol.signing import verify_twilio

if TYPE_CHECKING:
    from appbridge.carriers.services import CarrierServices

log = logging.getLogger(__name__)

STREAM_WAIT_S: Final = 15.0


async def handle_voice_webhook(
    gw: CarrierServices, url: str, form: dict[str, str], signature: str | None
) -> tuple[int, str, bytes]:
    """Returns (status, content_type, body) for ``POST /twilio/voice``."""
    cfg = gw.config.twilio
    if cfg is None:
        return 404, "application/json", b'{"error":"not_found","message":"Twilio is not enabled"}'
    if cfg.auth_token and not verify_twilio(cfg.auth_token, url, form, signature or ""):
        gw.metrics.bad_signatures += 1
        return (
            403,
            "application/json",
            b'{"error":"forbidden","message":"X-Twilio-Signature does not match"}',
        )
    call_sid = form.get("CallSid", "")
    if not call_sid:
        return 400, "application/json", b'{"error":"bad_request","message":"CallSid is missing"}'
    from_, to = form.get("From", ""), form.get("To", "")
    refused = intake.refusal(gw)
    if refused is not None:
        log.warning("twilio: call %s refused: %s", call_sid, refused)
        return 200, "text/xml", twiml_reject("busy").encode()
    params = {"from": from_, "to": to, "callRef": call_sid}
    cluster = cluster_of(gw)
    existing = gw.registry.get(call_sid)
    if existing is not None:
        if cluster is not None:  # a repeated webhook: the same answer, no second call
            return 200, "text/xml", _stream_twiml(gw, params)
        return 409, "application/json", b'{"error":"conflict","message":"call already exists"}'
    app = gw.config.route(to)
    if app is None:
        log.info("twilio: no app for %s; rejecting", to)
        return 200, "text/xml", twiml_say_hangup("This number is not in service.").encode()
    # Behind a load balancer the same webhook may reach another node too: the first claim of
    # the CallSid in Redis wins; without Redis each node dedupes its own (docs/scaling.md).
    if cluster is not None:
        if await cluster.claim_call_sid(call_sid) is False:
            log.info("twilio: call %s is already taken by another node; not dialling", call_sid)
            return 200, "text/xml", _stream_twiml(gw, params)
        if gw.registry.get(call_sid) is not None:  # a copy here got in while Redis answered
            return 200, "text/xml", _stream_twiml(gw, params)
    call = intake.open_call(
        gw, call_ref=call_sid, app=app, direction="inbound", from_=from_, to=to, carrier="twilio"
    )
    answered = await call.connect_app()
    if not answered:
        await call.end("error")
        return 200, "text/xml", twiml_hangup().encode()
    call.spawn(_await_stream(call), "await-stream")
    return 200, "text/xml", _stream_twiml(gw, params)


def _stream_twiml(gw: CarrierServices, params: dict[str, str]) -> bytes:
    return twiml_stream(stream_url(gw.config.server.base_url()), params).encode()


async def _await_stream(call: Any) -> None:
    await asyncio.sleep(STREAM_WAIT_S)
    if call.leg is None:
        log.warning("call %s: Twilio never opened the media stream", call.call_ref)
        await call.end("error")
