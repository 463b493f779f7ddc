"""The browser call leg: a :class:`~appbridge.calls.carrier_leg.CarrierLeg` over WebRTC.

aiortc sets the call up (ICE, RFC 8445; DTLS-SRTP, RFC 5764; the data channel); the RTP is this
leg's, on the code a SIP leg uses (``rtp_path.py`` says why and how it is handed over;
docs/webrtc.md, "Media and codecs"):

- Toward the browser, one packet leaves per media-clock tick whatever the app does, as on a SIP
  leg (``carriers/sip/leg.py``): :meth:`WebRtcLeg.frames_wanted` opens the tick and defers its
  end to the media clock's after-slice hook, where the tick's frame, or silence when none came,
  is encoded (``frames.py``), stamped by :class:`~appbridge.carriers.sip.rtp.RtpSender` with
  the MID header extension (RFC 8843 §15.2), protected and sent. Until the media is connected
  the leg wants no frames, so what the app says first waits in the output queue instead of
  being lost.
- From the browser, each datagram is unprotected (:class:`~appbridge.carriers.sip.srtp.SrtpStreams`
  on the DTLS-keyed sessions), checked and counted by
  :class:`~appbridge.carriers.sip.rtp.RtpReceiver`, and put in a
  :class:`~appbridge.carriers.sip.jitter.JitterBuffer`; frames that continue the sequence are
  decoded and handed to ``on_carrier_audio`` at once, gaps wait for the buffer's delay on the
  tick and are concealed there.
- RTCP (RFC 3550 §6, RFC 8834 §4.1) comes from :class:`~.rtcp.RtcpReports` on the tick, and a
  BYE when the leg closes. Keypresses and hang-ups come over the data channel
  (``messages.py``) through :meth:`WebRtcLeg.dtmf` and :meth:`WebRtcLeg.remote_hangup`; there is
  no RFC 4733 here.

Transfers are refused (``feature_not_supported``): a browser has no number to be handed to and
the leg no signalling to place a second party (docs/protocol-session-v1.md, ``transfer``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from appbridge.calls.carrier_leg import CarrierEvents, CarrierLeg, TransferError
from appbridge.carriers.sip.jitter import JitterBuffer, JitterFrame
from appbridge.carriers.sip.rtp import RtpReceiver, RtpSender, is_rtcp
from appbridge.carriers.webrtc.frames import (
    FRAME_MS,
    InboundAudio,
    OutboundAudio,
    leg_format,
    rtp_clock_hz,
)
from appbridge.carriers.webrtc.rtcp import RtcpReports
from appbridge.carriers.webrtc.rtp_path import MediaPath
from appbridge.clock import Clock

log = logging.getLogger(__name__)

_NO_TRANSFER = "a browser call cannot be transferred"
#: ICE and SRTP vouch for where packets come from, so the receiver latches on nothing.
_BROWSER: Final = ("browser", 0)


class WebRtcLeg:
    """One browser call's media, seen from the call engine (module doc)."""

    carrier = "webrtc"
    native_cold_transfer = False
    #: Each packet leaves on its own tick: nothing is handed over ahead of its time.
    lead_frames = 0
    #: A UDP send never backs up: nothing is dropped for a slow browser.
    audio_dropped = 0

    def __init__(
        self,
        codec: str,
        *,
        clock: Clock,
        defer: Callable[[Callable[[], None]], None],
        on_hangup: Callable[[], Awaitable[None]] | None = None,
        label: str = "webrtc",
        wallclock: Callable[[], float] = time.time,
    ) -> None:
        #: The negotiated codec (aiortc's name: "opus", "PCMU", "PCMA").
        self.codec = codec
        self.audio_format = leg_format(codec)
        self._clock = clock
        self._wallclock = wallclock
        self._defer = defer
        self._on_hangup = on_hangup
        self.label = label
        rtp_clock = rtp_clock_hz(codec)
        self._frame_units = rtp_clock * FRAME_MS // 1000
        self._outbound = OutboundAudio(self.audio_format, codec)
        self._inbound = InboundAudio(codec, self.audio_format.rate_hz)
        self._silence_in = self.audio_format.silence(FRAME_MS)
        self.receiver = RtpReceiver(payload_types=frozenset(), clock_rate_hz=rtp_clock)
        self.jitter = JitterBuffer(clock_rate_hz=rtp_clock)
        self.media: MediaPath | None = None
        self.rtp: RtpSender | None = None
        self.rtcp: RtcpReports | None = None
        self.events: CarrierEvents | None = None
        self._pending: bytes | None = None
        self._tick_open = False
        self.closed = False
        self._hung_up = False
        self.remote_hung_up = False
        self.frames_sent = 0
        self.silence_sent = 0
        self.frames_received = 0

    # -- wiring ----------------------------------------------------------------------------------
    def attach(self, events: CarrierEvents) -> None:
        self.events = events
        if self.remote_hung_up:
            asyncio.get_running_loop().call_soon(events.on_carrier_hangup)

    def connect_media(self, path: MediaPath) -> Callable[[bytes], None]:
        """DTLS is up (``rtp_path.take_over``): the leg carries the RTP from now on. Returns
        the handler for the datagrams of the browser's RTP and RTCP."""
        if path.codec.lower() != self.codec.lower():
            log.warning("call %s: media says %s, the answer %s", self.label, path.codec, self.codec)
        self.media = path
        self.rtp = RtpSender(
            payload_type=path.payload_type,
            frame_units=self._frame_units,
            ssrc=path.ssrc,
            extension=path.extension,
        )
        self.receiver.set_payload_types({path.payload_type})
        self.rtcp = RtcpReports(
            ssrc=path.ssrc,
            cname=path.cname,
            mid=path.mid,
            now=self._clock.now(),
        )
        return self.datagram_received

    # -- from the data channel and the peer connection ------------------------------------------
    def dtmf(self, digit: str) -> None:
        if self.events is not None and not self.closed:
            self.events.on_carrier_dtmf(digit)

    def remote_hangup(self) -> None:
        """The browser left (data channel ``hangup``, or the connection failed or closed):
        told once, to whoever is attached now, else on :meth:`attach`."""
        if self.remote_hung_up:
            return
        self.remote_hung_up = True
        self._hung_up = True
        if self.events is not None:
            self.events.on_carrier_hangup()

    # -- output ----------------------------------------------------------------------------------
    def frames_wanted(self, playing: bool) -> int:
        """One per tick once the media is up, as on a SIP leg; none before, so the output
        queue waits for a browser that can hear it. A tick that begins before the previous one
        ended (the media clock's catch-up ticks run back to back) ends that one first, so its
        frame is not lost."""
        if self.closed or self.media is None:
            return 0
        if self._tick_open:
            self.end_tick(self._clock.now())  # the deferred end now ends this tick
        else:
            self._defer(self._end_tick_now)
        self._tick_open = True
        return 1

    def send_frame(self, frame: bytes) -> None:
        self._pending = frame

    def unplayed_frames(self) -> int:
        return 0

    def clear_output(self) -> None:
        self._pending = None

    def _end_tick_now(self) -> None:
        self.end_tick(self._clock.now())

    def end_tick(self, now: float) -> None:
        """Finish one media tick: caller audio due to the engine, RTCP when due, one packet."""
        self._tick_open = False
        frame, self._pending = self._pending, None
        rtp, rtcp, media = self.rtp, self.rtcp, self.media
        if self.closed or rtp is None or rtcp is None or media is None:
            return
        self._play_in(now, self.jitter.pop)
        if rtcp.due(now):
            self._send_rtcp(rtcp.report(now, rtp, self.receiver, self._wallclock()))
        if not media.sending:
            rtp.skip()  # the browser only sends (our answer is recvonly)
            return
        self.frames_sent += 1
        if frame is None:
            self.silence_sent += 1
            payload = self._outbound.silence()
        else:
            payload = self._outbound.audio(frame)
        if payload is None:
            rtp.skip()
            return
        self._send(media, media.srtp.protect(rtp.audio(payload)))

    def _send(self, media: MediaPath, datagram: bytes) -> None:
        route = media.route
        if route is not None:
            route.send(datagram)

    def _send_rtcp(self, compound: bytes) -> None:
        media = self.media
        if media is not None:
            self._send(media, media.srtp.protect_rtcp(compound))

    # -- RTP in ----------------------------------------------------------------------------------
    def datagram_received(self, data: bytes) -> None:
        """One SRTP or SRTCP datagram from the browser (module doc)."""
        media = self.media
        if self.closed or media is None:
            return
        now = self._clock.now()
        plain = media.srtp.unprotect(data, now)
        if plain is None:
            return
        if is_rtcp(plain):
            if self.rtcp is not None:
                self.rtcp.received(plain, now)
            return
        arrival = self.receiver.receive(plain, _BROWSER, now)
        if arrival is None:
            return
        if arrival.source_changed:
            self.jitter.reset()
        if self.jitter.push(arrival.packet, now):
            self._play_in(now, self.jitter.pop_ready)

    def _play_in(self, now: float, pop: Callable[[float], JitterFrame | None]) -> None:
        events = self.events
        while True:
            out = pop(now)
            if out is None:
                return
            if events is None:
                continue
            frames = self._inbound.decode(out.payload) if out.payload else [self._silence_in]
            for payload in frames:
                self.frames_received += 1
                events.on_carrier_audio(payload)

    # -- control ---------------------------------------------------------------------------------
    def send_dtmf(self, digits: str) -> bool:
        """No out-of-band DTMF toward a browser: the engine plays in-band tones."""
        return False

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        raise TransferError("feature_not_supported", _NO_TRANSFER)

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> CarrierLeg:
        raise TransferError("feature_not_supported", _NO_TRANSFER)

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        raise TransferError("feature_not_supported", _NO_TRANSFER)

    async def hangup(self) -> None:
        """Close the media (RTCP BYE), then say ``ended`` on the data channel and close the
        peer connection (the callback of ``signalling.py``). Safe to call twice."""
        await self.close()
        if self._hung_up:
            return
        self._hung_up = True
        if self._on_hangup is not None:
            await self._on_hangup()

    async def close(self) -> None:
        """Stop the media: an RTCP BYE (RFC 3550 §6.6) while the path is still there, then the
        sockets go back to aioice alone."""
        if self.closed:
            return
        self.closed = True
        self._pending = None
        media, rtp, rtcp = self.media, self.rtp, self.rtcp
        if media is None or rtp is None or rtcp is None:
            return
        now = self._clock.now()
        self._send_rtcp(rtcp.bye(rtp, self.receiver, self._wallclock(), now))
        if media.route is not None:
            media.route.release()
