"""Browser calls in: an SDP offer over HTTP, answered once the app answered (docs/webrtc.md).

Flow of one call (``POST /v1/webrtc/calls``; the HTTP framing is http/routes_webrtc.py):

1. The request names a number (routed as a phone call to it, ``Config.route``) or an app. No
   app: 404. Admission (draining, ``max_calls``, the CPU limit; docs/configuration.md,
   "Admission control") and the bound on offers being worked on
   (``[webrtc] max_pending_offers``): 503.
2. The offer is applied to a new ``RTCPeerConnection`` before anything else happens, with an
   audio transceiver and codec preferences Opus, then PCMU, then PCMA (RFC 7874 §3: both are
   mandatory for WebRTC endpoints); its RTP is the leg's once DTLS is up (``rtp_path.py``). A
   broken offer, or one with no audio the gateway can carry, is a 400 and nothing else: no
   call, no dial.
3. The call is opened (carrier ``webrtc``, ``from`` ``"browser"``) and the app dialled, as for
   a SIP INVITE (``carriers/sip/inbound.py``); an app that cannot be reached ends the call
   ``error`` and the answer is 502.
4. The answer is created; aiortc gathers every ICE candidate before ``setLocalDescription``
   returns, so the answer carries them all (no trickle ICE, RFC 8838, is needed). The leg is
   attached (the engine sends ``session.start``) and the answer goes back: 201.

The offer's SDP work (steps 2 and 4) is bounded by :data:`SDP_TIMEOUT_S` in all. Afterwards the
data channel ``"appbridge"`` carries keypresses and hang-ups (``messages.py``), and a peer
connection that fails or closes ends the call as ``caller_hangup``. When the call ends the
browser is told ``{"type": "ended", "reason": ...}`` and the peer connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.sdp import SessionDescription

from appbridge.calls import intake
from appbridge.carriers.webrtc.host_addresses import use_host_addresses
from appbridge.carriers.webrtc.leg import WebRtcLeg
from appbridge.carriers.webrtc.messages import (
    CHANNEL_LABEL,
    Dtmf,
    Hangup,
    Refused,
    ended_message,
    parse_message,
)
from appbridge.carriers.webrtc.outcome import Answer, WebRtcRefusal
from appbridge.carriers.webrtc.rtp_path import give_back, take_over

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.carriers.services import CarrierServices
    from appbridge.config import AppConfig
    from appbridge.config.model import WebRtcConfig

log = logging.getLogger(__name__)

#: The most the SDP work of one offer may take (applying it, creating the answer, gathering).
SDP_TIMEOUT_S: Final = 10.0
#: Codecs offered to the browser, in the gateway's order of preference (module doc).
PREFERRED_CODECS: Final = ("audio/opus", "audio/PCMU", "audio/PCMA")
#: How long the ``ended`` message may take to leave before the connection closes anyway.
ENDED_GRACE_S: Final = 0.5
CALLER_ID: Final = "browser"


@dataclass(eq=False)
class BrowserCall:
    """The WebRTC side of one call: its peer connection, leg and data channel."""

    pc: RTCPeerConnection
    transceiver: RTCRtpTransceiver | None = None
    call: Call | None = None
    leg: WebRtcLeg | None = None
    channel: RTCDataChannel | None = None
    finished: bool = False
    cleanup: asyncio.Task[None] | None = field(default=None, repr=False)


def _codec_preferences(transceiver: RTCRtpTransceiver) -> None:
    capabilities = RTCRtpSender.getCapabilities("audio").codecs
    ordered = [
        codec
        for mime in PREFERRED_CODECS
        for codec in capabilities
        if codec.mimeType.lower() == mime.lower()
    ]
    transceiver.setCodecPreferences(ordered)


def _negotiated_codec(answer_sdp: str) -> str:
    """The codec the gateway sends with: the first of the answer's audio section."""
    for media in SessionDescription.parse(answer_sdp).media:
        if media.kind == "audio" and media.rtp.codecs:
            return media.rtp.codecs[0].name
    raise ValueError("the answer has no audio codec")


class WebRtcCalls:
    """The browser calls of one gateway (module doc)."""

    def __init__(self, gw: CarrierServices) -> None:
        self.gw = gw
        self.pending = 0  # offers whose SDP work or app dial is under way
        self.calls: dict[str, BrowserCall] = {}  # by callRef, while the call lives
        use_host_addresses(self.cfg.host_addresses)

    @property
    def cfg(self) -> WebRtcConfig:
        """``[webrtc]`` as configured now (a reload changes the ICE servers and bounds)."""
        return self.gw.config.webrtc

    def rtc_configuration(self) -> RTCConfiguration:
        servers = [
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in self.cfg.ice_servers
        ]
        return RTCConfiguration(iceServers=servers or None)

    async def place(self, app: AppConfig, to: str, offer_sdp: str) -> Answer:
        """Steps 1-4 of the module doc; raises :class:`WebRtcRefusal` for every other answer."""
        gw = self.gw
        if intake.refusal(gw) is not None:
            raise WebRtcRefusal(503, "unavailable", "the gateway takes no new calls right now")
        if self.pending >= self.cfg.max_pending_offers:
            gw.registry.total_rejected += 1
            raise WebRtcRefusal(503, "unavailable", "too many browser calls are being set up")
        self.pending += 1
        try:
            return await self._place(app, to, offer_sdp)
        finally:
            self.pending -= 1

    async def _place(self, app: AppConfig, to: str, offer_sdp: str) -> Answer:
        loop = asyncio.get_running_loop()
        started = loop.time()
        bc = BrowserCall(RTCPeerConnection(self.rtc_configuration()))
        try:
            async with asyncio.timeout(SDP_TIMEOUT_S):
                await self._apply_offer(bc, offer_sdp)
        except WebRtcRefusal:
            await bc.pc.close()
            raise
        except TimeoutError:
            await bc.pc.close()
            raise WebRtcRefusal(503, "unavailable", "the offer took too long to apply") from None
        budget = SDP_TIMEOUT_S - (loop.time() - started)  # what is left for the answer
        call = intake.open_call(
            self.gw,
            call_ref="CA" + uuid.uuid4().hex,
            app=app,
            direction="inbound",
            from_=CALLER_ID,
            to=to,
            carrier="webrtc",
        )
        bc.call = call
        self.calls[call.call_ref] = bc
        bc.cleanup = loop.create_task(self._cleanup_after(bc), name=f"webrtc:{call.call_ref}")
        if not await call.connect_app():
            await call.end("error")
            raise WebRtcRefusal(502, "app_unreachable", "the app could not be reached")
        if call.over:
            raise WebRtcRefusal(503, "unavailable", "the call ended before it was answered")
        try:
            async with asyncio.timeout(max(budget, 0.1)):
                return await self._answer(bc, call)
        except TimeoutError:
            await call.end("error")
            raise WebRtcRefusal(503, "unavailable", "the answer took too long") from None
        except Exception:
            log.exception("call %s: the answer failed", call.call_ref)
            await call.end("error")
            raise WebRtcRefusal(500, "internal", "the gateway failed to answer the offer") from None

    async def _apply_offer(self, bc: BrowserCall, offer_sdp: str) -> None:
        pc = bc.pc
        transceiver = pc.addTransceiver("audio", direction="sendrecv")
        _codec_preferences(transceiver)
        bc.transceiver = transceiver
        try:
            description = SessionDescription.parse(offer_sdp)
        except Exception as exc:  # aiortc's parser raises what it meets: ValueError, KeyError...
            raise WebRtcRefusal(400, "bad_request", f"the SDP offer is malformed ({exc})") from None
        if not any(m.kind == "audio" for m in description.media):
            raise WebRtcRefusal(400, "bad_request", "the SDP offer has no audio section")
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:  # InvalidStateError, OperationError, ValueError
            raise WebRtcRefusal(400, "bad_request", f"the SDP offer was refused ({exc})") from None

    async def _answer(self, bc: BrowserCall, call: Call) -> Answer:
        """Step 4: the answer with its candidates, the leg attached, the events wired."""
        pc = bc.pc
        await pc.setLocalDescription(await pc.createAnswer())
        local = pc.localDescription
        codec = _negotiated_codec(local.sdp)
        leg = WebRtcLeg(
            codec,
            clock=self.gw.clock,
            defer=self.gw.media_clock.call_after_slice,
            on_hangup=lambda: self._finish(bc),
            label=call.call_ref,
        )
        bc.leg = leg
        if bc.transceiver is not None:
            take_over(bc.transceiver, leg.connect_media, label=f"webrtc {call.call_ref}")
        self._wire(bc, leg)
        call.attach_carrier(leg)
        log.info("call %s: browser call up (%s)", call.call_ref, codec)
        return Answer(call.call_ref, local.sdp)

    def _wire(self, bc: BrowserCall, leg: WebRtcLeg) -> None:
        pc = bc.pc

        @pc.on("connectionstatechange")
        def _state() -> None:
            if pc.connectionState in ("failed", "closed") and not bc.finished:
                log.info("call %s: peer connection %s", leg.label, pc.connectionState)
                leg.remote_hangup()

        @pc.on("datachannel")
        def _channel(channel: RTCDataChannel) -> None:
            if channel.label != CHANNEL_LABEL or bc.channel is not None:
                log.warning("call %s: data channel %r ignored", leg.label, channel.label[:40])
                return
            bc.channel = channel
            channel.on("message", lambda data: self._on_message(bc, leg, data))

    def _on_message(self, bc: BrowserCall, leg: WebRtcLeg, data: str | bytes) -> None:
        message = parse_message(data)
        if isinstance(message, Dtmf):
            leg.dtmf(message.digit)
        elif isinstance(message, Hangup):
            leg.remote_hangup()
        elif isinstance(message, Refused):
            log.warning("call %s: data channel message refused: %s", leg.label, message.reason)

    async def _finish(self, bc: BrowserCall) -> None:
        """Tell the browser why the call ended, then close its peer connection (once)."""
        if bc.finished:
            return
        bc.finished = True
        if bc.leg is not None:
            await bc.leg.close()  # its RTCP BYE leaves while the connection is up
        channel = bc.channel
        call = bc.call
        if channel is not None and channel.readyState == "open" and call is not None:
            drained = asyncio.Event()
            channel.once("bufferedamountlow", drained.set)
            try:
                channel.send(ended_message(call.end_reason or "error"))
                if channel.bufferedAmount > 0:
                    await asyncio.wait_for(drained.wait(), ENDED_GRACE_S)
                await asyncio.sleep(0.02)  # the SCTP packet is on its way before the close
            except Exception as exc:  # a channel closing under us, or the grace ran out
                log.debug("call %s: ended message not sent: %s", call.call_ref, exc)
        await bc.pc.close()

    async def _cleanup_after(self, bc: BrowserCall) -> None:
        """When the call ends on any side: the browser is told, the media let go."""
        call = bc.call
        assert call is not None
        try:
            await call.ended.wait()
            await self._finish(bc)
            if bc.leg is not None:
                await bc.leg.close()
        finally:
            self.calls.pop(call.call_ref, None)
            _let_go(bc)

    async def stop(self) -> None:
        """Gateway shutdown: close what is left (calls end through the drain first)."""
        for bc in list(self.calls.values()):
            if bc.cleanup is not None:
                bc.cleanup.cancel()
            await bc.pc.close()
        self.calls.clear()


def _let_go(bc: BrowserCall) -> None:
    """Unhook the ended call from aiortc's objects. Their handlers and the transceiver's media
    closures refer back to the call and its leg; left in place they tie both into reference
    cycles, which the gateway's paced collector must not have to find (media/gc_pacer.py)."""
    bc.pc.remove_all_listeners()
    if bc.channel is not None:
        bc.channel.remove_all_listeners()
    if bc.transceiver is not None:
        give_back(bc.transceiver)
    bc.leg = bc.call = bc.channel = bc.cleanup = bc.transceiver = None
