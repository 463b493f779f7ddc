"""Inbound SIP calls: the UAS call flow of docs/sip.md, "Inbound calls", over the transport and the
cores.

Flow of one call (RFC 3261 §13.3, RFC 3264 §6):

1. INVITE from an allowed source (a trunk's ``host`` or ``allow`` network; loopback only when no
   trunk is configured; docs/sip.md, "Trunks and who may call"), or one that arrived on a trunk's
   registration (``register_client.py``), else 403. The Request-URI user part routes the call
   (``Config.route``; the To header's when the Request-URI is our registered Contact), else 404.
   The SDP offer is answered with PCMU or PCMA plus telephone-event; no common codec is 488
   (RFC 3264 §6), a broken body 400. SRTP follows the trunk's ``srtp`` (``follow`` the offer's
   profile with no trunk; docs/sip.md, "SRTP (SDES)"); its refusals are 488 with a 399 Warning
   saying why (RFC 3261 §20.43).
2. 100 Trying at once, an RTP port from ``rtp_ports``, then 180 Ringing (with our To tag) while
   the app is dialed through its 2.5 s retry window (docs/protocol-session-v1.md,
   "Connection and frames").
3. When the app answers, the :class:`~.leg.SipLeg` is attached (the engine sends
   ``session.start``) and the 200 with the SDP answer goes out at once, retransmitted until the
   ACK (§13.3.1.4). An app that cannot be reached (and no fallback message): 480.
4. CANCEL before the 200: 200 to the CANCEL, 487 to the INVITE (§9.2), the call ends.
5. BYE from the caller: 200, then ``on_carrier_hangup`` (``caller_hangup``). The app ending the
   call sends our BYE (``SipLeg.hangup``).
6. A re-INVITE from the caller (their hold: sendonly/inactive, or resume) is answered per
   RFC 3264 §8.4 and the leg follows the new description. INFO with ``application/dtmf-relay``
   is a keypress.
7. OPTIONS out of a dialog (a trunk's or a dispatcher's probe) gets 200 while new calls are taken
   and 503 with Retry-After while admission refuses them (draining, ``max_calls``, the CPU limit),
   so a proxy in front routes around the node (docs/sip.md, "OPTIONS"); in a dialog it gets 200.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from appbridge.calls import intake
from appbridge.carriers.sip.contact import contact_for
from appbridge.carriers.sip.dialog import AckTimeout, AnswerRetransmitter, Dialog, DialogError
from appbridge.carriers.sip.extensions import unsupported_required
from appbridge.carriers.sip.headers import NameAddr, SipParseError
from appbridge.carriers.sip.leg import LEG_CODECS, RtpPortPool, RtpProtocol, SipLeg, open_rtp
from appbridge.carriers.sip.message import Request, Response, make_response, new_tag
from appbridge.carriers.sip.numbers import called_number, caller_number, to_header_number
from appbridge.carriers.sip.offer_answer import NegotiatedAudio, OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.outbound import SipOutbound
from appbridge.carriers.sip.party import SipCallSignalling, trunk_for_source
from appbridge.carriers.sip.register_client import SipRegistrations
from appbridge.carriers.sip.sdes import SrtpPolicy
from appbridge.carriers.sip.sdp import SdpError, SessionDescription
from appbridge.carriers.sip.transaction import Send, TransactionLayer
from appbridge.carriers.sip.transport import (
    SDP_TYPE,
    Peer,
    SipTransport,
    is_stream,
    via_transport,
)
from appbridge.carriers.sip.uac import ALLOW

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.carriers.services import CarrierServices
    from appbridge.config import SipConfig, SipTrunk

log = logging.getLogger(__name__)

DIGITS = set("0123456789*#ABCD")
_ALLOWED = frozenset(method.strip() for method in ALLOW.split(","))
#: Seconds a refused caller (or a probing proxy) is asked to wait (RFC 3261 §21.5.4, §20.33).
RETRY_AFTER_S = "5"


@dataclass(eq=False)
class SipCall:
    """The SIP side of one inbound call."""

    invite: Request
    peer: Peer
    to_tag: str
    call: Call
    negotiator: SdpNegotiator
    offer: SessionDescription
    contact: NameAddr
    dialog: Dialog | None = None
    leg: SipLeg | None = None
    rtp_port: int | None = None
    rtp: RtpProtocol | None = None
    answered: bool = False  # the 200 went out
    finished: bool = False  # a final response or BYE ended the SIP side
    retransmitter: AnswerRetransmitter | None = None
    cleanup: asyncio.Task[None] | None = field(default=None, repr=False)
    srtp: SrtpPolicy = "follow"
    trunk: SipTrunk | None = None  # decided once, at the INVITE: its srtp, its transfers


class SipInbound:
    """The transaction user for inbound calls (module doc)."""

    def __init__(self, gw: CarrierServices, transport: SipTransport, cfg: SipConfig) -> None:
        self.gw = gw
        self.transport = transport
        self.cfg = cfg
        self.pool = RtpPortPool(*cfg.rtp_ports)
        self.calls: dict[str, SipCall] = {}  # by Call-ID
        self.rejected: dict[int, int] = {}  # status → count
        self.outbound: SipOutbound | None = None  # outbound calls' messages go there first
        self.registrations: SipRegistrations | None = None  # REGISTER answers go there first

    # -- admission ---------------------------------------------------------------------------
    def source_allowed(self, host: str) -> bool:
        """The trunks' hosts and ``allow`` networks; loopback with no trunk (docs/sip.md)."""
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        trunks = self.cfg.trunks
        if not trunks:
            return addr.is_loopback
        for trunk in trunks:
            if trunk.host == host:
                return True
            for cidr in trunk.allow:
                try:
                    if addr in ipaddress.ip_network(cidr, strict=False):
                        return True
                except ValueError:
                    continue
        return False

    # -- TransactionUser -------------------------------------------------------------------------
    def on_message(self, message: Request | Response, peer: Peer, now: float) -> None:
        regs = self.registrations
        if regs is not None and regs.on_message(message, peer, now):
            return
        if isinstance(message, Request) and message.method in _ALLOWED:
            unsupported = unsupported_required(message)
            if unsupported:  # RFC 3261 §8.2.2.3 (after §8.2.1's 405), calls in both directions
                headers = [("Unsupported", ", ".join(unsupported))]
                self.transport.respond(message, peer, 420, headers=headers)
                return
        if self.outbound is not None and self.outbound.on_message(message, peer, now):
            return
        if isinstance(message, Response):
            return  # responses to our BYE: nothing more to do (a stray 2xx needs no ACK here)
        method = message.method
        try:
            if method == "INVITE":
                if message.to.tag is None:
                    self._new_invite(message, peer)
                else:
                    self._reinvite(message, peer)
            elif method == "ACK":
                self._ack(message)
            elif method == "CANCEL":
                self._cancel(message, peer)
            elif method == "BYE":
                self._bye(message, peer)
            elif method == "OPTIONS":
                self._options(message, peer)
            elif method == "INFO":
                self._info(message, peer)
            else:
                self._respond(message, peer, 405, headers=[("Allow", ALLOW)])
        except SipParseError as exc:
            if method != "ACK":
                self._respond(message, peer, 400, exc.reason)

    def on_timeout(self, request: Request, now: float) -> None:
        if self.registrations is not None and self.registrations.on_timeout(request, now):
            return
        if self.outbound is not None and self.outbound.on_timeout(request, now):
            return
        log.debug("sip: %s %s timed out", request.method, request.call_id)

    def next_deadline(self) -> float | None:
        deadlines = [
            d
            for c in self.calls.values()
            if c.retransmitter is not None and (d := c.retransmitter.next_deadline()) is not None
        ]
        if self.outbound is not None and (d := self.outbound.next_deadline()) is not None:
            deadlines.append(d)  # dials' no-answer deadlines, REFERs' NOTIFY waits
        return min(deadlines, default=None)

    def on_timer(self, now: float) -> None:
        if self.outbound is not None:
            self.outbound.on_timer(now)
        for sc in list(self.calls.values()):
            rt = sc.retransmitter
            if rt is None or (d := rt.next_deadline()) is None or d > now:
                continue
            for effect in rt.on_timer(now):
                if isinstance(effect, Send):
                    self.transport.send_to(effect.data, effect.peer)
                elif isinstance(effect, AckTimeout):
                    log.warning("call %s: no ACK for our 200; hanging up", sc.call.call_ref)
                    sc.retransmitter = None
                    self._send_bye(sc)
                    sc.call.spawn(sc.call.end("error", carrier_gone=True), "end-no-ack")

    # -- requests --------------------------------------------------------------------------------
    def _respond(
        self,
        request: Request,
        peer: Peer,
        status: int,
        reason: str | None = None,
        *,
        to_tag: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> None:
        if status >= 400:
            self.rejected[status] = self.rejected.get(status, 0) + 1
        self.transport.respond(
            request, peer, status, reason, to_tag=to_tag, headers=headers, body=body
        )

    def _options(self, options: Request, peer: Peer) -> None:
        """OPTIONS (RFC 3261 §11): out of a dialog it is a probe of whether this node takes calls,
        so it answers 503 with Retry-After whenever a new INVITE would be refused, and a
        dispatcher that probes with OPTIONS stops sending calls here (docs/sip.md, "OPTIONS").
        With a To tag it is a keepalive of a live call, which a drain must not cut: always 200.
        The 503 is not counted in ``rejected``: no call was offered."""
        headers = [("Allow", ALLOW), ("Accept", SDP_TYPE)]
        if options.to.tag is None and self.gw.admission_refusal() is not None:
            self.transport.respond(
                options, peer, 503, headers=[("Retry-After", RETRY_AFTER_S), *headers]
            )
            return
        self._respond(options, peer, 200, headers=headers)

    def _contact(self, request: Request, peer: Peer) -> NameAddr:
        host = self.cfg.public_address or self.transport.local_host
        if host in ("0.0.0.0", "::"):
            host = request.uri.host or "127.0.0.1"
        return contact_for(host, str(peer[0]), self.transport.local_port(str(peer[0])), request)

    def _new_invite(self, invite: Request, peer: Peer) -> None:
        call_id = invite.call_id
        if call_id in self.calls:
            return  # a retransmission the transaction layer did not absorb (a new branch)
        via = invite.top_via
        registered = self._registered(invite, peer)
        if registered is None and not self.source_allowed(via.received or via.host):
            self._respond(invite, peer, 403)
            return
        gw = self.gw
        config = gw.config
        by_contact = registered is not None and registered[1]
        called = to_header_number(invite) if by_contact else called_number(invite)
        app = config.route(called or "")
        if app is None:
            self._respond(invite, peer, 404)
            return
        if intake.refusal(gw) is not None:
            self._respond(invite, peer, 503, headers=[("Retry-After", RETRY_AFTER_S)])
            return
        if not invite.body:
            self._respond(invite, peer, 488, "An SDP offer is required")
            return
        try:
            offer = SessionDescription.parse(invite.body)
        except SdpError:
            self._respond(invite, peer, 400, "Malformed SDP")
            return
        contact = self._contact(invite, peer)
        host = contact.uri.host
        trunk = (
            registered[0]
            if registered is not None
            else trunk_for_source(self.cfg.trunks, via.received or via.host)
        )
        srtp: SrtpPolicy = trunk.srtp if trunk is not None else "follow"
        negotiator = SdpNegotiator(
            local_address=host,
            rtp_port=0,
            public_address=self.cfg.public_address,
            codecs=LEG_CODECS,
            srtp=srtp,
        )
        try:
            negotiator.create_answer(offer)  # a dry run: 488 now rather than after ringing
        except OfferAnswerError as exc:
            self._respond(invite, peer, 488, headers=self._warning(exc, host))
            return
        except SdpError:
            self._respond(invite, peer, 488)
            return
        self._respond(invite, peer, 100)
        call = intake.open_call(
            gw,
            call_ref="CA" + uuid.uuid4().hex,
            app=app,
            direction="inbound",
            from_=caller_number(invite) or "",
            to=called or "",
            carrier="sip",
        )
        sc = SipCall(
            invite, peer, new_tag(), call, negotiator, offer, contact, srtp=srtp, trunk=trunk
        )
        self.calls[call_id] = sc
        sc.cleanup = asyncio.get_running_loop().create_task(self._cleanup_after(sc))
        call.spawn(self._answer(sc), "sip-answer")

    async def _answer(self, sc: SipCall) -> None:
        """Ring while the app is dialed, then attach the leg and send the 200 (module doc)."""
        call = sc.call
        bind_host = self.transport.local_host
        opened = await open_rtp(bind_host, self.pool, self.gw.clock)
        if sc.finished:
            if opened is not None:
                opened[1].close()
                self.pool.release(opened[0], self.gw.clock.now())
            return
        if opened is None:
            self._final(sc, 503, "No RTP port available")
            await call.end("error")
            return
        sc.rtp_port, sc.rtp = opened
        self._respond(sc.invite, sc.peer, 180, to_tag=sc.to_tag, headers=self._contact_hdr(sc))
        answered = await call.connect_app()
        if sc.finished:
            return
        if not answered:
            self._final(sc, 480)
            await call.end("error")
            return
        negotiator = SdpNegotiator(
            local_address=sc.contact.uri.host,
            rtp_port=sc.rtp_port,
            public_address=self.cfg.public_address,
            codecs=LEG_CODECS,
            srtp=sc.srtp,
        )
        sc.negotiator = negotiator
        answer, negotiated = negotiator.create_answer(sc.offer)
        rtp = sc.rtp
        leg = SipLeg(
            negotiated,
            clock=self.gw.clock,
            defer=self.gw.media_clock.call_after_slice,
            send_datagram=rtp.send,
            on_hangup=lambda: self._hangup_from_app(sc),
        )
        sc.leg = leg
        rtp.leg = leg
        sc.dialog = Dialog.from_uas(
            sc.invite, sc.to_tag, sc.contact, transport=via_transport(sc.peer)
        )
        leg.signalling = self._signalling(sc)
        call.attach_carrier(leg)
        self._send_answer(sc, sc.invite, answer.serialize())
        sc.answered = True

    def _registered(self, invite: Request, peer: Peer) -> tuple[SipTrunk, bool] | None:
        regs = self.registrations
        return regs.trunk_for_invite(invite, peer) if regs is not None else None

    def _signalling(self, sc: SipCall) -> SipCallSignalling | None:
        """Transfers of this call (``party.py``): the trunk it came from, its dialog."""
        uac = self.outbound
        if uac is None:
            return None
        return SipCallSignalling(
            uac=uac,
            trunks=self.cfg.trunks,
            trunk=sc.trunk,
            label=f"call {sc.call.call_ref}",
            dialog=lambda: sc.dialog if not sc.finished else None,
            send=lambda request: self.transport.send_request(request, sc.peer),
            end_call=lambda: self._send_bye(sc),
            referred_by=f"<{sc.contact.uri}>",
        )

    @staticmethod
    def _warning(exc: OfferAnswerError, host: str) -> list[tuple[str, str]] | None:
        """A 399 Warning (RFC 3261 §20.43) with an SRTP refusal's reason, else nothing."""
        if exc.warning is None:
            return None
        return [("Warning", f'399 {host} "{exc.warning}"')]

    def _contact_hdr(self, sc: SipCall) -> list[tuple[str, str]]:
        return [("Contact", str(sc.contact)), ("Allow", ALLOW)]

    def _send_answer(self, sc: SipCall, invite: Request, sdp: bytes) -> None:
        response = make_response(
            invite,
            200,
            to_tag=sc.to_tag,
            headers=self._contact_hdr(sc),
            body=sdp,
            content_type=SDP_TYPE,
        )
        self.transport.send_response(response, sc.peer)
        sc.retransmitter = AnswerRetransmitter(
            response,
            reliable=is_stream(sc.peer),
            now=self.gw.clock.now(),
            peer=sc.peer,
            timers=self.transport.layer.timers,
        )
        self.transport.rearm()

    def _final(self, sc: SipCall, status: int, reason: str | None = None) -> None:
        if sc.finished or sc.answered:
            return
        sc.finished = True
        self._respond(sc.invite, sc.peer, status, reason, to_tag=sc.to_tag)

    def _find(self, request: Request) -> SipCall | None:
        sc = self.calls.get(request.call_id)
        if sc is None:
            return None
        if request.to.tag is not None and request.to.tag != sc.to_tag:
            return None
        return sc

    def _ack(self, ack: Request) -> None:
        sc = self._find(ack)
        if sc is not None and sc.retransmitter is not None and sc.retransmitter.on_ack(ack):
            sc.retransmitter = None

    def _cancel(self, cancel: Request, peer: Peer) -> None:
        txn = self.transport.layer.invite_for_cancel(cancel)
        sc = self.calls.get(cancel.call_id)
        if txn is None or sc is None:
            self._respond(cancel, peer, 481)
            return
        self._respond(cancel, peer, 200)
        if sc.answered or sc.finished:
            return  # §9.2: the 200 already went out; the caller sends BYE
        self._final(sc, 487)
        sc.call.spawn(sc.call.end("caller_hangup", carrier_gone=True), "end-cancelled")

    def _bye(self, bye: Request, peer: Peer) -> None:
        sc = self._find(bye)
        if sc is None or sc.dialog is None:
            self._respond(bye, peer, 481)
            return
        try:
            sc.dialog.on_request(bye)
        except DialogError as exc:
            self._respond(bye, peer, exc.status, exc.reason)
            return
        self._respond(bye, peer, 200)
        sc.finished = True
        sc.retransmitter = None
        if self.outbound is not None:
            self.outbound.refers.abort(bye.call_id, "the call ended during the REFER")
        if sc.leg is not None:
            sc.leg.remote_hangup(sc.call.on_carrier_hangup)  # the Call, or its bridge
        else:
            sc.call.on_carrier_hangup()

    def _reinvite(self, invite: Request, peer: Peer) -> None:
        sc = self._find(invite)
        if sc is None or sc.dialog is None or sc.leg is None:
            self._respond(invite, peer, 481)
            return
        try:
            sc.dialog.on_request(invite)
        except DialogError as exc:
            self._respond(invite, peer, exc.status, exc.reason)
            return
        if not invite.body:
            self._respond(invite, peer, 488, "An SDP offer is required")
            return
        try:
            offer = SessionDescription.parse(invite.body)
            answer, negotiated = sc.negotiator.create_answer(offer)
        except SdpError:
            self._respond(invite, peer, 400, "Malformed SDP")
            return
        except OfferAnswerError as exc:
            self._respond(invite, peer, 488, headers=self._warning(exc, sc.contact.uri.host))
            return
        self._apply(sc, negotiated)
        self._send_answer(sc, invite, answer.serialize())

    def _apply(self, sc: SipCall, negotiated: NegotiatedAudio) -> None:
        assert sc.leg is not None
        sc.leg.update_media(negotiated)
        log.info(
            "call %s: media now %s (%s)",
            sc.call.call_ref,
            negotiated.local_direction,
            "held by the caller" if negotiated.remote_hold else "active",
        )

    def _info(self, info: Request, peer: Peer) -> None:
        sc = self._find(info)
        if sc is None or sc.dialog is None:
            self._respond(info, peer, 481)
            return
        self._respond(info, peer, 200)
        ctype = (info.content_type or "").lower()
        if ctype.startswith("application/dtmf-relay"):
            for line in info.body.decode("utf-8", "replace").splitlines():
                name, _, value = line.partition("=")
                digit = value.strip().upper()
                events = sc.leg.events if sc.leg is not None else None
                if name.strip().lower() == "signal" and digit in DIGITS and events is not None:
                    events.on_carrier_dtmf(digit)

    # -- ending ------------------------------------------------------------------------------
    async def _hangup_from_app(self, sc: SipCall) -> None:
        if not sc.answered:
            self._final(sc, 480)
            return
        if sc.finished:
            return
        self._send_bye(sc)

    def _send_bye(self, sc: SipCall) -> None:
        if sc.dialog is None or sc.finished:
            return
        sc.finished = True
        sc.retransmitter = None
        try:
            bye = sc.dialog.create_request("BYE")
        except ValueError:
            return
        self.transport.send_request(bye, sc.peer)

    async def _cleanup_after(self, sc: SipCall) -> None:
        """When the call ends: the RTP port rests in quarantine, the SIP state goes."""
        await sc.call.ended.wait()
        if not sc.answered and not sc.finished:
            self._final(sc, 480 if sc.call.end_reason != "caller_hangup" else 487)
        if sc.rtp is not None:
            sc.rtp.close()
        if sc.rtp_port is not None:
            self.pool.release(sc.rtp_port, self.gw.clock.now())
        # Keep the entry briefly so retransmitted BYE/ACK still match (§17.2.2 Timer J).
        await asyncio.sleep(32 * self.transport.layer.timers.t1_s)
        self.calls.pop(sc.invite.call_id, None)
        # The leg's callbacks close over this record and the record holds the leg: let go, so that
        # reference counting frees the call's SIP side without a full collection
        # (media/gc_pacer.py).
        sc.leg = sc.rtp = sc.retransmitter = sc.cleanup = None


class SipService:
    """The SIP carrier of one gateway: transaction layer, transport and inbound calls."""

    def __init__(
        self, gw: CarrierServices, cfg: SipConfig, layer: TransactionLayer | None = None
    ) -> None:
        self.layer = layer or TransactionLayer()
        self.transport = SipTransport(cfg.listen, gw.clock, self.layer, cfg.tls)
        self.inbound = SipInbound(gw, self.transport, cfg)
        self.outbound = SipOutbound(gw, self.transport, cfg, self.inbound.pool)
        self.inbound.outbound = self.outbound
        self.registrations = SipRegistrations(gw.clock, self.transport, cfg)
        self.inbound.registrations = self.registrations
        self.transport.user = self.inbound

    async def start(self) -> None:
        await self.transport.start()
        await self.registrations.start()

    async def stop(self) -> None:
        await self.registrations.stop()  # unregister first, bounded (docs/sip.md)
        self.outbound.close()
        for sc in list(self.inbound.calls.values()):
            if sc.cleanup is not None:
                sc.cleanup.cancel()
            if sc.rtp is not None:
                sc.rtp.close()
        await self.transport.stop()
