"""The carrier leg of a Twilio call: what the call hears from and says to one Media Stream.

Toward Twilio the gateway plays the app's role (docs/protocol-twilio.md, "AppBridge as the app,
toward Twilio"): ``media`` paced by the media clock with a lead of ``LEAD_FRAMES`` frames, and
``clear`` when the app clears, so nothing buffered at Twilio plays on. It hangs up through the
REST API (``Status=completed``) when credentials are configured, and by closing the stream in
every case. A cold transfer rewrites the call's TwiML to ``<Dial>`` (docs/protocol-session-v1.md,
"How AppBridge carries them out").

Every frame toward Twilio passes through :meth:`TwilioLeg.send_frame`, so this module is compiled
(appbridge/compiled.py; docs/ARCHITECTURE.md, "The compiled media path"): per-frame constants
are ``Final``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx

from appbridge.calls.carrier_leg import CarrierEvents, CarrierLeg, TransferError
from appbridge.carriers.twilio.rest import TwilioRestClient
from appbridge.carriers.twilio.twiml import twiml_dial
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.media.pacing import LeadPacer
from appbridge.protocol.twilio_streams import TwilioAppSideWriter

if TYPE_CHECKING:
    from appbridge.carriers.twilio_outbound import TwilioOutbound

log = logging.getLogger(__name__)

LEAD_FRAMES: Final = 2
# Audio frames waiting for the socket beyond this are dropped (a stalled Twilio socket must not
# grow memory); control messages always queue.
MAX_PENDING_AUDIO: Final = 50
ASGISend = Any


class StreamSink(Protocol):
    """Where a leg's frames go when no task stands between it and the socket
    (:class:`~appbridge.net.ws_fastpath.FastWebSocket`). Every method returns at once."""

    is_open: bool

    def send_text(self, data: bytes) -> None:
        """A control frame (``clear``): never dropped while the stream is open."""
        ...

    def send_droppable_text(self, data: bytes) -> bool:
        """An audio frame: False when dropped because the peer reads too slowly."""
        ...

    def close(self, code: int = 1000, reason: str = "") -> None: ...


class TwilioLeg:
    """One Media Stream, seen from the call. Sends never wait: the media path never awaits a
    slow socket (docs/ARCHITECTURE.md, "Failure boundaries").

    ``send`` is a :class:`StreamSink` (the fast path: each frame is written as it is made) or an
    ASGI ``send`` (a writer task drains a bounded outbox).
    """

    carrier = "twilio"
    audio_format: AudioFormat = PCMU_8K
    #: Cold transfers stay with Twilio: the call's TwiML becomes ``<Dial>`` (:meth:`transfer`).
    native_cold_transfer = True
    #: Twilio plays what it receives in order: the leg keeps this lead over its playout.
    lead_frames = LEAD_FRAMES

    def __init__(
        self,
        send: StreamSink | ASGISend,
        stream_sid: str,
        call_sid: str,
        rest: TwilioRestClient | None,
        *,
        outbound: TwilioOutbound | None = None,
    ) -> None:
        self._send: ASGISend = send
        self._sink: StreamSink | None = send if hasattr(send, "send_droppable_text") else None
        self.stream_sid = stream_sid
        self.call_sid = call_sid
        self._rest = rest
        self._outbound = outbound  # places transfer parties (dial_party)
        self.events: CarrierEvents | None = None
        self._outbox: deque[tuple[bool, bytes]] = deque()  # (is_audio, text)
        self._pending_audio = 0
        self._wake: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self.pacer = LeadPacer(LEAD_FRAMES)
        self.closed = False
        self._hung_up = False
        self.audio_dropped = 0
        self.frames_sent = 0

    def attach(self, events: CarrierEvents) -> None:
        self.events = events
        loop = asyncio.get_running_loop()
        if self.closed:
            # A party's stream can end before the engine attaches to it: say so at once.
            loop.call_soon(events.on_carrier_hangup)
            return
        if self._sink is not None:
            return  # nothing to drain: sends write at once
        self._writer = loop.create_task(self._write_loop(), name=f"twilio-writer:{self.call_sid}")

    # -- output --------------------------------------------------------------------------------
    def frames_wanted(self, playing: bool) -> int:
        return self.pacer.frames_wanted(playing)

    def unplayed_frames(self) -> int:
        return self.pacer.buffered

    def send_frame(self, frame: bytes) -> None:
        self.pacer.on_sent()
        self.frames_sent += 1
        sink = self._sink
        if sink is not None:
            if not self.closed and not sink.send_droppable_text(
                TwilioAppSideWriter.media(self.stream_sid, frame)
            ):
                self.audio_dropped += 1
            return
        self._enqueue(True, TwilioAppSideWriter.media(self.stream_sid, frame))

    def clear_output(self) -> None:
        self.pacer.on_cleared()
        if self._sink is not None:
            # What the socket already took is Twilio's to drop: that is what ``clear`` asks.
            if not self.closed:
                self._sink.send_text(TwilioAppSideWriter.clear(self.stream_sid))
            return
        # Audio not yet written is as good as cleared: drop it before it reaches Twilio.
        if self._pending_audio:
            # In place: the writer task holds this very deque.
            kept = [item for item in self._outbox if not item[0]]
            self._outbox.clear()
            self._outbox.extend(kept)
            self._pending_audio = 0
        self._enqueue(False, TwilioAppSideWriter.clear(self.stream_sid))

    def _enqueue(self, is_audio: bool, text: bytes) -> None:
        if self.closed:
            return
        if is_audio:
            if self._pending_audio >= MAX_PENDING_AUDIO:
                self.audio_dropped += 1
                return
            self._pending_audio += 1
        self._outbox.append((is_audio, text))
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        outbox = self._outbox
        try:
            while not self.closed:
                while outbox:
                    is_audio, text = outbox.popleft()
                    if is_audio:
                        self._pending_audio -= 1
                    await self._send({"type": "websocket.send", "text": text.decode()})
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket went away under us
            log.debug("twilio stream %s: write failed: %s", self.stream_sid, exc)
            self.closed = True

    # -- control ---------------------------------------------------------------------------------
    def send_dtmf(self, digits: str) -> bool:
        return False  # a Media Stream carries audio only: the engine plays in-band tones

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        """Cold transfer through Twilio's REST API: the call's TwiML becomes ``<Dial>``.

        Twilio then sends ``stop`` on this stream and bridges the caller to the target. ``warm``
        and ``refer`` need a second leg or SIP signalling, which a Media Stream has not.
        """
        if mode != "cold":
            raise TransferError(
                "feature_not_supported", f"{mode} transfers are not available on Twilio calls"
            )
        if self._rest is None or not self._rest.usable:
            raise TransferError(
                "transfer_failed", "carriers.twilio.auth_token is needed to transfer Twilio calls"
            )
        twiml = twiml_dial(target, headers)
        try:
            resp = await self._rest.update_call(self.call_sid, {"Twiml": twiml})
        except httpx.HTTPError as exc:
            raise TransferError("transfer_failed", f"Twilio's API failed: {exc}") from None
        if resp.status_code >= 400:
            detail = ""
            try:
                body = resp.json()
                detail = f": {body.get('code')} {body.get('message')}"
            except ValueError:
                pass
            raise TransferError(
                "transfer_failed", f"Twilio refused the transfer (HTTP {resp.status_code}{detail})"
            )
        self._hung_up = True  # the call goes on, bridged by Twilio: never complete it now

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> CarrierLeg:
        """A transfer's new party (calls/carrier_leg.py). An E.164 ``target`` is a new Twilio call
        whose stream comes back here (carriers/twilio_outbound.py), ``caller_id`` its From; a
        ``sip:`` target goes out through the gateway's SIP carrier when it has one."""
        if target.startswith("sip:"):
            sip = self._outbound.gw.sip if self._outbound is not None else None
            if sip is None:
                raise TransferError(
                    "transfer_failed", "sip: targets on Twilio calls need the SIP carrier ([sip])"
                )
            from appbridge.carriers.sip.party import dial_party as sip_dial_party
            from appbridge.carriers.sip.party import route_target

            # The trunk of the target's host (docs/protocol-session-v1.md, "How AppBridge carries
            # them out"); a Twilio call has no trunk of its own.
            trunk, user = route_target(sip.outbound.cfg.trunks, None, target)
            return await sip_dial_party(
                sip.outbound,
                trunk,
                user,
                caller_id=caller_id,
                headers=headers,
                timeout_s=timeout_s,
                label=f"party of call {self.call_sid}",
            )
        if self._outbound is None:
            raise TransferError("transfer_failed", "this Twilio call cannot place new calls")
        return await self._outbound.dial_party(target, caller_id=caller_id, timeout_s=timeout_s)

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        """A Media Stream has no SIP signalling to carry a REFER (RFC 3515)."""
        raise TransferError(
            "feature_not_supported",
            "REFER is a SIP transfer; Twilio calls transfer with mode cold or warm",
        )

    async def hangup(self) -> None:
        if self._hung_up:
            return
        self._hung_up = True
        if self._rest is not None and self._rest.usable:
            await self._rest.hangup(self.call_sid)
        await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        if self._sink is not None:
            self.closed = True
            self._sink.close(1000)  # what was written goes out before the close frame
            return
        # Let what is queued go out, then close the stream.
        for _ in range(50):
            if not self._outbox:
                break
            await asyncio.sleep(0.005)
        self.closed = True
        if self._writer is not None:
            self._writer.cancel()
        try:
            await self._send({"type": "websocket.close", "code": 1000})
        except Exception:
            pass
