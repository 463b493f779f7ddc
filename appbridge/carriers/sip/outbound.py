"""Outbound SIP calls (``POST /v1/calls`` with ``carrier = "sip:<trunk>"``; docs/sip.md).

The UAC call flow lives in ``uac.py`` (shared with transfer party legs, ``party.py``); this
module adds what a Call needs around it (RFC 3261 §13.2):

1. The request is checked (:func:`parse_call_request`): a known app, a configured trunk, E.164
   ``to``/``from``, ``metadata`` a JSON object of at most 16 KiB, an optional ``timeout_s``.
2. A :class:`~appbridge.calls.call.Call` (direction ``outbound``) is registered at once with the
   state ``dialing``, so ``GET``/``DELETE /v1/calls/{callRef}`` work before the answer. An RTP
   port is taken and the INVITE goes to the trunk with an SDP offer (RFC 3264 §5), over UDP, or
   over TCP or TLS for ``transport = "tcp"``/``"tls"`` trunks (one connection per trunk
   address, RFC 3261 §18.1.1, RFC 5923; a failed connect or a refused certificate answers 502
   ``trunk_unreachable``).
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
6. After the answer: BYE from the callee ends the call (``caller_hangup``); the
   app ending it sends our BYE. A re-INVITE from the callee is answered per RFC 3264 §8.
   Transfers of the call (``SipLeg.dial_party``/``refer``) go through ``party.py``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from appbridge.calls import intake
from appbridge.carriers.requests import CallRequest, OutboundError, parse_call_request
from appbridge.carriers.sip.leg import RtpPortPool, SipLeg
from appbridge.carriers.sip.party import SipCallSignalling
from appbridge.carriers.sip.transport import SipTransport
from appbridge.carriers.sip.uac import ALLOW, SipUac, UacDial, UacError

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.carriers.services import CarrierServices
    from appbridge.config import SipConfig
    from appbridge.protocol.session_v1 import EndReason

log = logging.getLogger(__name__)

__all__ = ["ALLOW", "CallRequest", "OutboundError", "SipOutbound", "parse_call_request"]


class _CallOwner:
    """An outbound Call waiting for its callee (``uac.DialOwner``; module doc, steps 2-6)."""

    def __init__(self, outbound: SipOutbound, call: Call) -> None:
        self.outbound = outbound
        self.call = call
        self.label = f"call {call.call_ref}"

    def wants_answer(self) -> bool:
        return not self.call.over

    def ringing(self, d: UacDial) -> None:
        self.call.carrier_ringing()

    def answered(self, d: UacDial, leg: SipLeg) -> None:
        call = self.call
        self.outbound.gw.registry.clear_final_fields(call.call_ref)
        call.carrier_answered()
        leg.signalling = self.outbound.signalling_for(d, call)
        call.spawn(self._connect(d, leg), "sip-outbound-connect")

    async def _connect(self, d: UacDial, leg: SipLeg) -> None:
        """The callee answered: now the app is dialed and the session opens (module doc)."""
        call = self.call
        answered = await call.connect_app()
        if call.over or d.bye_sent:
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
        if not call.over:
            call.spawn(call.end(reason, carrier_gone=True), f"end-{outcome}")

    def remote_bye(self, d: UacDial) -> None:
        if d.leg is not None:
            d.leg.remote_hangup(self.call.on_carrier_hangup)  # the Call, or its bridge
        else:
            self.call.on_carrier_hangup()


class SipOutbound(SipUac):
    """Outbound calls on the shared UAC (``uac.py``); fed by ``SipInbound`` for its Call-IDs."""

    def __init__(
        self, gw: CarrierServices, transport: SipTransport, cfg: SipConfig, pool: RtpPortPool
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
        if intake.refusal(gw) is not None:
            raise OutboundError(503, "unavailable", "the gateway takes no new calls right now")
        try:
            d = await self.prepare(trunk, to_user=req.to, from_user=req.from_)
        except UacError as exc:
            status = 503 if exc.code == "unavailable" else 502
            raise OutboundError(status, exc.code, exc.message) from exc
        call = intake.open_call(
            gw,
            call_ref="CA" + uuid.uuid4().hex,
            app=req.app,
            direction="outbound",
            from_=req.from_,
            to=req.to,
            carrier="sip",
            metadata=req.metadata,
        )
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
