"""The SIP test caller's UAC: one call's signalling and media (API in :mod:`appbridge.caller.sip`).

Signalling rides on :class:`~.link.SipLink`; the dialog, its ACK and BYE come from
:mod:`appbridge.carriers.sip.dialog` (RFC 3261 §12, §13.2.2.4, §15), the offer/answer from
:mod:`~appbridge.carriers.sip.offer_answer` (RFC 3264 §5, §7), and the media from
:class:`~appbridge.carriers.sip.leg.SipLeg`, ticked every 20 ms by :meth:`SipTestCaller.tick`
(what ``SipLeg.end_tick`` does for the gateway's engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from appbridge.caller.sip.link import SipLink, parse_sip_target
from appbridge.carriers.sip.dialog import Dialog, DialogError
from appbridge.carriers.sip.headers import SipParseError, SipUri
from appbridge.carriers.sip.leg import LEG_CODECS, RtpPortPool, RtpProtocol, SipLeg, open_rtp
from appbridge.carriers.sip.message import (
    Headers,
    Request,
    Response,
    make_response,
    new_branch,
    new_call_id,
    new_tag,
)
from appbridge.carriers.sip.offer_answer import OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.sdp import SdpError, SessionDescription
from appbridge.carriers.sip.transaction import make_cancel
from appbridge.carriers.sip.transport import SDP_TYPE
from appbridge.clock import Clock, SystemClock
from appbridge.media.codecs import PCM16_8K, Converter

__all__ = ["OFFER_CODECS", "CallEvent", "SipCallFailed", "SipTestCaller"]

FRAME_S = 0.020
FRAME_BYTES = 320  # 20 ms of pcm16 at 8 kHz
DEFAULT_FROM_USER = "+15550001111"
#: What the offer carries (PCMU, PCMA, telephone-event; docs/caller.md); ``codecs=`` may add G722.
OFFER_CODECS: tuple[str, ...] = ("PCMU", "PCMA")
ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO"
USER_AGENT = "AppBridge-test-caller"
DTMF_DIGITS = frozenset("0123456789*#ABCD")
#: The media clock resynchronises instead of bursting when it fell this far behind.
MAX_LAG_S = 0.1
BYE_WAIT_S = 5.0
#: RTP ports of the caller: a random even block of this size inside the range below.
RTP_BLOCK = 200
RTP_RANGE = (50000, 59998)

Emit = Callable[[str], None]


class SipCallFailed(Exception):
    """The call was not answered: ``status`` is the final SIP status (408 for no answer or no
    response at all, 503 for a transport failure, RFC 3261 §8.1.3.1)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CallEvent:
    """One thing that happened on the call; ``at_s`` is seconds since the INVITE."""

    kind: str
    at_s: float
    status: int | None = None
    digit: str = ""
    text: str = ""


class _Sink:
    """The :class:`~appbridge.calls.carrier_leg.CarrierEvents` of the caller's :class:`SipLeg`."""

    def __init__(self, caller: SipTestCaller) -> None:
        self.caller = caller

    def on_carrier_audio(self, payload: bytes) -> None:
        self.caller._on_audio(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        self.caller._on_dtmf(digit)

    def on_carrier_hangup(self) -> None:
        """Not used: the caller's own signalling sees the BYE."""


class SipTestCaller:
    """One SIP call placed toward ``uri`` (module doc for the API)."""

    def __init__(
        self,
        uri: str,
        *,
        from_user: str = DEFAULT_FROM_USER,
        emit: Emit | None = None,
        headers: dict[str, str] | None = None,
        codecs: tuple[str, ...] = OFFER_CODECS,
        clock: Clock | None = None,
    ) -> None:
        unknown = [c for c in codecs if c not in LEG_CODECS]
        if unknown or not codecs:
            raise ValueError(f"codecs must be among {LEG_CODECS}, got {codecs}")
        self.codecs = codecs
        self.target = parse_sip_target(uri)
        self.from_user = from_user
        self.extra_headers = dict(headers or {})
        self.clock: Clock = clock or SystemClock()
        self.emit = emit
        self.events: asyncio.Queue[CallEvent] = asyncio.Queue()
        self.history: list[CallEvent] = []
        self.received_digits: list[str] = []
        self.status: int | None = None  # the INVITE's final status
        self.reason = ""
        self.answered_at_s: float | None = None
        self.ended_at_s: float | None = None
        self.hung_up_by = ""  # "caller" (us) or "remote"
        self.leg: SipLeg | None = None
        self.invite: Request | None = None
        self.dialog: Dialog | None = None
        self._link: SipLink | None = None
        self._rtp: RtpProtocol | None = None
        self._negotiator: SdpNegotiator | None = None
        self._t0 = time.monotonic()
        self._final: asyncio.Future[int] | None = None
        self._bye_done: asyncio.Future[None] | None = None
        self._provisional = False
        self._cancel_wanted = False
        self._cancel_sent = False
        self._ended = asyncio.Event()
        self._pulse = asyncio.Event()
        self._out = bytearray()
        self._heard = bytearray()
        self._encode: Converter | None = None
        self._decode: Converter | None = None
        self._media_task: asyncio.Task[None] | None = None
        self.run_media_clock = True  # unit tests drive ``tick(now)`` by hand instead

    # -- helpers ---------------------------------------------------------------------------
    def _rel(self) -> float:
        return time.monotonic() - self._t0

    def _event(self, kind: str, text: str, *, status: int | None = None, digit: str = "") -> None:
        ev = CallEvent(kind, self._rel(), status, digit, text)
        self.history.append(ev)
        self.events.put_nowait(ev)
        if self.emit is not None:
            self.emit(f"{ev.at_s:8.3f}s  {text}")
        self._wake()

    def _wake(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float | None) -> None:
        """Wait until ``condition()`` holds; it is checked after every media tick and event."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not condition():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("condition not met in time")
            await asyncio.wait_for(self._pulse.wait(), remaining)

    @property
    def answered(self) -> bool:
        return self.answered_at_s is not None

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    @property
    def local_address(self) -> tuple[str, int]:
        return self._link.local if self._link is not None else ("", 0)

    @property
    def queued_audio_s(self) -> float:
        return len(self._out) / (2 * PCM16_8K.rate_hz)

    @property
    def duration_s(self) -> float:
        """Seconds from the answer to the end (or to now, while the call lasts)."""
        if self.answered_at_s is None:
            return 0.0
        end = self.ended_at_s if self.ended_at_s is not None else self._rel()
        return end - self.answered_at_s

    # -- placing the call ------------------------------------------------------------------
    async def call(self, timeout_s: float = 30.0) -> int:
        """INVITE with an SDP offer, wait for the answer, ACK it (RFC 3261 §13.2)."""
        if self.invite is not None:
            raise RuntimeError("call() was already used; make a new SipTestCaller")
        self._t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        self._final = loop.create_future()
        self._link = link = self._make_link()
        try:
            await link.open()
        except OSError as exc:
            self._fail(503, f"cannot reach {self.target.host}:{self.target.port}: {exc}")
            raise SipCallFailed(503, self.reason) from None
        local_host = link.local[0]
        low = RTP_RANGE[0] + 2 * secrets.randbelow((RTP_RANGE[1] - RTP_RANGE[0] - RTP_BLOCK) // 2)
        opened = await open_rtp(local_host, RtpPortPool(low, low + RTP_BLOCK), self.clock)
        if opened is None:
            link.close()
            raise SipCallFailed(503, "no free RTP port")
        rtp_port, self._rtp = opened
        self._negotiator = SdpNegotiator(
            local_address=local_host, rtp_port=rtp_port, codecs=self.codecs, username="caller"
        )
        offer = self._negotiator.create_offer().serialize()
        self.invite = self._build_invite(offer)
        t = self.target
        self._event(
            "invite",
            f"INVITE {t.uri} over {t.transport.upper()} from {link.local[0]}:{link.local[1]} "
            f"(offer {', '.join(self.codecs)}, telephone-event; RTP port {rtp_port})",
        )
        link.send_request(self.invite)
        try:
            return await asyncio.wait_for(asyncio.shield(self._final), timeout_s)
        except TimeoutError:
            self._event("no_answer", f"no answer within {timeout_s:g} s: giving up")
            await self.hangup()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._final), BYE_WAIT_S)
            if not self._final.done():
                self._fail(408, "no answer")
            raise SipCallFailed(408, "no answer") from None

    def _make_link(self) -> SipLink:
        return SipLink(self.target, self.clock, self)

    def _build_invite(self, offer: bytes) -> Request:
        assert self._link is not None
        host, port = self._link.local
        kind = self.target.transport
        contact = SipUri(scheme="sip", user="caller", host=host, port=port)
        if kind != "udp":
            contact = contact.with_param("transport", kind)
        to_uri = SipUri(scheme="sip", user=self.target.uri.user, host=self.target.uri.host)
        if self.target.uri.port is not None:
            to_uri = SipUri(
                scheme="sip", user=to_uri.user, host=to_uri.host, port=self.target.uri.port
            )
        from_uri = SipUri(scheme="sip", user=self.from_user, host=host)
        proto = kind.upper()
        headers = Headers(
            [
                ("Via", f"SIP/2.0/{proto} {host}:{port};branch={new_branch()};rport"),
                ("Max-Forwards", "70"),
                ("From", f"<{from_uri}>;tag={new_tag()}"),
                ("To", f"<{to_uri}>"),
                ("Call-ID", new_call_id(host)),
                ("CSeq", "1 INVITE"),
                ("Contact", f"<{contact}>"),
                ("Allow", ALLOW),
                ("User-Agent", USER_AGENT),
            ]
        )
        for name, value in self.extra_headers.items():
            headers.add(name, value)
        headers.add("Content-Type", SDP_TYPE)
        return Request("INVITE", self.target.uri, headers, offer)

    # -- signalling (called by the link) -----------------------------------------------------
    def on_message(self, message: Request | Response) -> None:
        try:
            if isinstance(message, Response):
                self._on_response(message)
            else:
                self._on_request(message)
        except SipParseError:
            pass  # a message we cannot read is not ours to answer (the layer already did)

    def on_timeout(self, request: Request, *, unreachable: bool = False) -> None:
        """§8.1.3.1: a transaction timeout is a 408, a transport failure a 503."""
        if request.method == "INVITE" and not self._final_done():
            t = self.target
            if unreachable:
                self._fail(503, f"unreachable: nothing at {t.host}:{t.port} ({t.transport})")
            else:
                self._fail(408, "no response (Timer B)")
        elif request.method == "BYE":
            self._finish()

    def _final_done(self) -> bool:
        return self._final is not None and self._final.done()

    def _on_response(self, response: Response) -> None:
        method, status = response.cseq.method, response.status
        if method == "INVITE":
            if status < 200:
                self._provisional = True
                self._event("provisional", f"{status} {response.reason}", status=status)
                if self._cancel_wanted and not self._cancel_sent:
                    self._send_cancel()
            elif status < 300:
                self._on_2xx(response)
            elif not self._final_done():
                self._fail(status, response.reason)
        elif method == "BYE" and status >= 200:
            self._event("bye_answered", f"BYE answered {status} {response.reason}", status=status)
            self._finish()

    def _on_2xx(self, response: Response) -> None:
        link, invite = self._link, self.invite
        assert link is not None and invite is not None
        if self.dialog is not None:  # a retransmitted 2xx: the same ACK again (§13.2.2.4)
            ack = self.dialog.ack_for(response)
            if ack is not None:
                link.send_request(ack)
            return
        try:
            self.dialog = Dialog.from_uac(invite, response)
        except DialogError as exc:
            self._fail(response.status, f"unusable answer: {exc}")
            return
        link.send_request(self.dialog.create_ack(invite.cseq.seq))
        if self._final_done() or self._cancel_sent:
            self._send_bye()  # answered after we gave up (§15)
            return
        assert self._negotiator is not None and self._rtp is not None
        try:
            negotiated = self._negotiator.process_answer(SessionDescription.parse(response.body))
        except (SdpError, OfferAnswerError) as exc:
            self._send_bye()
            self._fail(488, f"unusable SDP answer: {exc}")
            return
        rtp = self._rtp
        self.leg = leg = SipLeg(
            negotiated, clock=self.clock, send_datagram=rtp.send, defer=lambda fn: None
        )
        leg.attach(_Sink(self))
        rtp.leg = leg
        self._encode = Converter(PCM16_8K, leg.audio_format)
        self._decode = Converter(leg.audio_format, PCM16_8K)
        self.status, self.reason = response.status, response.reason
        self.answered_at_s = self._rel()
        codec = negotiated.codec.name
        events = negotiated.send_event_payload_type
        dtmf = f"telephone-event {events}" if events is not None else "no telephone-event"
        where = f"{negotiated.remote_address}:{negotiated.remote_port}"
        self._event(
            "answered",
            f"{response.status} {response.reason}: answered ({codec}, {dtmf}; RTP to {where}); "
            "ACK sent",
            status=response.status,
        )
        if self.run_media_clock:
            self._media_task = asyncio.get_running_loop().create_task(self._media_clock())
        assert self._final is not None
        self._final.set_result(response.status)

    def _on_request(self, request: Request) -> None:
        link = self._link
        assert link is not None
        method = request.method
        if method == "ACK":
            return
        dialog = self.dialog
        if dialog is None or not dialog.matches(request):
            if method == "OPTIONS":
                link.respond(request, 200, headers=[("Allow", ALLOW)])
            else:
                link.respond(request, 481)
            return
        try:
            dialog.on_request(request)
        except DialogError as exc:
            link.respond(request, exc.status)
            return
        if method == "BYE":
            link.respond(request, 200)
            self.hung_up_by = self.hung_up_by or "remote"
            self._event("remote_hangup", "remote hung up (BYE received, answered 200)")
            self._finish()
        elif method == "INVITE":
            self._on_reinvite(request)
        elif method in ("OPTIONS", "INFO"):
            link.respond(request, 200, headers=[("Allow", ALLOW)])
        else:
            link.respond(request, 405, headers=[("Allow", ALLOW)])

    def _on_reinvite(self, invite: Request) -> None:
        """Their hold or resume (RFC 3264 §8.4): answer and let the leg follow."""
        link, negotiator, dialog = self._link, self._negotiator, self.dialog
        assert link is not None and negotiator is not None and dialog is not None
        try:
            answer, negotiated = negotiator.create_answer(SessionDescription.parse(invite.body))
        except SdpError:
            link.respond(invite, 400)
            return
        except OfferAnswerError:
            link.respond(invite, 488)
            return
        if self.leg is not None:
            self.leg.update_media(negotiated)
        response = make_response(
            invite,
            200,
            to_tag=dialog.local_tag,
            headers=[("Contact", str(dialog.local_contact)), ("Allow", ALLOW)],
            body=answer.serialize(),
            content_type=SDP_TYPE,
        )
        with contextlib.suppress(LookupError):
            link._effects(link.layer.send_response(response, self.clock.now()))
        self._event("reinvite", f"re-INVITE answered ({negotiated.local_direction})")

    def _fail(self, status: int, reason: str) -> None:
        self.status, self.reason = status, reason
        self._event("failed", f"call failed: {status} {reason}", status=status)
        if self._final is not None and not self._final.done():
            self._final.set_exception(SipCallFailed(status, reason))
            self._final.exception()  # retrieved here: call() may already have given up
        self._finish()

    def _finish(self) -> None:
        if self._ended.is_set():
            return
        self.ended_at_s = self._rel()
        if self.leg is not None:
            self.leg.closed = True
        if self._bye_done is not None and not self._bye_done.done():
            self._bye_done.set_result(None)
        self._ended.set()
        self._event("ended", "call ended")

    # -- media -------------------------------------------------------------------------------
    async def _media_clock(self) -> None:
        """One tick every 20 ms on absolute deadlines, so the rate does not drift."""
        due = self.clock.now()
        while not self.ended:
            now = self.clock.now()
            if now - due > MAX_LAG_S:
                due = now  # stalled (a debugger, a busy machine): resync, do not burst
            self.tick(due)
            due += FRAME_S
            await asyncio.sleep(max(0.0, due - self.clock.now()))

    def tick(self, now: float) -> None:
        """One media tick (what ``SipLeg.end_tick`` does for the gateway): the caller's next
        20 ms frame (or silence, or RFC 4733 packets) out, due frames of the far end in."""
        leg, encode = self.leg, self._encode
        if leg is None or encode is None or leg.closed:
            return
        dtmf = leg.dtmf_out
        if self._out and not (dtmf.busy or dtmf.next_deadline() is not None):
            frame = bytes(self._out[:FRAME_BYTES]).ljust(FRAME_BYTES, b"\0")
            del self._out[:FRAME_BYTES]
            leg.send_frame(encode.convert(frame))
        leg.end_tick(now)
        self._wake()

    def _on_audio(self, payload: bytes) -> None:
        if self._decode is not None:
            self._heard += self._decode.convert(payload)

    def _on_dtmf(self, digit: str) -> None:
        self.received_digits.append(digit)
        self._event("dtmf_received", f"DTMF received: {digit}", digit=digit)

    def heard(self) -> bytes:
        """Everything heard so far: pcm16, 8 kHz, mono."""
        return bytes(self._heard)

    async def send_audio(self, pcm16_8k: bytes, *, wait: bool = True) -> None:
        """Queue caller audio (16-bit 8 kHz mono), sent 20 ms per packet in real time."""
        if not self.answered:
            raise RuntimeError("the call is not answered")
        self._out += pcm16_8k[: len(pcm16_8k) & ~1]
        if wait:
            await self.wait_until(lambda: not self._out or self.ended, None)

    async def send_digits(
        self, digits: str, *, interval_s: float | None = None, wait: bool = True
    ) -> None:
        """RFC 4733 keypresses (RFC 4733 §2.5.1); audio pauses while they play."""
        bad = sorted(set(digits.upper()) - DTMF_DIGITS)
        if bad:
            raise ValueError(f"not DTMF digits: {''.join(bad)!r}")
        leg = self.leg
        if leg is None or not self.answered:
            raise RuntimeError("the call is not answered")
        if leg.negotiated.send_event_payload_type is None:
            raise RuntimeError("the far end did not accept telephone-event")
        for i, digit in enumerate(digits.upper()):
            if i and interval_s is not None:
                await asyncio.sleep(interval_s)
            if self.ended:
                return
            leg.send_dtmf(digit)
            self._event("digit_sent", f"digit sent: {digit} (RFC 4733)", digit=digit)
        if wait:
            dtmf = leg.dtmf_out
            await self.wait_until(
                lambda: self.ended or not (dtmf.busy or dtmf.next_deadline() is not None), None
            )

    # -- waiting -----------------------------------------------------------------------------
    async def wait_for(self, kind: str, *, timeout_s: float = 10.0) -> CallEvent:
        """The first event of ``kind`` in :attr:`history`, waiting for it if needed."""

        def found() -> CallEvent | None:
            return next((e for e in self.history if e.kind == kind), None)

        await self.wait_until(lambda: found() is not None, timeout_s)
        event = found()
        assert event is not None
        return event

    async def wait_ended(self, timeout_s: float | None = None) -> None:
        await asyncio.wait_for(self._ended.wait(), timeout_s)

    # -- ending ------------------------------------------------------------------------------
    async def hangup(self) -> None:
        """BYE once answered (waits for its answer, at most 5 s), CANCEL while ringing."""
        if self.ended or self.invite is None:
            return
        self.hung_up_by = self.hung_up_by or "caller"
        if self.dialog is not None:
            self._send_bye()
            if self._bye_done is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._bye_done), BYE_WAIT_S)
            self._finish()
            return
        self._cancel_wanted = True
        if self._provisional:
            self._send_cancel()
        else:
            self._event("hangup", "hanging up: CANCEL waits for a provisional response (§9.1)")

    def _send_cancel(self) -> None:
        assert self._link is not None and self.invite is not None
        self._cancel_sent = True
        self._link.send_request(make_cancel(self.invite))
        self._event("hangup", "CANCEL sent")

    def _send_bye(self) -> None:
        if self.dialog is None or self._bye_done is not None or self._link is None:
            return
        self._bye_done = asyncio.get_running_loop().create_future()
        try:
            bye = self.dialog.create_request("BYE", headers=[("User-Agent", USER_AGENT)])
        except ValueError:
            self._bye_done.set_result(None)
            return
        self._link.send_request(bye)
        self._event("hangup", "BYE sent")

    async def close(self) -> None:
        """Hang up if needed and free the sockets."""
        with contextlib.suppress(Exception):
            await self.hangup()
        if self._media_task is not None:
            self._media_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._media_task
        if self._rtp is not None:
            self._rtp.close()
        if self._link is not None:
            self._link.close()

    async def __aenter__(self) -> SipTestCaller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> dict[str, int]:
        """Packet counts: ``sent`` (audio and events), ``received``, ``lost``."""
        leg = self.leg
        if leg is None:
            return {"sent": 0, "received": 0, "lost": 0}
        st = leg.receiver.stats
        return {"sent": leg.rtp.packets_sent, "received": st.received, "lost": st.lost}
