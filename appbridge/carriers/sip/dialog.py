"""SIP dialogs (RFC 3261 §12) and the 2xx/ACK exchange of INVITE (§13.2.2.4, §13.3.1.4).

Theory of operation
-------------------
A :class:`Dialog` is the state two user agents share after an INVITE: Call-ID, both tags, both
CSeq spaces, the remote target (the peer's Contact) and the route set (Record-Route). It is built
from the INVITE on the UAS side (:meth:`Dialog.from_uas`, §12.1.1) or from the INVITE and the
response that carried a To tag on the UAC side (:meth:`Dialog.from_uac`, §12.1.2; a 1xx makes an
*early* dialog that a 2xx confirms). From then on it:

- builds in-dialog requests (:meth:`create_request`: BYE, re-INVITE, INFO, REFER, NOTIFY,
  UPDATE...) with the next local CSeq, the Request-URI and Route headers of §12.2.1.1 (loose
  and strict routing), and a fresh Via branch; the ACK of a 2xx by :meth:`create_ack` (§13.2.2.4:
  same CSeq number as the INVITE, a new branch, its own transaction-less send);
- checks incoming in-dialog requests (:meth:`on_request`, §12.2.2: a CSeq lower than the last
  one is answered 500) and refreshes the remote target from re-INVITE/UPDATE Contacts;
- tracks responses to its own requests (:meth:`on_response`: a 2xx confirms and refreshes the
  target, a 481 or 408 ends the dialog, §12.2.1.2);
- hands back the same ACK when a 2xx is retransmitted (:meth:`ack_for`), because the INVITE
  client transaction ended with the first 2xx.

The UAS side retransmits its 2xx until the ACK arrives: :class:`AnswerRetransmitter` is that
timer (§13.3.1.4: T1, doubling up to T2, over unreliable transports; after 64*T1 without ACK it
reports :class:`AckTimeout` and the TU ends the session with a BYE). Like the transactions, it
takes ``now`` and returns effects; nothing here does I/O.
"""

from __future__ import annotations

import secrets
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from appbridge.carriers.sip.headers import NameAddr, SipUri
from appbridge.carriers.sip.message import Headers, Request, Response, new_branch
from appbridge.carriers.sip.transaction import DEFAULT_TIMERS, Send, Timers

# Requests that may change the remote target (§12.2, RFC 3311, RFC 6665, RFC 3515): they carry
# our Contact, and theirs replaces the remote target.
TARGET_REFRESH = frozenset({"INVITE", "UPDATE", "SUBSCRIBE", "NOTIFY", "REFER"})
MAX_FORWARDS = 70  # §8.1.1.6


class DialogState(StrEnum):
    EARLY = "early"
    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


class DialogError(Exception):
    """An in-dialog request the dialog refuses; ``status`` is the response to send."""

    def __init__(self, reason: str, status: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class AckTimeout:
    """No ACK for our 2xx within 64*T1 (§13.3.1.4): the TU confirms, then sends BYE."""

    response: Response


def _untagged(addr: NameAddr) -> NameAddr:
    return replace(addr, params=tuple((k, v) for k, v in addr.params if k.lower() != "tag"))


@dataclass(eq=False)
class Dialog:
    """One dialog; see the module docstring. Field names follow §12.1."""

    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: NameAddr
    remote_uri: NameAddr
    remote_target: SipUri
    route_set: list[NameAddr]
    local_contact: NameAddr
    local_seq: int
    remote_seq: int | None
    transport: str
    sent_by: str
    state: DialogState = DialogState.CONFIRMED
    secure: bool = False
    _acks: dict[int, Request] = field(default_factory=dict)

    @classmethod
    def from_uas(
        cls,
        invite: Request,
        local_tag: str,
        local_contact: NameAddr | SipUri,
        *,
        transport: str | None = None,
        sent_by: str | None = None,
        local_seq: int | None = None,
    ) -> Dialog:
        """§12.1.1. ``transport``/``sent_by`` are ours for the Via of requests we send in this
        dialog (by default the Contact's host:port and ``transport`` parameter, else UDP); the
        local CSeq starts at a random value below 2**31 (§8.1.1.5) unless given."""
        contact = local_contact if isinstance(local_contact, NameAddr) else NameAddr(local_contact)
        remote_contacts = invite.contacts
        if not remote_contacts:
            raise DialogError("Missing Contact header", 400)
        uri = contact.uri
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=invite.from_.tag or "",
            local_uri=_untagged(invite.to),
            remote_uri=_untagged(invite.from_),
            remote_target=remote_contacts[0].uri,
            route_set=list(invite.record_routes),
            local_contact=contact,
            local_seq=local_seq if local_seq is not None else secrets.randbelow(2**30) + 1,
            remote_seq=invite.cseq.seq,
            transport=(transport or uri.param("transport") or "UDP").upper(),
            sent_by=sent_by or (uri.host if uri.port is None else f"{uri.host}:{uri.port}"),
            secure=invite.uri.scheme == "sips",
        )

    @classmethod
    def from_uac(cls, invite: Request, response: Response) -> Dialog:
        """§12.1.2, from a 1xx (early) or 2xx (confirmed) response carrying a To tag."""
        to = response.to
        if to.tag is None:
            raise DialogError("Response without To tag", 400)
        contacts = response.contacts
        via = invite.top_via
        local_contacts = invite.contacts
        if not local_contacts:
            raise DialogError("INVITE without Contact", 400)
        return cls(
            call_id=invite.call_id,
            local_tag=invite.from_.tag or "",
            remote_tag=to.tag,
            local_uri=_untagged(invite.from_),
            remote_uri=_untagged(to),
            remote_target=contacts[0].uri if contacts else invite.uri,
            route_set=list(reversed(response.record_routes)),
            local_contact=local_contacts[0],
            local_seq=invite.cseq.seq,
            remote_seq=None,
            transport=via.transport,
            sent_by=via.sent_by,
            state=DialogState.EARLY if response.status < 200 else DialogState.CONFIRMED,
            secure=invite.uri.scheme == "sips",
        )

    @property
    def id(self) -> tuple[str, str, str]:
        """The dialog ID (§12): Call-ID, local tag, remote tag."""
        return (self.call_id, self.local_tag, self.remote_tag)

    def matches(self, message: Request | Response) -> bool:
        """Whether an incoming message belongs here: for a request the To tag is ours, for a
        response to our request the From tag is."""
        if message.call_id != self.call_id:
            return False
        if isinstance(message, Request):
            ours, theirs = message.to.tag, message.from_.tag
        else:
            ours, theirs = message.from_.tag, message.to.tag
        return ours == self.local_tag and (theirs or "") == self.remote_tag

    def next_hop(self) -> SipUri:
        """Where requests of this dialog are sent (§8.1.2): the first route, else the target."""
        return self.route_set[0].uri if self.route_set else self.remote_target

    def create_request(
        self,
        method: str,
        *,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
        branch: str | None = None,
    ) -> Request:
        """A request within the dialog (§12.2.1.1) with the next local CSeq."""
        if method in ("ACK", "CANCEL"):
            raise ValueError("ACK comes from create_ack, CANCEL from transaction.make_cancel")
        if self.state is DialogState.TERMINATED:
            raise ValueError("dialog terminated")
        self.local_seq += 1
        return self._build(method, self.local_seq, body, content_type, headers, branch)

    def create_ack(
        self,
        invite_seq: int,
        *,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
        branch: str | None = None,
    ) -> Request:
        """The ACK for a 2xx to the INVITE numbered ``invite_seq`` (§13.2.2.4); kept so that
        :meth:`ack_for` can send it again when the 2xx is retransmitted."""
        ack = self._build("ACK", invite_seq, body, content_type, headers, branch)
        self._acks = {invite_seq: ack}
        return ack

    def ack_for(self, response: Response) -> Request | None:
        """The ACK already sent for this (retransmitted) 2xx, if any."""
        cseq = response.cseq
        if cseq.method != "INVITE" or not 200 <= response.status < 300:
            return None
        return self._acks.get(cseq.seq)

    def _build(
        self,
        method: str,
        seq: int,
        body: bytes,
        content_type: str | None,
        extra: Iterable[tuple[str, str]],
        branch: str | None,
    ) -> Request:
        uri, routes = self.remote_target, [str(r) for r in self.route_set]
        if self.route_set and not self.route_set[0].uri.has_param("lr"):
            # Strict routing (§12.2.1.1): the first route becomes the Request-URI and the
            # remote target goes last in the Route set.
            uri = replace(self.route_set[0].uri, headers=None)
            routes = [*routes[1:], f"<{self.remote_target}>"]
        via = f"SIP/2.0/{self.transport} {self.sent_by};branch={branch or new_branch()};rport"
        h = Headers(
            [
                ("Via", via),
                ("Max-Forwards", str(MAX_FORWARDS)),
                ("From", str(self.local_uri.with_param("tag", self.local_tag))),
                ("To", str(self._remote_with_tag())),
                ("Call-ID", self.call_id),
                ("CSeq", f"{seq} {method}"),
            ]
        )
        for route in routes:
            h.add("Route", route)
        if method in TARGET_REFRESH:
            h.add("Contact", str(self.local_contact))
        for name, value in extra:
            h.add(name, value)
        if body and content_type:
            h.set("Content-Type", content_type)
        return Request(method, uri, h, body)

    def _remote_with_tag(self) -> NameAddr:
        if not self.remote_tag:
            return self.remote_uri
        return self.remote_uri.with_param("tag", self.remote_tag)

    def on_request(self, request: Request) -> None:
        """Check and absorb an incoming in-dialog request (§12.2.2). Raises
        :class:`DialogError` (500) for a CSeq lower than the last one seen."""
        seq = request.cseq.seq
        if request.method not in ("ACK", "CANCEL"):
            if self.remote_seq is not None and seq < self.remote_seq:
                raise DialogError("Out of order request", 500)
            self.remote_seq = seq
        if request.method in TARGET_REFRESH:
            contacts = request.contacts
            if contacts:
                self.remote_target = contacts[0].uri
        if request.method == "BYE":
            self.state = DialogState.TERMINATED

    def on_response(self, response: Response) -> None:
        """A response to a request this dialog sent (§12.2.1.2, §13.2.2.4)."""
        status, method = response.status, response.cseq.method
        if status in (481, 408):
            self.state = DialogState.TERMINATED
            return
        if not 200 <= status < 300:
            return
        if method == "INVITE" and self.state is DialogState.EARLY:
            self.state = DialogState.CONFIRMED
            self.route_set = list(reversed(response.record_routes))
        if method in TARGET_REFRESH:
            contacts = response.contacts
            if contacts:
                self.remote_target = contacts[0].uri
        if method == "BYE":
            self.state = DialogState.TERMINATED

    def terminate(self) -> None:
        self.state = DialogState.TERMINATED


class AnswerRetransmitter:
    """The UAS core's 2xx retransmission (§13.3.1.4), Timer-G style: first after T1, then
    doubling up to T2, until the ACK (matched by CSeq number) arrives; over unreliable
    transports only. After 64*T1 without ACK it reports :class:`AckTimeout`, on any transport.
    """

    def __init__(
        self,
        response: Response,
        *,
        reliable: bool,
        now: float,
        peer: Hashable = None,
        timers: Timers = DEFAULT_TIMERS,
    ) -> None:
        self.response = response
        self.peer = peer
        self._wire = response.serialize()
        self._timers = timers
        self._interval_s = timers.t1_s
        self._resend_at: float | None = None if reliable else now + timers.t1_s
        self._give_up_at: float | None = now + 64 * timers.t1_s
        self.acked = False

    @property
    def done(self) -> bool:
        return self._give_up_at is None

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (self._resend_at, self._give_up_at) if d is not None]
        return min(deadlines, default=None)

    def on_ack(self, ack: Request) -> bool:
        """True when ``ack`` acknowledges this 2xx; retransmission stops."""
        if self.done or ack.method != "ACK" or ack.cseq.seq != self.response.cseq.seq:
            return False
        self.acked = True
        self._resend_at = self._give_up_at = None
        return True

    def on_timer(self, now: float) -> list[Send | AckTimeout]:
        effects: list[Send | AckTimeout] = []
        while self._resend_at is not None and self._resend_at <= now:
            if self._give_up_at is not None and self._give_up_at <= self._resend_at:
                break
            effects.append(Send(self._wire, self.peer))
            self._interval_s = min(2 * self._interval_s, self._timers.t2_s)
            self._resend_at += self._interval_s
        if self._give_up_at is not None and self._give_up_at <= now:
            self._resend_at = self._give_up_at = None
            effects.append(AckTimeout(self.response))
        return effects
