"""SIP transactions (RFC 3261 §17, with RFC 6026's Accepted state), sans-I/O.

Theory of operation
-------------------
A transaction is one request and its responses, made reliable over UDP by retransmission
timers. Each of the four machines below owns all of its transitions; they are driven by three
kinds of input, each taking ``now`` (seconds, the shell's monotonic clock):

- a message from the transport (``on_response`` for clients, ``on_request`` for servers, which
  sees retransmitted requests and the ACK of a non-2xx final response),
- a response from the transaction user (``send_response``, servers only),
- time: ``next_deadline()`` says when the machine next needs ``on_timer(now)``.

Each returns a list of effects for the shell to carry out in order: :class:`Send` (octets to the
transaction's ``peer``, an opaque address the shell chose), :class:`Deliver` (a message for the
transaction user), :class:`Timeout` (Timer B, F or H: no answer), :class:`TransportError`, and
:class:`Terminated` (forget the transaction). Timers are data: a dict of name to deadline.
Retransmission timers (A, E, G) run over unreliable transports only; the wait timers that absorb
retransmissions (D, I, J, K) are zero over reliable ones (§17.1.1.2 and the others). A timer is
re-armed from the instant it was due, so deadlines stay exact even when the shell is late.

Timer values (§17.1.1.1, table 4): T1 0.5 s, T2 4 s, T4 5 s; A doubles from T1 (no cap),
E and G double up to T2, B = F = H = J = L = M = 64*T1, D = 32 s, I = T4, K = T4.

:class:`TransactionLayer` matches incoming messages to transactions (§17.1.3 for responses:
branch and CSeq method; §17.2.3 for requests: branch, sent-by and method, ACK matching its
INVITE), creates server transactions for new requests and passes strays (an ACK for a 2xx, a
2xx retransmission after its transaction ended) to the transaction user.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum

from appbridge.carriers.sip.headers import MAGIC_COOKIE, SipParseError
from appbridge.carriers.sip.message import Headers, Request, Response

T1_S = 0.5  # RFC 3261 §17.1.1.1: RTT estimate
T2_S = 4.0  # maximum retransmit interval for non-INVITE requests and INVITE responses
T4_S = 5.0  # maximum time a message stays in the network
TIMER_D_S = 32.0  # §17.1.1.2: at least 32 s over unreliable transports


@dataclass(frozen=True, slots=True)
class Timers:
    """The three base values; tests and odd networks may scale them (§17.1.1.1 allows it)."""

    t1_s: float = T1_S
    t2_s: float = T2_S
    t4_s: float = T4_S
    d_s: float = TIMER_D_S


DEFAULT_TIMERS = Timers()


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes
    peer: Hashable


@dataclass(frozen=True, slots=True)
class Deliver:
    message: Request | Response
    peer: Hashable


@dataclass(frozen=True, slots=True)
class Timeout:
    """No final response (B, F) or no ACK (H) in time; the TU treats it as a 408 (§8.1.3.1)."""

    request: Request
    timer: str


@dataclass(frozen=True, slots=True)
class TransportError:
    request: Request


@dataclass(frozen=True, slots=True)
class Terminated:
    key: tuple[str, ...]
    reason: str


Effect = Send | Deliver | Timeout | TransportError | Terminated


class State(StrEnum):
    CALLING = "calling"
    TRYING = "trying"
    PROCEEDING = "proceeding"
    COMPLETED = "completed"
    ACCEPTED = "accepted"
    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


def client_key(message: Request | Response) -> tuple[str, ...]:
    """§17.1.3: the top Via branch and the CSeq method (a CANCEL has its own transaction)."""
    return ("client", message.top_via.branch or "", message.cseq.method)


def server_key(message: Request | Response) -> tuple[str, ...]:
    """§17.2.3: branch, sent-by and method, an ACK belonging to its INVITE; for a response, the
    same key from the Via and CSeq it copied. Requests without the magic cookie (RFC 2543
    peers) fall back to Call-ID, From tag, CSeq number and the whole top Via."""
    via = message.top_via
    method = message.method if isinstance(message, Request) else message.cseq.method
    method = "INVITE" if method == "ACK" else method
    branch = via.branch or ""
    if branch.startswith(MAGIC_COOKIE):
        return ("server", branch, via.sent_by.lower(), method)
    tag = message.from_.tag or ""
    return ("server-2543", message.call_id, tag, str(message.cseq.seq), str(via), method)


class _Transaction:
    """Timer bookkeeping and termination shared by the four machines."""

    key: tuple[str, ...]

    def __init__(self, request: Request, *, reliable: bool, peer: Hashable, timers: Timers) -> None:
        self.request = request
        self.reliable = reliable
        self.peer = peer
        self.timers = timers
        self.state = State.TRYING
        self._deadlines: dict[str, float] = {}
        self._wire = b""  # the message retransmissions repeat

    @property
    def terminated(self) -> bool:
        return self.state is State.TERMINATED

    def next_deadline(self) -> float | None:
        return min(self._deadlines.values(), default=None)

    def on_timer(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        while self._deadlines:
            name, due = min(self._deadlines.items(), key=lambda item: item[1])
            if due > now:
                break
            del self._deadlines[name]
            effects += self._fire(name, due)
        return effects

    def on_transport_error(self, now: float) -> list[Effect]:
        """§17.1.4, §17.2.4: the transport could not send; tell the TU and stop."""
        if self.terminated:
            return []
        return [TransportError(self.request), *self._terminate("transport error")]

    def _fire(self, name: str, due: float) -> list[Effect]:
        raise NotImplementedError

    def _arm(self, name: str, at: float) -> None:
        self._deadlines[name] = at

    def _send(self, data: bytes) -> Send:
        self._wire = data
        return Send(data, self.peer)

    def _terminate(self, reason: str) -> list[Effect]:
        self.state = State.TERMINATED
        self._deadlines.clear()
        return [Terminated(self.key, reason)]

    def _wait(self, name: str, duration_s: float, now: float) -> list[Effect]:
        """Enter a state that absorbs retransmissions for ``duration_s``; none when reliable."""
        if self.reliable or duration_s <= 0:
            return self._terminate("completed")
        self._arm(name, now + duration_s)
        return []


class InviteClientTransaction(_Transaction):
    """§17.1.1 (figure 5) with RFC 6026 §8.4 (Accepted, Timer M).

    calling --1xx--> proceeding --1xx--> proceeding
    calling/proceeding --2xx--> accepted (2xx delivered; later 2xx too, for the TU's ACK)
    calling/proceeding --300-699--> completed (ACK sent, response delivered)
    completed --300-699 again--> completed (ACK resent, nothing delivered)
    calling --A--> calling (INVITE resent, A doubled) ; calling --B--> terminated (Timeout)
    completed --D--> terminated ; accepted --M--> terminated
    """

    def __init__(
        self,
        request: Request,
        *,
        reliable: bool,
        peer: Hashable = None,
        timers: Timers = DEFAULT_TIMERS,
    ) -> None:
        super().__init__(request, reliable=reliable, peer=peer, timers=timers)
        self.key = client_key(request)
        self.state = State.CALLING
        self._interval_s = timers.t1_s
        self._ack: bytes | None = None

    def start(self, now: float) -> list[Effect]:
        if not self.reliable:
            self._arm("A", now + self._interval_s)
        self._arm("B", now + 64 * self.timers.t1_s)
        return [self._send(self.request.serialize())]

    def on_response(self, response: Response, now: float) -> list[Effect]:
        status, state = response.status, self.state
        if state in (State.CALLING, State.PROCEEDING):
            if status < 200:
                self.state = State.PROCEEDING
                self._deadlines.pop("A", None)
                self._deadlines.pop("B", None)
                return [Deliver(response, self.peer)]
            self._deadlines.clear()
            if status < 300:
                self.state = State.ACCEPTED
                self._arm("M", now + 64 * self.timers.t1_s)
                return [Deliver(response, self.peer)]
            self.state = State.COMPLETED
            self._ack = make_ack(self.request, response).serialize()
            effects: list[Effect] = [Send(self._ack, self.peer), Deliver(response, self.peer)]
            return effects + self._wait("D", self.timers.d_s, now)
        if state is State.ACCEPTED and 200 <= status < 300:
            return [Deliver(response, self.peer)]
        if state is State.COMPLETED and status >= 300 and self._ack is not None:
            return [Send(self._ack, self.peer)]
        return []

    def _fire(self, name: str, due: float) -> list[Effect]:
        if name == "A" and self.state is State.CALLING:
            self._interval_s *= 2
            self._arm("A", due + self._interval_s)
            return [Send(self._wire, self.peer)]
        if name == "B" and self.state is State.CALLING:
            return [Timeout(self.request, "B"), *self._terminate("timeout")]
        if name in ("D", "M"):
            return self._terminate("completed")
        return []


class NonInviteClientTransaction(_Transaction):
    """§17.1.2 (figure 6).

    trying --1xx--> proceeding ; trying/proceeding --200-699--> completed (delivered)
    trying --E--> trying (resent, E = min(2E, T2)) ; proceeding --E--> proceeding (E = T2)
    trying/proceeding --F--> terminated (Timeout) ; completed --K--> terminated
    """

    def __init__(
        self,
        request: Request,
        *,
        reliable: bool,
        peer: Hashable = None,
        timers: Timers = DEFAULT_TIMERS,
    ) -> None:
        super().__init__(request, reliable=reliable, peer=peer, timers=timers)
        self.key = client_key(request)
        self._interval_s = timers.t1_s

    def start(self, now: float) -> list[Effect]:
        if not self.reliable:
            self._arm("E", now + self._interval_s)
        self._arm("F", now + 64 * self.timers.t1_s)
        return [self._send(self.request.serialize())]

    def on_response(self, response: Response, now: float) -> list[Effect]:
        if self.state not in (State.TRYING, State.PROCEEDING):
            return []  # completed: absorb retransmitted finals
        if response.status < 200:
            self.state = State.PROCEEDING
            return [Deliver(response, self.peer)]
        self.state = State.COMPLETED
        self._deadlines.clear()
        return [Deliver(response, self.peer), *self._wait("K", self.timers.t4_s, now)]

    def _fire(self, name: str, due: float) -> list[Effect]:
        if name == "E" and self.state in (State.TRYING, State.PROCEEDING):
            t2 = self.timers.t2_s
            self._interval_s = (
                t2 if self.state is State.PROCEEDING else min(2 * self._interval_s, t2)
            )
            self._arm("E", due + self._interval_s)
            return [Send(self._wire, self.peer)]
        if name == "F" and self.state in (State.TRYING, State.PROCEEDING):
            return [Timeout(self.request, "F"), *self._terminate("timeout")]
        if name == "K":
            return self._terminate("completed")
        return []


class InviteServerTransaction(_Transaction):
    """§17.2.1 (figure 7) with RFC 6026 §7.1 (Accepted, Timer L).

    proceeding --INVITE again--> proceeding (last provisional resent)
    proceeding --TU 1xx--> proceeding ; --TU 2xx--> accepted ; --TU 300-699--> completed
    completed --INVITE again--> completed (final resent) ; --G--> completed (resent, G doubled
    up to T2) ; --ACK--> confirmed ; --H--> terminated (Timeout: no ACK)
    confirmed --ACK--> confirmed (absorbed) ; --I--> terminated
    accepted --INVITE again--> absorbed ; --ACK--> delivered ; --TU 2xx--> sent ; --L--> end
    """

    def __init__(
        self,
        request: Request,
        *,
        reliable: bool,
        peer: Hashable = None,
        timers: Timers = DEFAULT_TIMERS,
    ) -> None:
        super().__init__(request, reliable=reliable, peer=peer, timers=timers)
        self.key = server_key(request)
        self.state = State.PROCEEDING
        self._interval_s = timers.t1_s
        self.final: Response | None = None

    def send_response(self, response: Response, now: float) -> list[Effect]:
        status, state = response.status, self.state
        if state is State.PROCEEDING:
            send = self._send(response.serialize())
            if status < 200:
                return [send]
            self.final = response
            if status < 300:
                self.state = State.ACCEPTED
                self._arm("L", now + 64 * self.timers.t1_s)
                return [send]
            self.state = State.COMPLETED
            if not self.reliable:
                self._arm("G", now + self._interval_s)
            self._arm("H", now + 64 * self.timers.t1_s)
            return [send]
        if state is State.ACCEPTED and 200 <= status < 300:
            return [Send(response.serialize(), self.peer)]  # the TU's 2xx retransmission
        return []

    def on_request(self, request: Request, now: float) -> list[Effect]:
        state = self.state
        if request.method == "ACK":
            if state is State.COMPLETED:
                self.state = State.CONFIRMED
                self._deadlines.clear()
                return self._wait("I", self.timers.t4_s, now)
            if state is State.ACCEPTED:
                return [Deliver(request, self.peer)]
            return []
        if state in (State.PROCEEDING, State.COMPLETED) and self._wire:
            return [Send(self._wire, self.peer)]
        return []

    def _fire(self, name: str, due: float) -> list[Effect]:
        if name == "G" and self.state is State.COMPLETED:
            self._interval_s = min(2 * self._interval_s, self.timers.t2_s)
            self._arm("G", due + self._interval_s)
            return [Send(self._wire, self.peer)]
        if name == "H" and self.state is State.COMPLETED:
            return [Timeout(self.request, "H"), *self._terminate("timeout")]
        if name in ("I", "L"):
            return self._terminate("completed")
        return []


class NonInviteServerTransaction(_Transaction):
    """§17.2.2 (figure 8).

    trying --request again--> trying (absorbed) ; trying/proceeding --TU 1xx--> proceeding
    proceeding --request again--> proceeding (last provisional resent)
    trying/proceeding --TU 200-699--> completed ; completed --request again--> final resent
    completed --J--> terminated
    """

    def __init__(
        self,
        request: Request,
        *,
        reliable: bool,
        peer: Hashable = None,
        timers: Timers = DEFAULT_TIMERS,
    ) -> None:
        super().__init__(request, reliable=reliable, peer=peer, timers=timers)
        self.key = server_key(request)

    def send_response(self, response: Response, now: float) -> list[Effect]:
        if self.state not in (State.TRYING, State.PROCEEDING):
            return []
        send = self._send(response.serialize())
        if response.status < 200:
            self.state = State.PROCEEDING
            return [send]
        self.state = State.COMPLETED
        return [send, *self._wait("J", 64 * self.timers.t1_s, now)]

    def on_request(self, request: Request, now: float) -> list[Effect]:
        if self.state in (State.PROCEEDING, State.COMPLETED):
            return [Send(self._wire, self.peer)]
        return []

    def _fire(self, name: str, due: float) -> list[Effect]:
        return self._terminate("completed") if name == "J" else []


ClientTransaction = InviteClientTransaction | NonInviteClientTransaction
ServerTransaction = InviteServerTransaction | NonInviteServerTransaction


def make_ack(invite: Request, response: Response) -> Request:
    """The ACK for a non-2xx final response (§17.1.1.3): same Request-URI, Call-ID, From, CSeq
    number and top Via as the INVITE, the To of the response, the INVITE's Route headers."""
    headers = Headers([("Via", str(invite.top_via))])
    for name in ("Max-Forwards", "From"):
        for value in invite.headers.get_all(name):
            headers.add(name, value)
    headers.add("To", response.headers.get("To") or "")
    headers.add("Call-ID", invite.headers.get("Call-ID") or "")
    headers.add("CSeq", f"{invite.cseq.seq} ACK")
    for value in invite.headers.get_all("Route"):
        headers.add("Route", value)
    return Request("ACK", invite.uri, headers)


def make_cancel(invite: Request) -> Request:
    """A CANCEL for a pending INVITE (§9.1): same Request-URI, Call-ID, To, From, CSeq number
    and top Via (so it reaches the same server transaction's branch), the INVITE's Routes."""
    headers = Headers([("Via", str(invite.top_via))])
    for name in ("Max-Forwards", "From", "To", "Call-ID"):
        for value in invite.headers.get_all(name):
            headers.add(name, value)
    headers.add("CSeq", f"{invite.cseq.seq} CANCEL")
    for value in invite.headers.get_all("Route"):
        headers.add("Route", value)
    return Request("CANCEL", invite.uri, headers)


class TransactionLayer:
    """All live transactions of one SIP endpoint, matched by key (§17.1.3, §17.2.3)."""

    def __init__(self, timers: Timers = DEFAULT_TIMERS) -> None:
        self.timers = timers
        self._client: dict[tuple[str, ...], ClientTransaction] = {}
        self._server: dict[tuple[str, ...], ServerTransaction] = {}

    def __len__(self) -> int:
        return len(self._client) + len(self._server)

    def send_request(
        self, request: Request, *, peer: Hashable, reliable: bool, now: float
    ) -> list[Effect]:
        """Start a client transaction; an ACK has none and is sent as it is (§17.1)."""
        if request.method == "ACK":
            return [Send(request.serialize(), peer)]
        txn: ClientTransaction
        if request.method == "INVITE":
            txn = InviteClientTransaction(request, reliable=reliable, peer=peer, timers=self.timers)
        else:
            txn = NonInviteClientTransaction(
                request, reliable=reliable, peer=peer, timers=self.timers
            )
        self._client[txn.key] = txn
        return txn.start(now)

    def receive(
        self, message: Request | Response, *, peer: Hashable, reliable: bool, now: float
    ) -> list[Effect]:
        """A parsed message from the transport."""
        try:
            key = client_key(message) if isinstance(message, Response) else server_key(message)
        except SipParseError:
            return []
        if isinstance(message, Response):
            client = self._client.get(key)
            if client is None:
                return [Deliver(message, peer)]  # a stray, e.g. a 2xx retransmission
            return self._reap(client.on_response(message, now))
        server = self._server.get(key)
        if server is not None:
            return self._reap(server.on_request(message, now))
        if message.method == "ACK":
            return [Deliver(message, peer)]  # the ACK of a 2xx is its own transaction (§17.2.3)
        txn: ServerTransaction
        if message.method == "INVITE":
            txn = InviteServerTransaction(message, reliable=reliable, peer=peer, timers=self.timers)
        else:
            txn = NonInviteServerTransaction(
                message, reliable=reliable, peer=peer, timers=self.timers
            )
        self._server[key] = txn
        return [Deliver(message, peer)]

    def send_response(self, response: Response, now: float) -> list[Effect]:
        """Send through the server transaction the response belongs to (by its Via and CSeq,
        which ``make_response`` copied). Raises ``LookupError`` when there is none: the shell
        sends such a response statelessly."""
        txn = self._server.get(server_key(response))
        if txn is None:
            raise LookupError("no server transaction for this response")
        return self._reap(txn.send_response(response, now))

    def invite_for_cancel(self, cancel: Request) -> InviteServerTransaction | None:
        """The INVITE server transaction a CANCEL targets (§9.2): same key, method INVITE."""
        key = (*server_key(cancel)[:-1], "INVITE")
        txn = self._server.get(key)
        return txn if isinstance(txn, InviteServerTransaction) else None

    def client(self, request: Request) -> ClientTransaction | None:
        return self._client.get(client_key(request))

    def next_deadline(self) -> float | None:
        deadlines = [
            d
            for txn in (*self._client.values(), *self._server.values())
            if (d := txn.next_deadline()) is not None
        ]
        return min(deadlines, default=None)

    def on_timer(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for txn in (*self._client.values(), *self._server.values()):
            deadline = txn.next_deadline()
            if deadline is not None and deadline <= now:
                effects += txn.on_timer(now)
        return self._reap(effects)

    def transport_error(self, peer: Hashable, now: float) -> list[Effect]:
        """The connection or route to ``peer`` failed: every transaction using it ends."""
        effects: list[Effect] = []
        for txn in (*self._client.values(), *self._server.values()):
            if txn.peer == peer:
                effects += txn.on_transport_error(now)
        return self._reap(effects)

    def _reap(self, effects: list[Effect]) -> list[Effect]:
        for effect in effects:
            if isinstance(effect, Terminated):
                self._client.pop(effect.key, None)
                self._server.pop(effect.key, None)
        return effects
