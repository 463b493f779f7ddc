"""The benchmark's SIP/RTP callers, on the gateway's own sans-I/O SIP cores.

The mix is half SIP/RTP calls, half Twilio-ingress calls. A :class:`SipCaller` is what
:class:`bench.lean_twilio.LeanTwilioCall` is for the Twilio half: it places one
call (INVITE with a PCMU offer, RFC 3261 §13.2 and RFC 3264 §5; ACK of the 2xx, §13.2.2.4),
sends the caller's voice as RTP every 20 ms (RFC 3550, RFC 3551 PCMU), records what the gateway
sends back, and ends with BYE (§15.1.1), or answers the gateway's BYE (the app hung up).

Lean by design, since the generator must stay below 70 % of its core (bench/README.md):

* one UDP socket per worker for signalling (:class:`SipEndpoint`), calls found by Call-ID;
  one UDP socket per call for RTP;
* one 20 ms ticker per worker (:class:`RtpTicker`) sends every call's packet, on absolute
  deadlines, the calls spread over 4 phases of the frame as independent callers' packets are
  (bench/ticker.py; a late tick sends once, it does not burst);
* recordings are flat ``array('d')`` / ``array('H')``: one float per packet each way and the
  audio byte count per packet received, nothing the collector has to walk;
* loopback only, so no retransmission of our requests (the gateway retransmits its 2xx until
  our ACK, and we ACK every copy); messages are built and parsed with
  :mod:`appbridge.carriers.sip.message`, SDP with :mod:`appbridge.carriers.sip.sdp`, RTP with
  :class:`appbridge.carriers.sip.rtp.RtpSender`.

What the gateway sends on RTP is continuous (silence when nothing plays, docs/sip.md), so a
packet is *audio* when its payload is not the codec's silence; :meth:`SipCaller.heard_frames`,
:meth:`~SipCaller.silence_after` and :attr:`~SipCaller.clear_times` give :mod:`bench.analysis`
the same views as the Twilio caller: clear-to-silence is the first silent packet at or after the
``clear``. A spoken burst whose eSpeak audio holds a whole frame of digital silence would count
that frame as lost; the tone bursts cannot.

With ``--srtp`` (bench/README.md, "SRTP and TLS") a call offers RTP/SAVP with crypto lines
(RFC 4568) through the same :class:`~appbridge.carriers.sip.offer_answer.SdpNegotiator` the
gateway uses, and protects and checks its packets with the gateway's own
:class:`~appbridge.carriers.sip.srtp.SrtpStreams` (RFC 3711); with ``--sip-transport tls`` the
endpoint is :class:`bench.sip_secure.TlsSipEndpoint`. Either way the recordings are the same.

Receive stamps (bench/README.md, "Receive stamps"): each call's RTP socket is a
:mod:`bench.stamped` datagram transport, so a packet's arrival (``recv_times``) is the instant
the kernel queued it, i.e. when the gateway sent it, exact per packet; the loop's instant is
kept beside it (``recv_loop_times``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Callable

from appbridge.carriers.sip.headers import SipParseError, SipUri
from appbridge.carriers.sip.message import (
    Headers,
    Request,
    Response,
    make_response,
    new_branch,
    new_call_id,
    new_tag,
    parse_message,
)
from appbridge.carriers.sip.offer_answer import SdpNegotiator
from appbridge.carriers.sip.rtp import RtpSender
from appbridge.carriers.sip.sdp import SdpError, SessionDescription
from appbridge.carriers.sip.srtp import SrtpStreams
from bench.stamped import StampedDatagramTransport, open_datagram
from bench.ticker import PhasedTicker

__all__ = ["RtpTicker", "SipCaller", "SipEndpoint", "sip_caller_number"]

HOST = "127.0.0.1"
FRAME_S = 0.020
FRAME_BYTES = 160  # PCMU, 20 ms at 8 kHz
RTP_HEADER_BYTES = 12
ULAW_SILENCE = bytes([0xFF]) * FRAME_BYTES
#: µ-law has two zeros (0xFF and 0x7F); either is silence.
SILENT_PAYLOADS = frozenset({ULAW_SILENCE, bytes([0x7F]) * FRAME_BYTES})
#: Caller numbers of SIP calls: the app's ``session.start`` ``from`` finds its caller.
SIP_CALLER_PREFIX = "+1555300"


def sip_caller_number(worker: int, serial: int) -> str:
    """A unique E.164 caller number per SIP call of a worker (13 digits)."""
    return f"{SIP_CALLER_PREFIX}{worker % 100:02d}{serial % 1_000_000:06d}"


class SipCallError(Exception):
    """The call could not be set up; ``status`` is the final response, if one came."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _RtpIn(asyncio.DatagramProtocol):
    def __init__(self, call: SipCaller) -> None:
        self.call = call
        self.stamps: StampedDatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stamps = transport if isinstance(transport, StampedDatagramTransport) else None

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        stamps = self.stamps
        if stamps is None:
            now = time.monotonic()
            self.call.on_rtp(data, now, now)
        else:
            self.call.on_rtp(data, stamps.rx_time, stamps.rx_loop_time)


class SipCaller:
    """One SIP call of the benchmark (module doc); duck-types what :mod:`bench.analysis` reads."""

    def __init__(self, endpoint: SipEndpoint, caller: str, callee: str) -> None:
        self.endpoint = endpoint
        self.caller = caller
        self.callee = callee
        self.call_id = new_call_id(HOST)
        self.from_tag = new_tag()
        self.to_tag: str | None = None
        self.remote_target: SipUri | None = None
        self.remote_rtp: tuple[str, int] | None = None
        self.status: int | None = None
        self.closed = False
        self.has_stream = False
        self.protocol_errors: list[str] = []
        self.sent_times = array("d")
        self.recv_times = array("d")  # the kernel's arrival stamp (module doc)
        self.recv_loop_times = array("d")  # when the loop read the packet
        self.recv_audio_bytes = array("H")
        self.onset_times = array("d")  # when each talkspurt's first packet went out
        self.ended_by_gateway = False
        self._cseq = 1
        self._rtp: StampedDatagramTransport | None = None
        self._sender = RtpSender(payload_type=0)
        self._srtp: SrtpStreams | None = None
        self._talk = b""
        self._talk_at = 0
        self._final: asyncio.Future[Response] | None = None
        self._bye_done: asyncio.Future[Response] | None = None
        self._invite: Request | None = None
        self.done = asyncio.get_running_loop().create_future()

    # -- what bench.analysis reads (the lean Twilio caller's views) -----------------------
    @property
    def call_sid(self) -> str:
        """The key of this call's app script (the app sees it as ``from``)."""
        return self.caller

    def media_arrivals(self) -> list[tuple[float, int]]:
        """(arrival, audio bytes) of each packet of gateway audio (silence left out)."""
        return [(t, n) for t, n in zip(self.recv_times, self.recv_audio_bytes, strict=True) if n]

    def sent_media_times(self) -> list[float]:
        return list(self.sent_times)

    def heard_frames(self) -> list[tuple[float, bytes, int]]:
        """(arrival, -, audio bytes) per packet received: the caller plays each on arrival."""
        return [(t, b"", n) for t, n in zip(self.recv_times, self.recv_audio_bytes, strict=True)]

    def silence_after(self, t: float) -> float | None:
        """The first packet of silence that was playing at or after ``t``."""
        for start, n in zip(self.recv_times, self.recv_audio_bytes, strict=True):
            if start + FRAME_S <= t:
                continue
            if n < FRAME_BYTES:
                return max(start, t)
        return None

    @property
    def clear_times(self) -> list[float]:
        """When audio stopped (audio packet followed by silence): SIP has no ``clear`` message,
        so a clear "reached the caller" when the audio stopped soon after it."""
        out: list[float] = []
        previous = 0
        for t, n in zip(self.recv_times, self.recv_audio_bytes, strict=True):
            if previous and not n:
                out.append(t)
            previous = n
        return out

    # -- set-up ---------------------------------------------------------------------------
    async def place(self, timeout_s: float) -> None:
        """INVITE, wait for the final response, ACK; raises :class:`SipCallError` if refused."""
        loop = asyncio.get_running_loop()
        transport, _ = await open_datagram(lambda: _RtpIn(self), (HOST, 0))  # stamped reads
        self._rtp = transport
        rtp_port = transport.get_extra_info("sockname")[1]
        negotiator = SdpNegotiator(
            local_address=HOST,
            rtp_port=rtp_port,
            codecs=("PCMU",),
            username="bench",
            srtp="required" if self.endpoint.srtp else "off",
        )
        offer = negotiator.create_offer().serialize()
        self._final = loop.create_future()
        invite = self._request("INVITE", self._gateway_uri(), body=offer)
        invite.headers.add("Content-Type", "application/sdp")
        self._invite = invite
        self.endpoint.register(self)
        self.endpoint.send(invite)
        try:
            response = await asyncio.wait_for(self._final, timeout_s)
        except TimeoutError:
            self.close()
            raise SipCallError(f"no final response in {timeout_s:g} s") from None
        self.status = response.status
        if response.status >= 300:
            self.close()
            retry = response.headers.get("Retry-After")
            text = f"{response.status} {response.reason}"
            raise SipCallError(text + (f" (Retry-After {retry})" if retry else ""), response.status)
        try:
            answer = SessionDescription.parse(response.body)
            audio = negotiator.process_answer(answer)
        except (SdpError, ValueError) as exc:
            self.protocol_errors.append(f"SDP answer: {exc}")
            await self.hangup()
            raise SipCallError(f"bad SDP answer: {exc}") from None
        if audio.srtp is not None:
            self._srtp = SrtpStreams(audio.srtp, "bench")
        self.remote_rtp = (audio.remote_address, audio.remote_port)
        self.has_stream = True
        self.endpoint.ticker.add(self)

    def _gateway_uri(self) -> SipUri:
        host, port = self.endpoint.gateway
        return SipUri(scheme="sip", user=self.callee, host=host, port=port)

    def _request(self, method: str, uri: SipUri, body: bytes = b"") -> Request:
        local_port = self.endpoint.local_port
        cseq = 1 if method == "ACK" else self._cseq
        if method not in ("ACK", "INVITE"):
            self._cseq += 1
            cseq = self._cseq
        to = f"<sip:{self.callee}@{self.endpoint.gateway[0]}>"
        if self.to_tag is not None:
            to += f";tag={self.to_tag}"
        headers = Headers(
            [
                ("Via", f"{self.endpoint.via} {HOST}:{local_port};branch={new_branch()};rport"),
                ("Max-Forwards", "70"),
                ("From", f"<sip:{self.caller}@{HOST}>;tag={self.from_tag}"),
                ("To", to),
                ("Call-ID", self.call_id),
                ("CSeq", f"{cseq} {method}"),
                ("Contact", f"<sip:bench@{HOST}:{local_port}{self.endpoint.contact_params}>"),
            ]
        )
        return Request(method, uri, headers, body)

    # -- signalling in ----------------------------------------------------------------------
    def on_response(self, response: Response) -> None:
        method = response.cseq.method
        if method == "INVITE":
            if response.status < 200:
                return
            if response.status < 300:
                with contextlib.suppress(SipParseError):
                    self.to_tag = response.to.tag
                    contacts = response.contacts
                    if contacts:
                        self.remote_target = contacts[0].uri
                # Every copy of the 2xx is ACKed (§13.2.2.4): the gateway retransmits until then.
                self.endpoint.send(self._request("ACK", self.remote_target or self._gateway_uri()))
            else:
                self._ack_failure(response)
            if self._final is not None and not self._final.done():
                self._final.set_result(response)
        elif method == "BYE" and self._bye_done is not None and not self._bye_done.done():
            self._bye_done.set_result(response)

    def _ack_failure(self, response: Response) -> None:
        """ACK of a non-2xx final response: same branch as the INVITE (§17.1.1.3)."""
        invite = self._invite
        if invite is None:
            return
        headers = Headers(
            [
                ("Via", invite.headers.get("Via") or ""),
                ("Max-Forwards", "70"),
                ("From", invite.headers.get("From") or ""),
                ("To", response.headers.get("To") or ""),
                ("Call-ID", self.call_id),
                ("CSeq", "1 ACK"),
            ]
        )
        self.endpoint.send(Request("ACK", invite.uri, headers))

    def on_request(self, request: Request) -> None:
        if request.method == "BYE":
            self.endpoint.send(make_response(request, 200))
            self.ended_by_gateway = True
            self.close()
        elif request.method in ("OPTIONS", "INFO", "NOTIFY"):
            self.endpoint.send(make_response(request, 200))
        elif request.method != "ACK":
            self.endpoint.send(make_response(request, 501))

    # -- media ------------------------------------------------------------------------------
    def talk(self, ulaw: bytes) -> None:
        """Speak ``ulaw`` (8 kHz µ-law) from the next tick on; silence after it."""
        self._talk = ulaw
        self._talk_at = 0

    def tick(self, at: float) -> None:
        """One 20 ms packet of the caller's voice (or silence) to the gateway. ``at`` is the
        ticker's deadline; the records take the instant the packet actually leaves, as the
        Twilio callers' do, so a late generator does not count as the gateway's latency."""
        if self._rtp is None or self.remote_rtp is None or self.closed:
            return
        now = time.monotonic()
        talk = self._talk
        if talk:
            at = self._talk_at
            if at == 0:
                self.onset_times.append(now)
            payload = talk[at : at + FRAME_BYTES]
            self._talk_at = at + FRAME_BYTES
            if self._talk_at >= len(talk):
                self._talk = b""
            if len(payload) < FRAME_BYTES:
                payload += ULAW_SILENCE[len(payload) :]
        else:
            payload = ULAW_SILENCE
        packet = self._sender.audio(payload)
        if self._srtp is not None:
            packet = self._srtp.protect(packet)
        self._rtp.sendto(packet, self.remote_rtp)
        self.sent_times.append(now)

    def on_rtp(self, data: bytes, now: float, loop_now: float | None = None) -> None:
        """A packet from the gateway that arrived at ``now`` (the kernel's stamp) and was read
        at ``loop_now`` (default: ``now``)."""
        if self._srtp is not None:
            plain = self._srtp.unprotect(data, now)
            if plain is None:
                self.protocol_errors.append(f"SRTP packet dropped: {len(data)} bytes")
                return
            data = plain
        if len(data) < RTP_HEADER_BYTES or data[0] >> 6 != 2:
            self.protocol_errors.append(f"not RTP: {len(data)} bytes")
            return
        payload = data[RTP_HEADER_BYTES + 4 * (data[0] & 0x0F) :]
        self.recv_times.append(now)
        self.recv_loop_times.append(now if loop_now is None else loop_now)
        self.recv_audio_bytes.append(0 if payload in SILENT_PAYLOADS else len(payload))

    # -- tear-down --------------------------------------------------------------------------
    async def hangup(self, timeout_s: float = 5.0) -> None:
        """BYE (§15.1.1) and wait for its response; the call is closed either way."""
        if self.closed:
            return
        if self.to_tag is not None:
            self._bye_done = asyncio.get_running_loop().create_future()
            self.endpoint.send(self._request("BYE", self.remote_target or self._gateway_uri()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._bye_done, timeout_s)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.endpoint.ticker.discard(self)
        if self._rtp is not None:
            self._rtp.close()
        self.endpoint.forget(self)
        if not self.done.done():
            self.done.set_result(None)


class RtpTicker(PhasedTicker["SipCaller"]):
    """Every SIP call's 20 ms packet from one task, in 4 phases of the frame (bench/ticker.py):
    real callers' packets reach a gateway spread over the frame, not in one burst."""

    def __init__(self, *, slots: int = 4, autostart: bool = True) -> None:
        super().__init__(lambda call: call.call_id, slots=slots, autostart=autostart)


class SipEndpoint(asyncio.DatagramProtocol):
    """The worker's SIP signalling socket (UDP): sends requests, routes what comes back."""

    #: The top Via's sent-protocol and the Contact's URI parameters of this endpoint's calls.
    via = "SIP/2.0/UDP"
    contact_params = ""

    def __init__(
        self, gateway: tuple[str, int], *, ticking: bool = True, srtp: bool = False
    ) -> None:
        self.gateway = gateway
        #: Whether this endpoint's calls offer RTP/SAVP (``--srtp``) and run SRTP.
        self.srtp = srtp
        self.calls: dict[str, SipCaller] = {}
        self.ticker = RtpTicker(autostart=ticking)
        self.bad_messages = 0
        self.local_port = 0
        self._transport: asyncio.DatagramTransport | None = None
        self.on_stray: Callable[[Request | Response], None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(HOST, 0))
        self._transport = transport
        self.local_port = transport.get_extra_info("sockname")[1]

    async def stop(self) -> None:
        await self.ticker.stop()
        for call in list(self.calls.values()):
            call.close()
        if self._transport is not None:
            self._transport.close()

    def register(self, call: SipCaller) -> None:
        self.calls[call.call_id] = call

    def forget(self, call: SipCaller) -> None:
        self.calls.pop(call.call_id, None)

    def send(self, message: Request | Response) -> None:
        if self._transport is not None:
            self._transport.sendto(message.serialize(), self.gateway)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if data in (b"\r\n\r\n", b"\r\n"):  # keep-alive (RFC 5626 §4.4.1)
            return
        try:
            message = parse_message(data)
        except SipParseError:
            self.bad_messages += 1
            return
        call = self.calls.get(message.call_id)
        if call is None:
            if isinstance(message, Request) and message.method not in ("ACK",):
                self.send(make_response(message, 481))
            return
        if isinstance(message, Response):
            call.on_response(message)
        else:
            call.on_request(message)
