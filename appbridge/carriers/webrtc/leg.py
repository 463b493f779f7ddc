"""The browser call leg: a :class:`~appbridge.calls.carrier_leg.CarrierLeg` over aiortc.

The media is aiortc's (DTLS-SRTP, RFC 5764; ICE, RFC 8445); this leg is what stands between it
and the engine (docs/webrtc.md, "Media"):

- Toward the browser, one frame leaves per media-clock tick whatever the app does, as on a SIP
  leg (``carriers/sip/leg.py``): :meth:`WebRtcLeg.frames_wanted` opens the tick and defers its
  end to the media clock's after-slice hook, where the tick's frame, or silence when none came,
  is wrapped (``frames.py``) and pushed to the :class:`~.track.OutboundTrack` that aiortc's
  sender reads. So the RTP stream keeps the media clock's pace and never waits for the app.
- From the browser, a task reads the remote track (``await track.recv()``), converts each
  decoded frame to the leg's format in 20 ms frames and calls ``on_carrier_audio``.
- Keypresses and hang-ups come over the data channel (``messages.py``) through
  :meth:`WebRtcLeg.dtmf` and :meth:`WebRtcLeg.remote_hangup`; there is no RFC 4733 here.

Transfers are refused (``feature_not_supported``): a browser has no number to be handed to and
the leg no signalling to place a second party (docs/protocol-session-v1.md, ``transfer``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from appbridge.calls.carrier_leg import CarrierEvents, CarrierLeg, TransferError
from appbridge.carriers.webrtc.frames import InboundAudio, OutboundAudio, leg_format
from appbridge.carriers.webrtc.track import OutboundTrack

if TYPE_CHECKING:
    import av

log = logging.getLogger(__name__)

_NO_TRANSFER = "a browser call cannot be transferred"


class WebRtcLeg:
    """One browser call's media, seen from the call engine (module doc)."""

    carrier = "webrtc"
    native_cold_transfer = False
    #: Each frame is handed to the sender on its own tick: no lead is kept.
    lead_frames = 0

    def __init__(
        self,
        codec: str,
        track: OutboundTrack,
        *,
        defer: Callable[[Callable[[], None]], None],
        on_hangup: Callable[[], Awaitable[None]] | None = None,
        label: str = "webrtc",
    ) -> None:
        #: The negotiated codec (aiortc's name: "opus", "PCMU", "PCMA").
        self.codec = codec
        self.audio_format = leg_format(codec)
        self.track = track
        self._defer = defer
        self._on_hangup = on_hangup
        self.label = label
        self._outbound = OutboundAudio(self.audio_format, codec)
        self._inbound = InboundAudio(self.audio_format.rate_hz)
        self.events: CarrierEvents | None = None
        self._pending: bytes | None = None
        self._tick_open = False
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        self._hung_up = False
        self.remote_hung_up = False
        self.frames_sent = 0
        self.silence_sent = 0
        self.frames_received = 0

    @property
    def audio_dropped(self) -> int:
        """Frames dropped because aiortc's sender fell behind (``track.py``)."""
        return self.track.dropped

    @audio_dropped.setter
    def audio_dropped(self, value: int) -> None:
        self.track.dropped = value

    # -- wiring ----------------------------------------------------------------------------------
    def attach(self, events: CarrierEvents) -> None:
        self.events = events
        if self.remote_hung_up:
            asyncio.get_running_loop().call_soon(events.on_carrier_hangup)

    def read_from(self, remote: MediaStreamTrack) -> None:
        """Start reading the browser's audio track (once; a second track is ignored)."""
        if self._reader is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read(remote), name=f"webrtc-in:{self.label}")

    async def _read(self, remote: MediaStreamTrack) -> None:
        convert = self._inbound.convert
        while not self.closed:
            try:
                frame: av.AudioFrame = await remote.recv()  # type: ignore[assignment]
            except MediaStreamError:
                return
            events = self.events
            if events is None:
                continue
            for payload in convert(frame):
                self.frames_received += 1
                events.on_carrier_audio(payload)

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
        """Always one, as on a SIP leg: a frame goes out every tick. A tick that begins before
        the previous one ended (the media clock's catch-up ticks run back to back) ends that
        one first, so its frame is not lost."""
        if self._tick_open:
            self._end_tick()
            if not self.closed:
                self._tick_open = True
            return 1
        if not self.closed:
            self._tick_open = True
            self._defer(self._end_tick)
        return 1

    def send_frame(self, frame: bytes) -> None:
        self._pending = frame

    def _end_tick(self) -> None:
        self._tick_open = False
        frame, self._pending = self._pending, None
        if self.closed:
            return
        self.frames_sent += 1
        if frame is None:
            self.silence_sent += 1
            packet = self._outbound.wrap_silence()
        else:
            packet = self._outbound.wrap(frame)
        if packet is not None:
            self.track.push(packet)

    def unplayed_frames(self) -> int:
        return self.track.queued

    def clear_output(self) -> None:
        self._pending = None
        self.track.clear()

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
        """Say ``ended`` on the data channel and close the peer connection (the callback of
        ``signalling.py``), then let the media go. Safe to call twice."""
        if self._hung_up:
            await self.close()
            return
        self._hung_up = True
        if self._on_hangup is not None:
            await self._on_hangup()
        await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._pending = None
        self.track.stop()
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
