"""Outbound SIP calls (``POST /v1/calls`` with ``carrier = "sip:<trunk>"``, INTERFACES §5).

The UAC call flow lives in ``uac.py`` (shared with transfer party legs, ``party.py``); this
module adds what a Call needs around it (RFC 3261 §13.2):

1. The request is checked (:func:`parse_call_request`): a known app, a configured trunk, E.164
   ``to``/``from``, ``metadata`` a JSON object of at most 16 KiB, an optional ``timeout_s``.
2. A :class:`~appbridge.calls.call.Call` (direction ``outbound``) is registered at once with the
   state ``dialing``, so ``GET``/``DELETE /v1/calls/{callRef}`` work before the answer. An RTP
   port is taken and the INVITE goes to the trunk with an SDP offer (RFC 3264 §5), over UDP, or
   over TCP for ``transport = "tcp"`` trunks (one connection per trunk address, RFC 3261
   §18.1.1; a failed connect answers 502 ``trunk_unreachable``).
3. Provisional responses (180/183) set the state ``ringing``. A 401/407 is answered once with
   digest credentials of the trunk (RFC 3261 §22.2, ``digest.py``), on a new INVITE with the
   CSeq one higher; the transaction layer already ACKed the challenge (§17.1.1.3).
4. On the 2xx: the ACK (§13.2.2.4), the answer read (RFC 3264 §7), then the app is dialed and
   the :class:`~.leg.SipLeg` attached, so ``session.start`` goes out with direction
   ``outbound`` and the request's metadata: the app session opens only once the callee answered.
5. Outcomes before an answer have no session, so the protocol's end reasons do not apply; the
   call record keeps one of these in ``state`` (and ``endReason``), with ``sipStatus``:

   - ``busy``: 486 Busy Here, 600 Busy Everywhere, 603 Decline;
   - ``no-answer``: no answer within ``timeout_s`` (we CANCEL, §9.1), or 408/480 from the far end;
   - ``failed``: any other final response, no response at all (Timer B), a failed challenge, an
     unusable SDP answer, or an app that cannot be reached after the answer;
   - ``canceled``: the call was hung up (``DELETE``) before the answer; we CANCEL.

   A CANCEL waits for the first provisional response, as §9.1 asks. A 2xx that arrives after we
   gave up is ACKed and ended with a BYE (§15).
6. After the answer: BYE from the callee ends the call (``caller_hangup``, INTERFACES §6); the
   app ending it sends our BYE. A re-INVITE from the callee is answered per RFC 3264 §8.
   Transfers of the call (``SipLeg.dial_party``/``refer``) go through ``party.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appbridge.carriers.sip.leg import RtpPortPool, SipLeg
from appbridge.carriers.sip.party import SipCallSignalling
from appbridge.carriers.sip.transport import SipTransport
from appbridge.carriers.sip.uac import ALLOW, SipUac, UacDial, UacError

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.config import AppConfig, SipConfig, SipTrunk
    from appbridge.gateway import Gateway
    from appbridge.protocol.session_v1 import EndReason

log = logging.getLogger(__name__)

__all__ = ["ALLOW", "CallRequest", "OutboundError", "SipOutbound", "parse_call_request"]
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


def parse_call_request(gw: Gateway, body: Any) -> CallRequest:
    """Check a decoded JSON body (INTERFACES §5); raises :class:`OutboundError` (400)."""
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


class _CallOwner:
    """An outbound Call waiting for its callee (``uac.DialOwner``; module doc, steps 2-6)."""

    def __init__(self, outbound: SipOutbound, call: Call) -> None:
        self.outbound = outbound
        self.call = call
        self.label = f"call {call.call_ref}"

    def wants_answer(self) -> bool:
        return self.call.state not in ("ending", "ended")

    def ringing(self, d: UacDial) -> None:
        if self.call.state == "dialing":
            self.call.state = "ringing"

    def answered(self, d: UacDial, leg: SipLeg) -> None:
        call = self.call
        self.outbound.gw.registry.clear_final_fields(call.call_ref)
        call.state = "answered"
        leg.signalling = self.outbound.signalling_for(d, call)
        call.spawn(self._connect(d, leg), "sip-outbound-connect")

    async def _connect(self, d: UacDial, leg: SipLeg) -> None:
        """The callee answered: now the app is dialed and the session opens (module doc)."""
        call = self.call
        answered = await call.connect_app()
        if call.state in ("ending", "ended") or d.bye_sent:
            return
        if not answered:
            self.outbound.gw.registry.set_final_fields(
                call.call_ref, {"state": "failed", "endReason": "app_unreachable"}
            )
            self.outbound.send_bye(d)
            await call.end("error", carrier_gone=True)
            return
        call.attach_carrier(leg)
        log.info("call %s: answered; session started", call.call_ref)

    def failed(self, d: UacDial, outcome: str, status: int | None, reason: EndReason) -> None:
        call = self.call
        fields: dict[str, Any] = {"state": outcome, "endReason": outcome, "sipStatus": status}
        self.outbound.gw.registry.set_final_fields(call.call_ref, fields)
        if call.state not in ("ending", "ended"):
            call.spawn(call.end(reason, carrier_gone=True), f"end-{outcome}")

    def remote_bye(self, d: UacDial) -> None:
        if d.leg is not None:
            d.leg.remote_hangup(self.call.on_carrier_hangup)  # the Call, or its bridge
        else:
            self.call.on_carrier_hangup()


class SipOutbound(SipUac):
    """Outbound calls on the shared UAC (``uac.py``); fed by ``SipInbound`` for its Call-IDs."""

    def __init__(
        self, gw: Gateway, transport: SipTransport, cfg: SipConfig, pool: RtpPortPool
    ) -> None:
        super().__init__(
            gw.clock, transport, cfg, pool, after_slice=gw.media_clock.call_after_slice
        )
        self.gw = gw
        self._watchers: set[asyncio.Task[None]] = set()

    async def place(self, req: CallRequest) -> Call:
        """Register the call and send the INVITE; the answer is awaited in the background."""
        trunk = req.trunk
        assert trunk is not None
        gw = self.gw
        if gw.admission_refusal() is not None:
            gw.registry.total_rejected += 1
            raise OutboundError(503, "unavailable", "the gateway takes no new calls right now")
        try:
            d = await self.prepare(trunk, to_user=req.to, from_user=req.from_)
        except UacError as exc:
            status = 503 if exc.code == "unavailable" else 502
            raise OutboundError(status, exc.code, exc.message) from exc
        from appbridge.calls.call import Call

        call = Call(
            gw,
            call_ref="CA" + uuid.uuid4().hex,
            app=req.app,
            direction="outbound",
            from_=req.from_,
            to=req.to,
            carrier="sip",
            metadata=req.metadata,
        )
        gw.registry.add(call)
        # Ended before the answer by anyone else (DELETE, shutdown): that is a cancel.
        gw.registry.set_final_fields(call.call_ref, {"state": "canceled", "endReason": "canceled"})
        self.launch(d, _CallOwner(self, call), req.timeout_s)
        self.transport.rearm()
        watcher = asyncio.get_running_loop().create_task(self._watch(d, call))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return call

    def signalling_for(self, d: UacDial, call: Call) -> SipCallSignalling:
        """Transfers of this outbound call (``party.py``): its trunk, its dialog."""
        return SipCallSignalling(
            uac=self,
            trunks=self.cfg.trunks,
            trunk=d.trunk,
            label=f"call {call.call_ref}",
            dialog=lambda: d.dialog,
            send=lambda request: self.transport.send_request(request, self.dialog_peer(d)),
            end_call=lambda: self.send_bye(d),
            referred_by=f"<{d.contact.uri}>",
        )

    async def _watch(self, d: UacDial, call: Call) -> None:
        """When the call ends: CANCEL or BYE what is still up and free the RTP port."""
        await call.ended.wait()
        self.abandon(d)

    def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        super().close()
