"""Calls the gateway places through Twilio: outbound app calls and transfer parties.

Theory of operation
-------------------
Twilio places a call when asked over REST (``POST /2010-04-01/Accounts/{AccountSid}/Calls.json``,
form fields ``To``, ``From``, ``Twiml``, ``StatusCallback``, ``StatusCallbackEvent`` and
``Timeout``). The inline TwiML is the ``<Connect><Stream>`` the voice webhook answers
(docs/protocol-twilio.md, "Outbound calls") with one more ``<Parameter>``:
:data:`DIAL_TOKEN_PARAM`, a random token that only
this gateway and Twilio see. When the callee answers, Twilio runs the TwiML and opens the Media
Stream; its ``start`` carries the token back in ``customParameters``, which is how the stream is
tied to the dial (:func:`claim_outbound_stream`, the stream endpoint's one hook). A stream whose
token matches no live dial is refused, as unknown streams are; so is a stream for a dialed
CallSid that comes without its token.

Twilio reports progress on the status callback, ``POST /twilio/status?dial=<id>``, signed like the
voice webhook: ``initiated``, ``ringing``, ``in-progress`` (answered), then ``completed``,
``busy``, ``no-answer``, ``failed`` or ``canceled``. :class:`DialProgress` is the sans-I/O core
that turns those, the stream's start, our own deadline and our own hang-up into one outcome.
Callbacks may arrive out of order (their ``SequenceNumber`` says), before the REST answer, or
after the stream already started; the core never moves backwards.

Two users of the same dial:

* ``POST /v1/calls`` with ``"carrier": "twilio"`` (:meth:`TwilioOutbound.place`). A Call (direction
  ``outbound``, callRef = the CallSid, docs/protocol-twilio.md) is registered at once in state
  ``dialing``, then ``ringing`` and ``answered`` as Twilio reports; when the stream starts, the app
  is dialed and the session opens, so ``session.start`` goes out only once the callee answered (as
  for SIP, carriers/sip/outbound.py). Outcomes before an answer have no session; the record keeps
  ``state`` = ``endReason`` = ``busy``, ``no-answer``, ``failed`` or ``canceled``, plus
  ``twilioStatus`` (Twilio's word for it, None when the gateway decided: our deadline, a DELETE). A
  DELETE while ringing cancels the Twilio call (REST ``Status=canceled``); after the answer the
  leg's usual hang-up applies (``Status=completed``).
* A transfer's new party (:meth:`TwilioOutbound.dial_party`, via ``TwilioLeg.dial_party``): no
  app; it resolves with the party's :class:`~appbridge.carriers.twilio.TwilioLeg` once its stream
  starts, or raises ``TransferError("transfer_failed")`` on busy, no-answer, failed, or no answer
  within ``timeout_s``. When the awaiting task is cancelled, the Twilio call is canceled.

In a cluster both Twilio requests of a dial may land on any node, since they are addressed to
the load balancer (docs/scaling.md, "Calls placed through Twilio"): the placing node names itself
in the callback's query (:data:`NODE_QUERY`) and in the stream's :data:`NODE_PARAM`, and a node
that does not hold the dial forwards the callback (carriers/twilio/status.py,
cluster/dial_relay.py) or relays the stream (cluster/stream_relay.py) to the node named, after
its own signature check.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import quote

import httpx

from appbridge.calls import intake
from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.requests import CallRequest, OutboundError
from appbridge.carriers.twilio.leg import TwilioLeg
from appbridge.carriers.twilio.twiml import stream_url, twiml_stream
from appbridge.cluster import cluster_of

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.carriers.services import CarrierServices
    from appbridge.carriers.twilio.leg import ASGISend
    from appbridge.carriers.twilio.rest import TwilioRestClient
    from appbridge.protocol.session_v1 import EndReason
    from appbridge.protocol.twilio_streams import TwilioStartInfo

log = logging.getLogger(__name__)

#: The ``<Parameter>`` that ties a Media Stream back to the dial that asked for it.
DIAL_TOKEN_PARAM: Final = "appbridgeDial"
#: Clustered, the ``<Parameter>`` and the callback's query field naming the node that dialed.
NODE_PARAM: Final = "appbridgeNode"
NODE_QUERY: Final = "node"
STATUS_PATH: Final = "/twilio/status"
#: Progress events asked of Twilio (its ``StatusCallbackEvent`` values).
STATUS_EVENTS: Final = ("initiated", "ringing", "answered", "completed")
#: Twilio's ``Timeout`` is whole seconds, at most 600.
MAX_TWILIO_TIMEOUT_S: Final = 600
#: How long a finished dial is remembered, so late callbacks are matched and ignored quietly.
LINGER_S: Final = 60.0
E164_RE: Final = re.compile(r"\+[1-9][0-9]{1,14}")
CALL_SID_RE: Final = re.compile(r"CA[0-9a-fA-F]{32}")
#: A dial id as :meth:`TwilioOutbound._new_dial` makes them; nothing else is forwarded.
DIAL_ID_RE: Final = re.compile(r"[0-9a-f]{24}")

Phase = Literal["dialing", "ringing", "answered", "ended"]
Outcome = Literal["busy", "no-answer", "failed", "canceled"]
#: What one input changed, for the shell to act on.
Change = Literal["none", "ringing", "answered", "outcome", "late_answer", "remote_hangup"]
_OUTCOME_OF: Final[dict[str, Outcome]] = {
    "busy": "busy",
    "no-answer": "no-answer",
    "failed": "failed",
    "canceled": "canceled",
}
TWILIO_OUTCOMES: Final = frozenset(_OUTCOME_OF)


class Refused:
    """The stream names a dial it has no right to: close it (policy violation, 1008)."""


REFUSED: Final = Refused()


# -- the sans-I/O core -----------------------------------------------------------------------------


@dataclass
class DialProgress:
    """Where one Twilio-placed call stands. No I/O, no clock: ``now`` is an argument.

    ``phase`` only moves forward: dialing → ringing → answered → ended (an outcome ends it from
    dialing or ringing). ``outcome`` is set once, by Twilio's final status or by the gateway giving
    up (:meth:`give_up`); ``twilio_status`` is Twilio's word when Twilio decided.
    """

    started_s: float
    timeout_s: float
    phase: Phase = "dialing"
    outcome: Outcome | None = None
    twilio_status: str | None = None
    last_sequence: int = -1
    streamed: bool = False

    @property
    def deadline_s(self) -> float | None:
        """When an unanswered call is given up (None once answered or over)."""
        if self.phase in ("dialing", "ringing"):
            return self.started_s + self.timeout_s
        return None

    def on_status(self, status: str, sequence: int | None = None) -> Change:
        """One status callback's ``CallStatus`` (and ``SequenceNumber``, when present)."""
        if sequence is not None:
            if sequence <= self.last_sequence:
                return "none"  # a duplicate, or overtaken by a later callback
            self.last_sequence = sequence
        if status in ("queued", "initiated"):
            return "none"
        if status == "ringing":
            if self.phase == "dialing":
                self.phase = "ringing"
                return "ringing"
            return "none"
        if status == "in-progress":
            if self.phase in ("dialing", "ringing"):
                self.phase = "answered"
                self.twilio_status = status
                return "answered"
            if self.phase == "ended" and self.outcome is not None and not self.streamed:
                return "late_answer"  # we gave up and the answer crossed it: end it at once
            return "none"
        if status == "completed" or status in TWILIO_OUTCOMES:
            if self.phase == "answered":
                self.phase = "ended"
                return "remote_hangup"
            if self.phase == "ended":
                return "none"
            # Final before any answer. ``completed`` without an answer has no better name.
            self.phase = "ended"
            self.outcome = _OUTCOME_OF.get(status, "failed")
            self.twilio_status = status
            return "outcome"
        return "none"

    def on_stream(self) -> bool:
        """The dial's Media Stream started: the callee answered. False: the gateway already gave
        up on this call (or it ended), so the stream must be refused."""
        if self.phase == "ended" or self.streamed:
            return False
        self.streamed = True
        self.phase = "answered"
        return True

    def deadline_passed(self, now: float) -> bool:
        deadline = self.deadline_s
        return deadline is not None and now >= deadline

    def give_up(self, outcome: Outcome) -> Literal["canceled", "completed"] | None:
        """The gateway ends the call (deadline, DELETE, a cancelled transfer). Returns the REST
        ``Status`` that ends it at Twilio: ``canceled`` before the answer (Twilio's word for a
        queued or ringing call), ``completed`` after; None when it is over already."""
        if self.phase == "ended":
            return None
        if self.phase == "answered":
            self.phase = "ended"
            return "completed"
        self.phase = "ended"
        self.outcome = outcome
        return "canceled"


# -- the asyncio shell ----------------------------------------------------------------------------


@dataclass(eq=False)
class TwilioDial:
    """One call placed through Twilio, for an app (``call``) or as a party (``party``)."""

    dial_id: str
    token: str
    to: str
    progress: DialProgress
    call: Call | None = None
    party: asyncio.Future[TwilioLeg] | None = None
    call_sid: str | None = None
    leg: TwilioLeg | None = None
    connecting: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class TwilioRefusedCall(Exception):
    """Twilio's REST API did not create the call (an HTTP error, or a Twilio error body)."""


class TwilioOutbound:
    """The dials of one gateway (module doc). Reached through :func:`outbound_for`."""

    def __init__(self, gw: CarrierServices) -> None:
        self.gw = gw
        self._by_id: dict[str, TwilioDial] = {}
        self._by_token: dict[str, TwilioDial] = {}
        self._by_sid: dict[str, TwilioDial] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._by_id)

    def dial(self, dial_id: str) -> TwilioDial | None:
        return self._by_id.get(dial_id)

    def dial_for_sid(self, call_sid: str) -> TwilioDial | None:
        return self._by_sid.get(call_sid)

    # -- placing ---------------------------------------------------------------------------------
    def _rest(self) -> TwilioRestClient | None:
        rest = self.gw.twilio_rest
        return rest if rest is not None and rest.usable else None

    def _new_dial(self, to: str, timeout_s: float) -> TwilioDial:
        progress = DialProgress(started_s=self.gw.clock.now(), timeout_s=timeout_s)
        d = TwilioDial(
            dial_id=secrets.token_hex(12), token=secrets.token_urlsafe(24), to=to, progress=progress
        )
        self._by_id[d.dial_id] = d
        self._by_token[d.token] = d
        return d

    def _form(self, d: TwilioDial, to: str, from_: str) -> dict[str, str | list[str]]:
        base = self.gw.config.server.base_url()
        params = {"from": from_, "to": to, "direction": "outbound", DIAL_TOKEN_PARAM: d.token}
        callback = f"{base}{STATUS_PATH}?dial={d.dial_id}"
        cluster = cluster_of(self.gw)
        if cluster is not None:
            params[NODE_PARAM] = cluster.node_id
            callback += f"&{NODE_QUERY}={quote(cluster.node_id)}"
        timeout = min(MAX_TWILIO_TIMEOUT_S, max(1, math.ceil(d.progress.timeout_s)))
        return {
            "To": to,
            "From": from_,
            "Twiml": twiml_stream(stream_url(base), params),
            "StatusCallback": callback,
            "StatusCallbackMethod": "POST",
            "StatusCallbackEvent": list(STATUS_EVENTS),
            "Timeout": str(timeout),
        }

    async def _create(self, d: TwilioDial, to: str, from_: str) -> str:
        rest = self._rest()
        if rest is None:
            raise TwilioRefusedCall("carriers.twilio.auth_token is needed to place calls")
        try:
            resp = await rest.create_call(self._form(d, to, from_))
        except httpx.HTTPError as exc:
            raise TwilioRefusedCall(f"Twilio's API failed: {type(exc).__name__}") from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            detail = ""
            if isinstance(body, dict):
                detail = f": {body.get('code')} {body.get('message')}"
            raise TwilioRefusedCall(f"Twilio refused the call (HTTP {resp.status_code}{detail})")
        sid = body.get("sid") if isinstance(body, dict) else None
        if not isinstance(sid, str) or CALL_SID_RE.fullmatch(sid) is None:
            raise TwilioRefusedCall("Twilio's answer carries no Call sid")
        if d.call_sid is not None and d.call_sid != sid:
            raise TwilioRefusedCall("Twilio's callbacks and answer disagree on the Call sid")
        d.call_sid = sid
        self._by_sid[sid] = d
        return sid

    async def place(self, req: CallRequest) -> Call:
        """``POST /v1/calls`` with the Twilio carrier: create the call, register it ``dialing``.
        Raises :class:`~appbridge.carriers.sip.outbound.OutboundError`."""
        gw = self.gw
        if self._rest() is None:
            raise OutboundError(
                503, "unavailable", "carriers.twilio.auth_token is needed to place Twilio calls"
            )
        if intake.refusal(gw) is not None:
            raise OutboundError(503, "unavailable", "the gateway takes no new calls right now")
        d = self._new_dial(req.to, req.timeout_s)
        try:
            sid = await self._create(d, req.to, req.from_)
        except TwilioRefusedCall as exc:
            self._forget(d)
            raise OutboundError(502, "carrier_error", str(exc)) from None
        call = intake.open_call(
            gw,
            call_ref=sid,
            app=req.app,
            direction="outbound",
            from_=req.from_,
            to=req.to,
            carrier="twilio",
            metadata=req.metadata,
        )
        d.call = call
        # Ended before the answer by anyone else (DELETE, shutdown): that is a cancel.
        gw.registry.set_final_fields(
            sid, {"state": "canceled", "endReason": "canceled", "twilioStatus": None}
        )
        self._arm(d)
        d.watcher = asyncio.get_running_loop().create_task(
            self._watch(d), name=f"twilio-outbound:{sid}"
        )
        log.info("call %s: placed through Twilio to %s", sid, req.to)
        self._sync(d)  # callbacks (or the stream) may have come before the REST answer
        return call

    async def dial_party(self, target: str, *, caller_id: str, timeout_s: float) -> TwilioLeg:
        """A transfer's new party on Twilio: the party's leg once its stream starts."""
        if E164_RE.fullmatch(target) is None:
            raise TransferError("transfer_failed", f"{target!r} is not an E.164 number")
        if self._rest() is None:
            raise TransferError(
                "transfer_failed", "carriers.twilio.auth_token is needed to place Twilio calls"
            )
        d = self._new_dial(target, timeout_s)
        d.party = asyncio.get_running_loop().create_future()
        try:
            try:
                await self._create(d, target, caller_id)
            except TwilioRefusedCall as exc:
                raise TransferError("transfer_failed", f"{target}: {exc}") from None
            self._arm(d)
            self._settle_party(d)
            return await d.party
        except asyncio.CancelledError:
            self._give_up(d, "canceled")
            raise
        finally:
            self._stop_timer(d)
            self._forget_later(d)

    # -- inputs ----------------------------------------------------------------------------------
    def on_status(self, dial_id: str, form: dict[str, str]) -> bool:
        """A status callback (already signature-checked). False: no such dial (ignored)."""
        d = self._by_id.get(dial_id)
        if d is None:
            return False
        sid = form.get("CallSid", "")
        if d.call_sid is None and CALL_SID_RE.fullmatch(sid):
            d.call_sid = sid
            self._by_sid[sid] = d
        elif sid != d.call_sid:
            log.warning("twilio status: CallSid %s is not dial %s's; ignored", sid, dial_id)
            return False
        status = form.get("CallStatus", "")
        raw_seq = form.get("SequenceNumber", "")
        sequence = int(raw_seq) if raw_seq.isdigit() else None
        change = d.progress.on_status(status, sequence)
        log.debug("twilio status: %s %s → %s", sid, status, change)
        if change == "late_answer":
            self._spawn(self._update(d, "completed"))
        # After the answer, the stream's closing is what tells the call (or the bridge) that
        # the callee hung up; ``completed`` here only matters when the session never began.
        if d.call is not None:
            self._sync(d)
        else:
            self._settle_party(d)
        return True

    def on_stream_start(self, info: TwilioStartInfo, send: ASGISend) -> TwilioLeg | Refused | None:
        """The stream endpoint's hook (module doc). None: not a stream this gateway dialed."""
        token = info.custom_parameters.get(DIAL_TOKEN_PARAM)
        if token is None:
            if info.call_sid in self._by_sid:
                log.warning("twilio stream: %s came without its dial token", info.call_sid)
                return REFUSED
            return None
        d = self._by_token.get(token)
        if d is None or (d.call_sid is not None and d.call_sid != info.call_sid):
            log.warning("twilio stream: start for unknown dial (call %s)", info.call_sid)
            return REFUSED
        if d.call_sid is None and CALL_SID_RE.fullmatch(info.call_sid):
            d.call_sid = info.call_sid
            self._by_sid[info.call_sid] = d
        if not d.progress.on_stream():
            log.info("call %s: answered after the gateway gave up; hanging up", info.call_sid)
            self._spawn(self._update(d, "completed"))
            return REFUSED
        d.leg = TwilioLeg(send, info.stream_sid, info.call_sid, self.gw.twilio_rest, outbound=self)
        self._stop_timer(d)
        if d.call is not None:
            self._sync(d)
        else:
            self._settle_party(d)
        return d.leg

    def _on_deadline(self, d: TwilioDial) -> None:
        d.timer = None
        if not d.progress.deadline_passed(self.gw.clock.now()):
            self._arm(d)
            return
        log.info("twilio dial to %s: no answer in time; canceling", d.to)
        self._give_up(d, "no-answer")

    # -- effects -----------------------------------------------------------------------------------
    def _sync(self, d: TwilioDial) -> None:
        """Bring an app call's record in line with its dial's progress."""
        call = d.call
        assert call is not None
        if call.over:
            return
        p = d.progress
        if p.outcome is not None:
            fields = {"state": p.outcome, "endReason": p.outcome, "twilioStatus": p.twilio_status}
            self.gw.registry.set_final_fields(call.call_ref, fields)
            # As for SIP: our own deadline is a timeout; what the far end decided, its hang-up.
            reason: EndReason = "timeout" if p.twilio_status is None else "caller_hangup"
            call.spawn(call.end(reason, carrier_gone=True), f"end-{p.outcome}")
            return
        if p.phase == "ended" and call.leg is None:
            # Over at Twilio before the session began: the callee hung up while the app was
            # dialed, or the stream never came.
            if d.leg is None:
                fields = {"state": "failed", "endReason": "failed", "twilioStatus": "completed"}
                self.gw.registry.set_final_fields(call.call_ref, fields)
            call.spawn(call.end("caller_hangup", carrier_gone=True), "end-before-session")
            return
        if p.phase == "ringing":
            call.carrier_ringing()
        elif p.phase in ("answered", "ended") and call.carrier_answered():
            self.gw.registry.clear_final_fields(call.call_ref)
        if d.leg is not None and not d.connecting:
            d.connecting = True
            call.spawn(self._connect(d, d.leg), "twilio-outbound-connect")

    async def _connect(self, d: TwilioDial, leg: TwilioLeg) -> None:
        """The callee answered and its stream is here: now the app is dialed (module doc)."""
        call = d.call
        assert call is not None
        answered = await call.connect_app()
        if call.over:
            return
        if not answered:
            self.gw.registry.set_final_fields(
                call.call_ref,
                {"state": "failed", "endReason": "app_unreachable", "twilioStatus": "in-progress"},
            )
            await call.end("error")
            return
        if leg.closed:  # the callee hung up while the app was being dialed
            await call.end("caller_hangup", carrier_gone=True)
            return
        call.attach_carrier(leg)
        log.info("call %s: answered; session started", call.call_ref)

    def _settle_party(self, d: TwilioDial) -> None:
        fut = d.party
        if fut is None or fut.done():
            return
        p = d.progress
        if d.leg is not None:
            fut.set_result(d.leg)
        elif p.outcome is not None:
            why = "no answer in time" if p.twilio_status is None else p.twilio_status
            fut.set_exception(TransferError("transfer_failed", f"{d.to}: {why}"))

    def _give_up(self, d: TwilioDial, outcome: Outcome) -> None:
        status = d.progress.give_up(outcome)
        self._stop_timer(d)
        if status is not None and d.call_sid is not None:
            self._spawn(self._update(d, status))
        if d.leg is not None and (d.call is None or d.call.leg is None):
            self._spawn(d.leg.close())
        if d.call is not None:
            self._sync(d)
        else:
            self._settle_party(d)

    async def _update(self, d: TwilioDial, status: str) -> None:
        rest = self._rest()
        if rest is None or d.call_sid is None:
            return
        try:
            resp = await rest.update_call(d.call_sid, {"Status": status})
        except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: closed at shutdown
            log.warning("twilio: Status=%s of %s failed: %s", status, d.call_sid, exc)
            return
        if resp.status_code >= 400:
            log.warning("twilio: Status=%s of %s answered %s", status, d.call_sid, resp.status_code)

    async def _watch(self, d: TwilioDial) -> None:
        """When an app call ends before its leg was attached, end it at Twilio too."""
        call = d.call
        assert call is not None
        await call.ended.wait()
        self._stop_timer(d)
        attached = call.leg is not None  # an attached leg hung up (or let go) in Call.end
        status = d.progress.give_up("canceled")
        if not attached:
            if status is not None:
                await self._update(d, status)
            if d.leg is not None:
                await d.leg.close()
        self._forget_later(d)

    def _arm(self, d: TwilioDial) -> None:
        deadline = d.progress.deadline_s
        if deadline is None or d.timer is not None:
            return
        delay_s = max(0.0, deadline - self.gw.clock.now())
        d.timer = asyncio.get_running_loop().call_later(delay_s, self._on_deadline, d)

    def _stop_timer(self, d: TwilioDial) -> None:
        if d.timer is not None:
            d.timer.cancel()
            d.timer = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_later(self, d: TwilioDial) -> None:
        asyncio.get_running_loop().call_later(LINGER_S, self._forget, d)

    def _forget(self, d: TwilioDial) -> None:
        self._by_id.pop(d.dial_id, None)
        self._by_token.pop(d.token, None)
        if d.call_sid is not None and self._by_sid.get(d.call_sid) is d:
            del self._by_sid[d.call_sid]


# -- per gateway, and the two entry points of the routes ----------------------------------------


def outbound_for(gw: CarrierServices) -> TwilioOutbound:
    """The gateway's :class:`TwilioOutbound` (``twilio_outbound``), made on first use."""
    found = gw.twilio_outbound
    if found is None:
        found = gw.twilio_outbound = TwilioOutbound(gw)
    return found


def claim_outbound_stream(
    gw: CarrierServices, info: TwilioStartInfo, send: ASGISend
) -> TwilioLeg | Refused | None:
    """The stream endpoint's hook: the leg of a dial's stream, :data:`REFUSED`, or None when
    the stream is not one the gateway dialed out (the inbound path decides)."""
    found = gw.twilio_outbound
    if found is None:
        if DIAL_TOKEN_PARAM in info.custom_parameters:
            return REFUSED
        return None
    return found.on_stream_start(info, send)


def dial_owner(gw: CarrierServices, info: TwilioStartInfo) -> str | None:
    """Clustered, the node a dial's stream belongs to when it is not this one: the node its
    :data:`NODE_PARAM` names, for a dial token this node does not hold (module doc)."""
    cluster = cluster_of(gw)
    params = info.custom_parameters
    owner = params.get(NODE_PARAM)
    if cluster is None or owner is None or owner == cluster.node_id:
        return None
    found = gw.twilio_outbound
    token = params.get(DIAL_TOKEN_PARAM)
    if token is None or (found is not None and token in found._by_token):
        return None
    return owner
