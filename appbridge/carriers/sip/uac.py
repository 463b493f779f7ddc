"""The gateway's SIP UAC: one INVITE flow for outbound calls and for transfer party legs.

Both ``POST /v1/calls`` (``outbound.py``: a Call and an app wait for the answer) and
``SipLeg.dial_party`` (``party.py``: a warm or B2BUA cold transfer waits for the new party) place
a call the same way (RFC 3261 §13.2); only what happens around the answer differs, and that is
the :class:`DialOwner`'s business:

1. :meth:`SipUac.prepare` resolves the trunk, opens its TCP or TLS connection when the trunk is
   ``transport = "tcp"`` or ``"tls"`` (``SipTransport.connect_tcp``/``connect_tls``: a refused
   certificate fails the dial with a log line naming trunk, address and OpenSSL's reason), takes
   an RTP port and builds the INVITE with an SDP offer (RFC 3264 §5); :meth:`SipUac.launch`
   sends it and arms the no-answer deadline (``timeout_s``).
2. Provisional responses (180/183) tell the owner ``ringing``. A 401/407 is answered once with
   the trunk's digest credentials (RFC 3261 §22.2, ``digest.py``) on a new INVITE, CSeq + 1; the
   transaction layer already ACKed the challenge (§17.1.1.3).
3. On the 2xx: the ACK (§13.2.2.4), the answer applied (RFC 3264 §7), a :class:`~.leg.SipLeg`
   built on the RTP port, and the owner told ``answered``.
4. Outcomes before an answer: ``busy`` (486, 600, 603), ``no-answer`` (the deadline, where we
   CANCEL, §9.1; or 408/480), ``failed`` (any other final response, Timer B, a failed challenge,
   an unusable SDP answer, a lost TCP or TLS connection) and ``canceled`` (the owner gave up: we
   CANCEL). A CANCEL waits for the first provisional response (§9.1); a 2xx that arrives after
   we gave up is ACKed and ended with a BYE (§15).
5. After the answer: the callee's BYE closes the leg and tells the owner (``caller_hangup``,
   docs/protocol-session-v1.md, ``session.end``); ``SipLeg.hangup`` sends our BYE; a re-INVITE is
   answered per RFC 3264 §8.

Deadlines (no answer, forgetting a finished dial after 64*T1 so late retransmissions still
match) are data read through ``next_deadline``/``on_timer(now)``, which ``SipInbound`` feeds
from the transport's single timer: the flow runs in virtual time in the unit tests.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from appbridge.carriers.sip.contact import contact_for, transport_params, via_for
from appbridge.carriers.sip.dialog import Dialog, DialogError
from appbridge.carriers.sip.digest import DigestChallenge, DigestError, authorization
from appbridge.carriers.sip.headers import NameAddr, SipParseError, SipUri
from appbridge.carriers.sip.leg import LEG_CODECS, RtpPortPool, RtpProtocol, SipLeg, open_rtp
from appbridge.carriers.sip.message import Headers, Request, Response, new_branch, new_tag
from appbridge.carriers.sip.offer_answer import OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.refer import ReferClient
from appbridge.carriers.sip.resolve import resolve_ipv4
from appbridge.carriers.sip.sdp import SdpError, SessionDescription
from appbridge.carriers.sip.tls import describe_tls_error
from appbridge.carriers.sip.transaction import make_cancel
from appbridge.carriers.sip.transport import SDP_TYPE, Peer, SipTransport, is_stream
from appbridge.clock import Clock

if TYPE_CHECKING:
    from appbridge.config import SipConfig, SipTrunk
    from appbridge.protocol.session_v1 import EndReason

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"  # NOTIFY: of our REFERs
MAX_AUTH_ATTEMPTS = 2  # a second challenge is tried only when the first nonce went stale
BUSY_STATUSES = frozenset({486, 600, 603})
NO_ANSWER_STATUSES = frozenset({408, 480})


class UacError(Exception):
    """The INVITE could not even be sent: ``code`` is ``unavailable`` (no RTP port) or
    ``trunk_unreachable`` (name resolution, the TCP connection or the TLS handshake failed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class DialOwner(Protocol):
    """Who waits for a dial: a Call (``outbound.py``) or a transfer (``party.py``)."""

    label: str  # for logs: the call's ref, or "party of CA..."

    def wants_answer(self) -> bool:
        """False once the owner gave up: a late 2xx is ACKed and ended with a BYE."""
        ...

    def ringing(self, d: UacDial) -> None: ...

    def answered(self, d: UacDial, leg: SipLeg) -> None: ...

    def failed(self, d: UacDial, outcome: str, status: int | None, reason: EndReason) -> None: ...

    def remote_bye(self, d: UacDial) -> None: ...


@dataclass(eq=False)
class UacDial:
    """The SIP side of one placed call (module doc)."""

    trunk: SipTrunk
    peer: Peer
    invite: Request  # the latest INVITE sent (a digest retry replaces it)
    negotiator: SdpNegotiator
    rtp_port: int
    rtp: RtpProtocol
    contact: NameAddr
    offer: bytes = field(repr=False)  # its a=crypto keys stay out of reprs (RFC 4568 §8)
    owner: DialOwner | None = None
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
    released: bool = False  # the RTP port went back to the pool
    no_answer_at: float | None = None
    forget_at: float | None = None
    label: str = field(default="", repr=False)


class SipUac:
    """The UAC of the SIP carrier (module doc); fed by ``SipInbound`` for its Call-IDs. It also
    carries the REFERs of every call (``refers``), whose NOTIFYs arrive the same way."""

    def __init__(
        self,
        clock: Clock,
        transport: SipTransport,
        cfg: SipConfig,
        pool: RtpPortPool,
        *,
        after_slice: Callable[[Callable[[], None]], None],
    ) -> None:
        self.clock = clock
        #: Where the legs end their ticks (``MediaClock.call_after_slice``, leg.py).
        self.after_slice = after_slice
        self.transport = transport
        self.cfg = cfg
        self.pool = pool
        self.dials: dict[str, UacDial] = {}  # by Call-ID
        self.refers = ReferClient(self._respond, transport.rearm)

    def _respond(self, request: Request, peer: Peer, status: int) -> None:
        self.transport.respond(request, peer, status)

    # -- placing -----------------------------------------------------------------------------
    async def prepare(
        self,
        trunk: SipTrunk,
        *,
        to_user: str,
        from_user: str,
        headers: Iterable[tuple[str, str]] = (),
    ) -> UacDial:
        """Everything up to the INVITE, not yet sent (module doc, step 1). Raises
        :class:`UacError`."""
        peer = await self._connect(trunk)
        via_port = (
            self.transport.tcp_sent_by_port(peer)
            if is_stream(peer)
            else self.transport.local_port("udp")
        )
        opened = await open_rtp(self.transport.local_host, self.pool, self.clock)
        if opened is None:
            raise UacError("unavailable", "no RTP port available")
        rtp_port, rtp = opened
        host = self.cfg.public_address or self.transport.local_host
        kind = str(peer[0])
        params = transport_params(kind)
        contact = contact_for(host, kind, via_port)
        negotiator = SdpNegotiator(
            local_address=self.transport.local_host,
            rtp_port=rtp_port,
            public_address=self.cfg.public_address,
            codecs=LEG_CODECS,
            srtp=trunk.srtp,
        )
        offer = negotiator.create_offer().serialize()
        uri = SipUri(scheme="sip", user=to_user, host=trunk.host, port=trunk.port, params=params)
        h = Headers(
            [
                ("Via", via_for(kind, host, via_port)),
                ("Max-Forwards", "70"),
                ("From", f"<{SipUri(scheme='sip', user=from_user, host=host)}>;tag={new_tag()}"),
                ("To", f"<{SipUri(scheme='sip', user=to_user, host=trunk.host)}>"),
                ("Call-ID", f"{uuid.uuid4().hex}@{host}"),
                ("CSeq", "1 INVITE"),
                ("Contact", str(contact)),
                ("Allow", ALLOW),
                ("User-Agent", "AppBridge"),
            ]
        )
        for name, value in headers:
            h.add(name, value)
        h.add("Content-Type", SDP_TYPE)
        invite = Request("INVITE", uri, h, offer)
        return UacDial(trunk, peer, invite, negotiator, rtp_port, rtp, contact, offer)

    def launch(self, d: UacDial, owner: DialOwner, timeout_s: float) -> None:
        """Send the prepared INVITE; the answer (or not) reaches ``owner``."""
        d.owner = owner
        d.label = owner.label
        d.no_answer_at = self.clock.now() + timeout_s
        self.dials[d.invite.call_id] = d
        self.transport.send_request(d.invite, d.peer)
        log.info("%s: INVITE to %s via trunk %s", d.label, d.invite.uri, d.trunk.name)

    async def _connect(self, trunk: SipTrunk) -> Peer:
        """The trunk's peer: its address over UDP, or its (reused) TCP or TLS connection.
        Raises :class:`UacError` ``trunk_unreachable``; a TLS failure is also logged with the
        trunk's name and OpenSSL's reason, for the operator (docs/sip.md, "TLS and SRTP
        trunks")."""
        address = await self._resolve(trunk.host, trunk.port)
        where = f"{trunk.host}:{trunk.port}"
        if trunk.transport == "tcp":
            try:
                return await self.transport.connect_tcp(address, trunk.port)
            except (OSError, TimeoutError) as exc:
                raise UacError("trunk_unreachable", f"cannot connect to {where} over TCP") from exc
        if trunk.transport == "tls":
            try:
                return await self.transport.connect_tls(address, trunk.port, trunk.host)
            except ssl.SSLError as exc:
                reason = describe_tls_error(exc)
                log.warning("sip: TLS to trunk %r (%s) refused: %s", trunk.name, where, reason)
                raise UacError("trunk_unreachable", f"TLS to {where} refused: {reason}") from exc
            except (OSError, TimeoutError) as exc:
                reason = describe_tls_error(exc)
                log.warning("sip: TLS to trunk %r (%s) failed: %s", trunk.name, where, reason)
                raise UacError("trunk_unreachable", f"cannot connect to {where} over TLS") from exc
        return ("udp", address, trunk.port)

    def discard(self, d: UacDial) -> None:
        """A prepared dial that will not be launched: its RTP port goes back."""
        self.release(d)

    async def _resolve(self, host: str, port: int) -> str:
        try:
            return await resolve_ipv4(host, port)
        except OSError as exc:
            raise UacError("trunk_unreachable", f"cannot resolve {host}") from exc

    def _via(self, d: UacDial) -> str:
        """A fresh top Via like the first INVITE's (a digest retry is a new transaction)."""
        old = d.invite.top_via
        via = f"SIP/2.0/{old.transport} {old.sent_by};branch={new_branch()};rport"
        return via + ";alias" if old.has_param("alias") else via

    # -- TransactionUser (through SipInbound) --------------------------------------------------
    def on_message(self, message: Request | Response, peer: Peer, now: float) -> bool:
        """Handle ``message`` when it belongs to a dial or a REFER; False leaves it to inbound."""
        try:
            call_id = message.call_id
            if self.refers.on_message(message, peer, now):
                return True
        except SipParseError:
            return False
        d = self.dials.get(call_id)
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
            log.warning("%s: bad SIP message ignored: %s", d.label, exc)
        return True

    def on_timeout(self, request: Request, now: float) -> bool:
        if self.refers.on_timeout(request):
            return True
        d = self.dials.get(request.call_id)
        if d is None:
            return False
        if request.method == "INVITE" and not d.final:
            self._fail(d, "failed", 408, "timeout")  # Timer B: no final response (§8.1.3.1)
        return True

    def next_deadline(self) -> float | None:
        deadlines = [self.refers.next_deadline()]
        for d in self.dials.values():
            deadlines += [d.no_answer_at, d.forget_at]
        return min((t for t in deadlines if t is not None), default=None)

    def on_timer(self, now: float) -> None:
        self.refers.on_timer(now)
        for d in list(self.dials.values()):
            if d.no_answer_at is not None and d.no_answer_at <= now:
                d.no_answer_at = None
                if not d.final and d.outcome is None:
                    log.info("%s: no answer in time; CANCEL", d.label)
                    self._fail(d, "no-answer", None, "timeout")
            if d.forget_at is not None and d.forget_at <= now:
                self.dials.pop(d.invite.call_id, None)
                # The leg's hang-up callback closes over the dial, and the owner's answer
                # (a transfer's future) holds the leg: let go of both, no cycle left behind.
                d.leg = d.owner = None

    # -- responses to our INVITE ----------------------------------------------------------------
    def _invite_response(self, d: UacDial, response: Response) -> None:
        status = response.status
        if response.cseq.seq != d.invite.cseq.seq:
            return  # to a challenged INVITE: the transaction layer ACKed it
        if status < 200:
            if status > 100:
                d.provisional = True
                if d.owner is not None and d.outcome is None:
                    d.owner.ringing(d)
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
        d.no_answer_at = None
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

    def _retry_with_auth(self, d: UacDial, response: Response) -> bool:
        """RFC 3261 §22.2: the same INVITE, CSeq + 1, a new branch, with credentials."""
        trunk = d.trunk
        if trunk.username is None or trunk.password is None or d.outcome is not None:
            return False
        try:
            challenge = DigestChallenge.from_response(response)
        except DigestError as exc:
            log.warning("%s: cannot answer the challenge: %s", d.label, exc)
            return False
        if d.auth_attempts >= 1 and not challenge.stale:
            log.warning("%s: trunk %s refused our credentials", d.label, trunk.name)
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
        headers.replace_first("Via", self._via(d))
        headers.set("CSeq", f"{old.cseq.seq + 1} INVITE")
        headers.remove("Authorization")
        headers.remove("Proxy-Authorization")
        headers.add(name, value)
        d.invite = Request("INVITE", old.uri, headers, d.offer)
        d.provisional = False
        self.transport.send_request(d.invite, d.peer)
        return True

    def _accepted(self, d: UacDial, response: Response) -> None:
        """A 2xx (§13.2.2.4): ACK every one; the first also starts the call."""
        if d.dialog is not None:
            ack = d.dialog.ack_for(response)
            if ack is not None:
                self.transport.send_request(ack, self.dialog_peer(d))
            return
        d.final = True
        d.no_answer_at = None
        try:
            d.dialog = Dialog.from_uac(d.invite, response)
        except DialogError:
            self._fail(d, "failed", response.status, "error")
            return
        ack = d.dialog.create_ack(d.invite.cseq.seq)
        self.transport.send_request(ack, self.dialog_peer(d))
        owner = d.owner
        if d.outcome is not None or owner is None or not owner.wants_answer():
            self.send_bye(d)  # answered after we gave up (§15): end it at once
            self._finish(d)
            return
        try:
            negotiated = d.negotiator.process_answer(SessionDescription.parse(response.body))
        except (SdpError, OfferAnswerError) as exc:
            log.warning("%s: unusable SDP answer: %s", d.label, exc)
            self.send_bye(d)
            self._fail(d, "failed", response.status, "error")
            return
        leg = SipLeg(
            negotiated,
            clock=self.clock,
            defer=self.after_slice,
            send_datagram=d.rtp.send,
            on_hangup=lambda: self._hangup_leg(d),
        )
        d.leg = leg
        d.rtp.leg = leg
        owner.answered(d, leg)

    def dialog_peer(self, d: UacDial) -> Peer:
        """Where in-dialog requests go: over TCP or TLS the trunk's connection; over UDP the
        next hop's address when it is an IP literal, else the trunk."""
        if d.dialog is None or is_stream(d.peer):
            return d.peer
        hop = d.dialog.next_hop()
        try:
            ipaddress.ip_address(hop.host.strip("[]"))
        except ValueError:
            return d.peer
        return ("udp", hop.host.strip("[]"), hop.port or 5060)

    # -- requests from the callee ---------------------------------------------------------------
    def _request(self, d: UacDial, request: Request, peer: Peer) -> None:
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
            self.refers.abort(d.invite.call_id, "the call ended during the REFER")
            if d.leg is not None:
                d.leg.closed = True
            self._finish(d)
            if d.owner is not None:
                d.owner.remote_bye(d)  # then the leg tells whoever is attached
        elif method == "INVITE":
            self._reinvite(d, request, peer)
        elif method in ("OPTIONS", "INFO"):
            # In a dialog, OPTIONS is a keepalive of this call: 200 even while draining, so a
            # drain cuts no live call (docs/sip.md, "OPTIONS").
            self.transport.respond(request, peer, 200, headers=[("Allow", ALLOW)])
        else:
            self.transport.respond(request, peer, 405, headers=[("Allow", ALLOW)])

    def _reinvite(self, d: UacDial, invite: Request, peer: Peer) -> None:
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
    def _fail(self, d: UacDial, outcome: str, status: int | None, reason: EndReason) -> None:
        """Record the outcome, CANCEL a pending INVITE and tell the owner."""
        if d.outcome is not None:
            return
        d.outcome = outcome
        d.sip_status = status
        d.no_answer_at = None
        if not d.final:
            self._cancel(d)
        self._finish(d)
        if d.owner is not None:
            d.owner.failed(d, outcome, status, reason)

    def abandon(self, d: UacDial, outcome: str = "canceled") -> None:
        """The owner gave up (DELETE, shutdown, a cancelled transfer): CANCEL before the answer
        (§9.1, once a 1xx came), BYE after it; the RTP port goes back at once."""
        d.no_answer_at = None
        if d.dialog is None:
            if d.outcome is None:
                d.outcome = outcome
            self._cancel(d)
        else:
            self.send_bye(d)
        if d.leg is not None:
            d.leg.closed = True
        self._finish(d)

    def _cancel(self, d: UacDial) -> None:
        if d.cancel_sent or d.final:
            return
        if not d.provisional:
            d.cancel_wanted = True  # §9.1: after the first provisional response
            return
        self._send_cancel(d)

    def _send_cancel(self, d: UacDial) -> None:
        d.cancel_sent = True
        self.transport.send_request(make_cancel(d.invite), d.peer)

    async def _hangup_leg(self, d: UacDial) -> None:
        self.send_bye(d)
        self._finish(d)

    def send_bye(self, d: UacDial) -> None:
        if d.dialog is None or d.bye_sent:
            return
        d.bye_sent = True
        try:
            bye = d.dialog.create_request("BYE")
        except ValueError:
            return
        self.transport.send_request(bye, self.dialog_peer(d))

    def release(self, d: UacDial) -> None:
        """The RTP port back to the pool (quarantined), once."""
        if d.released:
            return
        d.released = True
        d.rtp.close()
        self.pool.release(d.rtp_port, self.clock.now())

    def _finish(self, d: UacDial) -> None:
        """Free the media and keep the entry 64*T1 so late responses (a 2xx after CANCEL,
        retransmissions) still match. An answered, live leg keeps its port until it ends."""
        if d.leg is not None and not d.leg.closed and not d.bye_sent:
            return
        self.release(d)
        if d.forget_at is None:
            d.forget_at = self.clock.now() + 64 * self.transport.layer.timers.t1_s
            self.transport.rearm()

    def close(self) -> None:
        for d in self.dials.values():
            d.rtp.close()
        self.dials.clear()
