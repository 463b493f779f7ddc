"""Outbound SIP calls (``POST /v1/calls`` with ``carrier = "sip:<trunk>"``, INTERFACES §5).

The UAC call flow over the shared transport and transaction layer (RFC 3261 §13.2):

1. The request is checked (:func:`parse_call_request`): a known app, a configured trunk, E.164
   ``to``/``from``, ``metadata`` a JSON object of at most 16 KiB, an optional ``timeout_s``.
2. A :class:`~appbridge.calls.call.Call` (direction ``outbound``) is registered at once with the
   state ``dialing``, so ``GET``/``DELETE /v1/calls/{callRef}`` work before the answer. An RTP
   port is taken and the INVITE goes to the trunk with an SDP offer (RFC 3264 §5).
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

Only UDP trunks are dialed: the transport has no outbound TCP connections yet.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appbridge.carriers.sip.dialog import Dialog, DialogError
from appbridge.carriers.sip.digest import DigestChallenge, DigestError, authorization
from appbridge.carriers.sip.headers import NameAddr, SipParseError, SipUri
from appbridge.carriers.sip.leg import LEG_CODECS, RtpPortPool, RtpProtocol, SipLeg, open_rtp
from appbridge.carriers.sip.message import (
    Headers,
    Request,
    Response,
    new_branch,
    new_tag,
)
from appbridge.carriers.sip.sdp import (
    OfferAnswerError,
    SdpError,
    SdpNegotiator,
    SessionDescription,
)
from appbridge.carriers.sip.transaction import make_cancel
from appbridge.carriers.sip.transport import SDP_TYPE, Peer, SipTransport

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.config import AppConfig, SipConfig, SipTrunk
    from appbridge.gateway import Gateway
    from appbridge.protocol.session_v1 import EndReason

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO"
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
MAX_METADATA_BYTES = 16 * 1024
MAX_AUTH_ATTEMPTS = 2  # a second challenge is tried only when the first nonce went stale
E164_RE = re.compile(r"\+[1-9][0-9]{1,14}")
REQUEST_KEYS = frozenset({"app", "to", "from", "carrier", "metadata", "timeout_s"})
BUSY_STATUSES = frozenset({486, 600, 603})
NO_ANSWER_STATUSES = frozenset({408, 480})


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
    """Check a decoded JSON body (INTERFACES §5); raises :class:`OutboundError` (400, or 501
    for the Twilio carrier, which cannot place calls yet)."""
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
        raise OutboundError(
            501, "not_implemented", "outbound calls through Twilio are not available yet"
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


@dataclass(eq=False)
class OutboundDial:
    """The SIP side of one outbound call."""

    call: Call
    trunk: SipTrunk
    peer: Peer
    invite: Request  # the latest INVITE sent (a digest retry replaces it)
    negotiator: SdpNegotiator
    rtp_port: int
    rtp: RtpProtocol
    contact: NameAddr
    offer: bytes
    auth_attempts: int = 0
    provisional: bool = False  # a 1xx arrived: a CANCEL may go (§9.1)
    cancel_wanted: bool = False
    cancel_sent: bool = False
    final: bool = False  # the INVITE got its final response (or Timer B fired)
    dialog: Dialog | None = None
    leg: SipLeg | None = None
    bye_sent: bool = False
    outcome: str | None = None
    sip_status: int | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class SipOutbound:
    """The UAC side of the SIP carrier (module doc); fed by ``SipInbound`` for its Call-IDs."""

    def __init__(
        self, gw: Gateway, transport: SipTransport, cfg: SipConfig, pool: RtpPortPool
    ) -> None:
        self.gw = gw
        self.transport = transport
        self.cfg = cfg
        self.pool = pool
        self.dials: dict[str, OutboundDial] = {}  # by Call-ID

    # -- placing a call ----------------------------------------------------------------------
    async def place(self, req: CallRequest) -> Call:
        """Register the call and send the INVITE; the answer is awaited in the background."""
        trunk = req.trunk
        assert trunk is not None
        if trunk.transport != "udp":
            raise OutboundError(501, "not_implemented", "outbound calls over TCP trunks: not yet")
        gw = self.gw
        if gw.admission_refusal() is not None:
            gw.registry.total_rejected += 1
            raise OutboundError(503, "unavailable", "the gateway takes no new calls right now")
        address = await self._resolve(trunk.host, trunk.port)
        opened = await open_rtp(self.transport.local_host, self.pool, gw.clock)
        if opened is None:
            raise OutboundError(503, "unavailable", "no RTP port available")
        rtp_port, rtp = opened
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
        host = self.cfg.public_address or self.transport.local_host
        contact = NameAddr(
            uri=SipUri(
                scheme="sip", user="appbridge", host=host, port=self.transport.local_port("udp")
            )
        )
        negotiator = SdpNegotiator(
            local_address=self.transport.local_host,
            rtp_port=rtp_port,
            public_address=self.cfg.public_address,
            codecs=LEG_CODECS,
        )
        offer = negotiator.create_offer().serialize()
        invite = self._first_invite(req, trunk, contact, offer)
        peer: Peer = ("udp", address, trunk.port)
        d = OutboundDial(call, trunk, peer, invite, negotiator, rtp_port, rtp, contact, offer)
        self.dials[invite.call_id] = d
        loop = asyncio.get_running_loop()
        d.timer = loop.call_later(req.timeout_s, self._no_answer, d)
        d.watcher = loop.create_task(self._watch(d))
        self.transport.send_request(invite, peer)
        log.info("call %s: INVITE to %s via trunk %s", call.call_ref, req.to, trunk.name)
        return call

    async def _resolve(self, host: str, port: int) -> str:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
            )
        except OSError as exc:
            raise OutboundError(502, "trunk_unreachable", f"cannot resolve {host}") from exc
        return str(infos[0][4][0])

    def _first_invite(
        self, req: CallRequest, trunk: SipTrunk, contact: NameAddr, offer: bytes
    ) -> Request:
        uri = SipUri(scheme="sip", user=req.to, host=trunk.host, port=trunk.port)
        host = contact.uri.host
        from_uri = SipUri(scheme="sip", user=req.from_, host=host)
        headers = Headers(
            [
                ("Via", self._via()),
                ("Max-Forwards", "70"),
                ("From", f"<{from_uri}>;tag={new_tag()}"),
                ("To", f"<{SipUri(scheme='sip', user=req.to, host=trunk.host)}>"),
                ("Call-ID", f"{uuid.uuid4().hex}@{host}"),
                ("CSeq", "1 INVITE"),
                ("Contact", str(contact)),
                ("Allow", ALLOW),
                ("User-Agent", "AppBridge"),
                ("Content-Type", SDP_TYPE),
            ]
        )
        return Request("INVITE", uri, headers, offer)

    def _via(self) -> str:
        host = self.cfg.public_address or self.transport.local_host
        return f"SIP/2.0/UDP {host}:{self.transport.local_port('udp')};branch={new_branch()};rport"

    # -- TransactionUser (through SipInbound) --------------------------------------------------
    def on_message(self, message: Request | Response, peer: Peer, now: float) -> bool:
        """Handle ``message`` when it belongs to one of our calls; False leaves it to inbound."""
        try:
            d = self.dials.get(message.call_id)
        except SipParseError:
            return False
        if d is None:
            return False
        try:
            if isinstance(message, Response):
                if message.cseq.method == "INVITE":
                    self._invite_response(d, message)
                elif d.dialog is not None and message.cseq.method != "CANCEL":
                    d.dialog.on_response(message)
            else:
                self._request(d, message, peer)
        except SipParseError as exc:
            log.warning("call %s: bad SIP message ignored: %s", d.call.call_ref, exc)
        return True

    def on_timeout(self, request: Request, now: float) -> bool:
        d = self.dials.get(request.call_id)
        if d is None:
            return False
        if request.method == "INVITE" and not d.final:
            self._fail(d, "failed", 408, "timeout")  # Timer B: no final response (§8.1.3.1)
        return True

    # -- responses to our INVITE ----------------------------------------------------------------
    def _invite_response(self, d: OutboundDial, response: Response) -> None:
        status = response.status
        if response.cseq.seq != d.invite.cseq.seq:
            return  # to a challenged INVITE: the transaction layer ACKed it
        if status < 200:
            if status > 100:
                d.provisional = True
                if d.call.state == "dialing":
                    d.call.state = "ringing"
            if d.cancel_wanted and not d.cancel_sent:
                self._send_cancel(d)
            return
        if status < 300:
            self._accepted(d, response)
            return
        d.final = True
        if status in (401, 407) and self._retry_with_auth(d, response):
            d.final = False
            return
        self._stop_timer(d)
        if d.outcome is not None:
            return  # the 487 to our CANCEL: the outcome was set when we gave up
        if status in BUSY_STATUSES:
            outcome = "busy"
        elif status in NO_ANSWER_STATUSES:
            outcome = "no-answer"
        elif status == 487:
            outcome = "canceled"
        else:
            outcome = "failed"
        self._fail(d, outcome, status, "caller_hangup")

    def _retry_with_auth(self, d: OutboundDial, response: Response) -> bool:
        """RFC 3261 §22.2: the same INVITE, CSeq + 1, a new branch, with credentials."""
        trunk = d.trunk
        if trunk.username is None or trunk.password is None or d.outcome is not None:
            return False
        try:
            challenge = DigestChallenge.from_response(response)
        except DigestError as exc:
            log.warning("call %s: cannot answer the challenge: %s", d.call.call_ref, exc)
            return False
        if d.auth_attempts >= 1 and not challenge.stale:
            log.warning("call %s: trunk %s refused our credentials", d.call.call_ref, trunk.name)
            return False
        if d.auth_attempts >= MAX_AUTH_ATTEMPTS:
            return False
        d.auth_attempts += 1
        old = d.invite
        name, value = authorization(
            challenge,
            username=trunk.username,
            password=trunk.password,
            method="INVITE",
            uri=str(old.uri),
            body=d.offer,
        )
        headers = old.headers.copy()
        headers.replace_first("Via", self._via())
        headers.set("CSeq", f"{old.cseq.seq + 1} INVITE")
        headers.remove("Authorization")
        headers.remove("Proxy-Authorization")
        headers.add(name, value)
        d.invite = Request("INVITE", old.uri, headers, d.offer)
        d.provisional = False
        self.transport.send_request(d.invite, d.peer)
        return True

    def _accepted(self, d: OutboundDial, response: Response) -> None:
        """A 2xx (§13.2.2.4): ACK every one; the first also starts the call."""
        if d.dialog is not None:
            ack = d.dialog.ack_for(response)
            if ack is not None:
                self.transport.send_request(ack, self._dialog_peer(d))
            return
        d.final = True
        self._stop_timer(d)
        try:
            d.dialog = Dialog.from_uac(d.invite, response)
        except DialogError:
            self._fail(d, "failed", response.status, "error")
            return
        ack = d.dialog.create_ack(d.invite.cseq.seq)
        self.transport.send_request(ack, self._dialog_peer(d))
        call = d.call
        if d.outcome is not None or call.state in ("ending", "ended"):
            self._send_bye(d)  # answered after we gave up (§15): end it at once
            return
        try:
            negotiated = d.negotiator.process_answer(SessionDescription.parse(response.body))
        except (SdpError, OfferAnswerError) as exc:
            log.warning("call %s: unusable SDP answer: %s", call.call_ref, exc)
            self._send_bye(d)
            self._fail(d, "failed", response.status, "error")
            return
        self.gw.registry.clear_final_fields(call.call_ref)
        call.state = "answered"
        leg = SipLeg(
            negotiated,
            clock=self.gw.clock,
            send_datagram=d.rtp.send,
            on_hangup=lambda: self._hangup_from_app(d),
        )
        d.leg = leg
        call.spawn(self._connect(d, leg), "sip-outbound-connect")

    async def _connect(self, d: OutboundDial, leg: SipLeg) -> None:
        """The callee answered: now the app is dialed and the session opens (module doc)."""
        call = d.call
        answered = await call.connect_app()
        if call.state in ("ending", "ended") or d.bye_sent:
            return
        if not answered:
            self.gw.registry.set_final_fields(
                call.call_ref, {"state": "failed", "endReason": "app_unreachable"}
            )
            self._send_bye(d)
            await call.end("error", carrier_gone=True)
            return
        d.rtp.leg = leg
        call.attach_carrier(leg)
        log.info("call %s: answered; session started", call.call_ref)

    def _dialog_peer(self, d: OutboundDial) -> Peer:
        """Where in-dialog requests go: the next hop's address when it is an IP literal."""
        if d.dialog is None:
            return d.peer
        hop = d.dialog.next_hop()
        try:
            ipaddress.ip_address(hop.host.strip("[]"))
        except ValueError:
            return d.peer
        return ("udp", hop.host.strip("[]"), hop.port or 5060)

    # -- requests from the callee ---------------------------------------------------------------
    def _request(self, d: OutboundDial, request: Request, peer: Peer) -> None:
        method = request.method
        if method == "ACK":
            return
        dialog = d.dialog
        if dialog is None or request.to.tag != dialog.local_tag:
            self.transport.respond(request, peer, 481)
            return
        try:
            dialog.on_request(request)
        except DialogError as exc:
            self.transport.respond(request, peer, exc.status, exc.reason)
            return
        if method == "BYE":
            self.transport.respond(request, peer, 200)
            d.bye_sent = True  # the dialog is over either way
            if d.leg is not None:
                d.leg.closed = True
            d.call.on_carrier_hangup()
        elif method == "INVITE":
            self._reinvite(d, request, peer)
        elif method in ("OPTIONS", "INFO"):
            self.transport.respond(request, peer, 200, headers=[("Allow", ALLOW)])
        else:
            self.transport.respond(request, peer, 405, headers=[("Allow", ALLOW)])

    def _reinvite(self, d: OutboundDial, invite: Request, peer: Peer) -> None:
        """The callee's hold or resume (RFC 3264 §8.4); the 2xx goes out once, unretransmitted."""
        try:
            answer, negotiated = d.negotiator.create_answer(SessionDescription.parse(invite.body))
        except SdpError:
            self.transport.respond(invite, peer, 400, "Malformed SDP")
            return
        except OfferAnswerError:
            self.transport.respond(invite, peer, 488)
            return
        if d.leg is not None:
            d.leg.update_media(negotiated)
        assert d.dialog is not None
        self.transport.respond(
            invite,
            peer,
            200,
            to_tag=d.dialog.local_tag,
            headers=[("Contact", str(d.contact)), ("Allow", ALLOW)],
            body=answer.serialize(),
        )

    # -- giving up and ending ------------------------------------------------------------------
    def _no_answer(self, d: OutboundDial) -> None:
        d.timer = None
        if d.final or d.outcome is not None:
            return
        log.info("call %s: no answer in time; CANCEL", d.call.call_ref)
        self._fail(d, "no-answer", None, "timeout")

    def _fail(self, d: OutboundDial, outcome: str, status: int | None, reason: EndReason) -> None:
        """Record the outcome, CANCEL a pending INVITE and end the call (no session started)."""
        if d.outcome is not None:
            return
        d.outcome = outcome
        d.sip_status = status
        self._stop_timer(d)
        fields: dict[str, Any] = {"state": outcome, "endReason": outcome, "sipStatus": status}
        call = d.call
        self.gw.registry.set_final_fields(call.call_ref, fields)
        if not d.final:
            self._cancel(d)
        if call.state not in ("ending", "ended"):
            call.spawn(call.end(reason, carrier_gone=True), f"end-{outcome}")

    def _cancel(self, d: OutboundDial) -> None:
        if d.cancel_sent or d.final:
            return
        if not d.provisional:
            d.cancel_wanted = True  # §9.1: after the first provisional response
            return
        self._send_cancel(d)

    def _send_cancel(self, d: OutboundDial) -> None:
        d.cancel_sent = True
        self.transport.send_request(make_cancel(d.invite), d.peer)

    def _stop_timer(self, d: OutboundDial) -> None:
        if d.timer is not None:
            d.timer.cancel()
            d.timer = None

    async def _hangup_from_app(self, d: OutboundDial) -> None:
        self._send_bye(d)

    def _send_bye(self, d: OutboundDial) -> None:
        if d.dialog is None or d.bye_sent:
            return
        d.bye_sent = True
        try:
            bye = d.dialog.create_request("BYE")
        except ValueError:
            return
        self.transport.send_request(bye, self._dialog_peer(d))

    async def _watch(self, d: OutboundDial) -> None:
        """When the call ends: CANCEL or BYE what is still up, free the RTP port, and keep the
        entry a while so late responses (a 2xx after CANCEL, retransmissions) still match."""
        await d.call.ended.wait()
        self._stop_timer(d)
        if d.dialog is None:
            if d.outcome is None:
                d.outcome = "canceled"  # DELETE or shutdown before the answer
            self._cancel(d)
        else:
            self._send_bye(d)
        if d.leg is not None:
            d.leg.closed = True
        d.rtp.close()
        self.pool.release(d.rtp_port, self.gw.clock.now())
        await asyncio.sleep(64 * self.transport.layer.timers.t1_s)
        self.dials.pop(d.invite.call_id, None)

    def close(self) -> None:
        for d in self.dials.values():
            self._stop_timer(d)
            if d.watcher is not None:
                d.watcher.cancel()
            d.rtp.close()
        self.dials.clear()
