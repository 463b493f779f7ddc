"""The SIP call leg: a :class:`~appbridge.calls.carrier_leg.CarrierLeg` over RTP.

Theory of operation
-------------------
RTP must flow every 20 ms whatever the app does (RFC 3550 §5.1: the timestamp runs with the
sampling clock), so the leg sends exactly one packet per media-clock tick. The call engine
(``calls/call.py``) asks ``frames_wanted`` once per tick and then hands over at most one frame
with ``send_frame``; when its queue is empty it hands over nothing. The leg therefore *holds*
the tick's frame and finishes the tick itself, just after the engine's tick runs
(``frames_wanted`` defers :meth:`SipLeg.end_tick` to the media clock's one loop callback after
the slice of calls being ticked, ``MediaClock.call_after_slice``, given to the leg when it is
made): it sends the frame, or the codec's silence when none came, or RFC 4733
event packets while a ``dtmf.send`` plays (the audio clock then keeps running with
``RtpSender.skip``, RFC 4733 §2.5.1.2). The same hook plays
the caller's side out of the jitter buffer: one ``on_carrier_audio`` per frame due (gaps get
their concealment frames there).

Incoming datagrams (``datagram_received``) go through :class:`~.rtp.RtpReceiver` (symmetric
RTP: we send to where the caller's RTP comes from, RFC 4961), then telephone-events by payload
type to :class:`~.dtmf4733.Rfc4733Receiver` (one ``on_carrier_dtmf`` per keypress, RFC 4733
§2.5.2) and audio to the :class:`~.jitter.JitterBuffer`. A packet that continues the sequence
goes on to the engine at once (``JitterBuffer.pop_ready``): the app and the ears need no playout
smoothing. Only gaps wait, on the tick, for the buffer's adaptive delay before concealment.

With SRTP (docs/sip.md, "SRTP (SDES)") every packet sent is protected and every datagram
received is unprotected first (:class:`~.srtp.SrtpStreams`, one per leg); one that fails is
dropped and counted there. Without SRTP that costs one ``None`` check per packet. The leg sends
no RTCP; RTCP that arrives on the RTP port (RFC 5761) is checked as SRTCP and then ignored, as
plain RTCP is.

Time is an argument (``now``) everywhere except in the thin asyncio glue, so the pacing is
unit-tested in virtual time (tests/unit/sip/test_sip_leg.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, cast

from appbridge.calls.carrier_leg import CarrierEvents, TransferError
from appbridge.carriers.sip.dtmf4733 import Rfc4733Receiver, Rfc4733Sender
from appbridge.carriers.sip.jitter import JitterBuffer, JitterFrame
from appbridge.carriers.sip.offer_answer import NegotiatedAudio
from appbridge.carriers.sip.rtp import RtpReceiver, RtpSender
from appbridge.carriers.sip.srtp import SrtpStreams
from appbridge.clock import Clock
from appbridge.media.codecs import G722_16K, PCMU_8K, AudioFormat
from appbridge.media.g722 import G722Decoder, G722Encoder

log = logging.getLogger(__name__)

Address = tuple[str, int]
PCMA_8K: Final = AudioFormat("pcma", 8000)
PCM16_16K: Final = AudioFormat("pcm16", 16_000)
#: The codecs the leg can carry, in the order we prefer them when we offer (RFC 3264 §5.1; as
#: answerer sdp.py follows the offer's order): G.722 first, for wideband audio to the app and its
#: speech recognition. sdp.py drops G.722 when the `G722` wheel is missing (g722.AVAILABLE).
LEG_CODECS: Final[tuple[str, ...]] = ("G722", "PCMU", "PCMA")
#: A released port is not reused for this long (late packets of a call).
RTP_QUARANTINE_S: Final = 10.0


def audio_format_for(codec_name: str) -> AudioFormat:
    """The engine format of a negotiated RTP codec. G.711 travels as it is; G.722 is 16 kHz
    audio (RFC 3551 §4.5.2, even though its RTP clock says 8000) that the leg itself encodes
    and decodes, so the engine sees pcm16 16 kHz (see :class:`SipLeg`)."""
    if codec_name == "PCMA":
        return PCMA_8K
    if codec_name == "PCMU":
        return PCMU_8K
    if codec_name == "G722":
        return PCM16_16K
    raise ValueError(f"the SIP leg cannot carry {codec_name}")


class RtpPortPool:
    """Even RTP ports from ``[sip] rtp_ports`` (RFC 3550 §11: RTP on even ports), handed out
    in turn; a released port rests ``quarantine_s`` before reuse so that a previous call's late
    packets never reach a new call."""

    def __init__(self, low: int, high: int, *, quarantine_s: float = RTP_QUARANTINE_S) -> None:
        first = low + (low % 2)
        self._free: deque[int] = deque(range(first, high + 1, 2))
        self._resting: deque[tuple[float, int]] = deque()
        self._quarantine_s = quarantine_s

    def __len__(self) -> int:
        return len(self._free) + len(self._resting)

    def acquire(self, now: float) -> int | None:
        while self._resting and self._resting[0][0] <= now:
            self._free.append(self._resting.popleft()[1])
        return self._free.popleft() if self._free else None

    def release(self, port: int, now: float) -> None:
        self._resting.append((now + self._quarantine_s, port))


class LegSignalling(Protocol):
    """The SIP signalling behind a leg, for transfers (``party.SipCallSignalling``)."""

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> SipLeg: ...

    async def refer(self, target: str, headers: dict[str, str] | None) -> None: ...


class SipLeg:
    """One SIP call's media, seen from the call engine (module doc)."""

    carrier = "sip"
    #: The gateway stays in the media path for cold transfers (B2BUA with ``dial_party``).
    native_cold_transfer = False
    #: Each packet leaves on its own tick: nothing is handed over ahead of its time.
    lead_frames = 0
    #: A UDP send never backs up: nothing is dropped for a slow peer.
    audio_dropped = 0

    def __init__(
        self,
        negotiated: NegotiatedAudio,
        *,
        clock: Clock,
        defer: Callable[[Callable[[], None]], None],
        send_datagram: Callable[[bytes, Address], None] | None = None,
        on_hangup: Callable[[], Awaitable[None]] | None = None,
        ssrc: int | None = None,
        initial_sequence: int | None = None,
        initial_timestamp: int | None = None,
    ) -> None:
        codec = negotiated.codec
        self.audio_format: AudioFormat = audio_format_for(codec.name)
        self._clock = clock
        self._send_datagram = send_datagram
        self._on_hangup = on_hangup
        self._defer = defer
        self.negotiated = negotiated
        self.rtp = RtpSender(
            payload_type=negotiated.send_payload_type,
            frame_units=codec.frame_units,
            event_payload_type=negotiated.send_event_payload_type,
            ssrc=ssrc,
            initial_sequence=initial_sequence,
            initial_timestamp=initial_timestamp,
        )
        self.receiver = RtpReceiver(
            payload_types=negotiated.receive_payload_types,
            clock_rate_hz=codec.rtp_clock_hz,
            remote_address=(negotiated.remote_address, negotiated.remote_port),
        )
        keys = negotiated.srtp
        #: SRTP/SRTCP of the call, None for plain RTP (RFC 3711, docs/sip.md).
        self.srtp: SrtpStreams | None = SrtpStreams(keys) if keys is not None else None
        self.jitter = JitterBuffer(clock_rate_hz=codec.rtp_clock_hz)
        self.dtmf_in = Rfc4733Receiver()
        self.dtmf_out = Rfc4733Sender(clock_rate_hz=codec.rtp_clock_hz)
        self._silence = self.audio_format.silence(20)
        # G.722 is adaptive (ADPCM): the far end runs ONE decoder for the whole call, so the
        # call needs one encoder that sees every frame sent (items, silence, music alike) and
        # one decoder that sees every packet received. Encoding per queue item would restart
        # the predictor at each item and garble its start.
        self._g722_enc: G722Encoder | None = None
        self._g722_dec: G722Decoder | None = None
        self._wire_bytes = len(self._silence)
        if codec.name == "G722":
            self._g722_enc, self._g722_dec = G722Encoder(), G722Decoder()
            self._wire_bytes = G722_16K.frame_bytes(20)
        self.events: CarrierEvents | None = None
        self._pending: bytes | None = None
        self._ahead = False  # a clear sent the next packet early (clear_output)
        self._tick_open = False
        self.closed = False
        self._hung_up = False
        self.remote_hung_up = False  # the remote party's BYE came (maybe before attach)
        #: Set by the call flow that owns the dialog; None: no transfers on this leg.
        self.signalling: LegSignalling | None = None
        self.frames_sent = 0  # audio packets (app audio or silence)
        self.silence_sent = 0
        self.events_sent = 0  # RFC 4733 packets
        self.frames_delivered = 0  # caller frames handed to the engine

    # -- media changes (re-INVITE) -------------------------------------------------------------
    def update_media(self, negotiated: NegotiatedAudio) -> None:
        """A new offer/answer (RFC 3264 §8): follow the address, payload types and direction;
        SSRC, sequence and timestamps carry on (RFC 3550 §5.1)."""
        moved = (negotiated.remote_address, negotiated.remote_port) != (
            self.negotiated.remote_address,
            self.negotiated.remote_port,
        )
        self.negotiated = negotiated
        self.rtp.set_payload_type(negotiated.send_payload_type, negotiated.codec.frame_units)
        self.rtp.set_event_payload_type(negotiated.send_event_payload_type)
        self.receiver.set_payload_types(negotiated.receive_payload_types)
        keys = negotiated.srtp
        if keys is None:
            self.srtp = None
        elif self.srtp is None:
            self.srtp = SrtpStreams(keys)
        else:
            self.srtp.rekey(keys)  # RFC 4568 §7.1.4: a changed key only
        if moved:
            self.receiver.reset_latch((negotiated.remote_address, negotiated.remote_port))

    # -- CarrierLeg ------------------------------------------------------------------------------
    def attach(self, events: CarrierEvents) -> None:
        self.events = events
        if self.remote_hung_up:
            events.on_carrier_hangup()  # the party left before the engine took the leg

    def remote_hangup(self, fallback: Callable[[], None] | None = None) -> None:
        """The remote party's BYE: told to whoever is attached now (the Call, or the bridge
        after a transfer, ``calls/bridge.py``), else to ``fallback`` (the Call before it
        attached the leg), else on :meth:`attach`. Nothing is left to BYE."""
        if self.remote_hung_up:
            return
        self.remote_hung_up = True
        self.closed = True
        self._hung_up = True
        if self.events is not None:
            self.events.on_carrier_hangup()
        elif fallback is not None:
            fallback()

    def frames_wanted(self, playing: bool) -> int:
        """Always one: RTP goes out on every tick (silence when nothing plays). Opens the tick
        that :meth:`end_tick` closes once the engine's tick is over.

        After a stall the media clock runs its catch-up ticks back to back, with no loop turn
        between them, so a tick can begin before the previous one's end has run: that end runs
        here first, and its frame leaves now instead of being overwritten by this tick's (one
        lost frame per leg and catch-up tick). The end already scheduled closes this tick."""
        if self._tick_open:
            self.end_tick(self._clock.now())
            if not self.closed:
                self._tick_open = True
            return 1
        if not self.closed:
            self._tick_open = True
            self._defer(self._end_tick_now)
        return 1

    def send_frame(self, frame: bytes) -> None:
        self._pending = frame

    def unplayed_frames(self) -> int:
        return 0

    def clear_output(self) -> None:
        """``clear`` (and hold, a bridge): the caller's next packet, silence, leaves now rather
        than on the next tick, up to 20 ms sooner (docs/protocol-session-v1.md, ``clear``). The
        stream is then one packet ahead of its clock; the next tick with nothing to play sends
        nothing, so the rate stays one packet per 20 ms and the RTP timestamps run on unbroken
        (RFC 3550 §5.1). Within a tick (its frame handed over, not yet sent) the frame is
        dropped instead."""
        if self._tick_open:
            self._pending = None  # the tick still to finish sends silence
            return
        if self.closed or self._ahead or not self.negotiated.send or self._dtmf_sending():
            return
        self._ahead = True
        self.silence_sent += 1
        self._send_audio(self._silence)

    def send_dtmf(self, digits: str) -> bool:
        """RFC 4733 out (RFC 4733 §2.5.1); the engine keeps in-band tones out of the stream."""
        if self.negotiated.send_event_payload_type is None:
            return False
        try:
            self.dtmf_out.send(digits, self._clock.now())
        except ValueError:
            return False
        return True

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        """No native cold transfer on SIP (:attr:`native_cold_transfer`): the engine uses
        :meth:`dial_party` and bridges, or :meth:`refer`."""
        raise TransferError("feature_not_supported", "SIP calls transfer by dial_party or refer")

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> SipLeg:
        """The new party's answered leg, placed on this call's trunk (``party.py``); raises
        ``TransferError("transfer_failed")`` on busy, no answer within ``timeout_s``, failure."""
        if self.signalling is None:
            raise TransferError("transfer_failed", "this SIP leg cannot place calls")
        return await self.signalling.dial_party(
            target, caller_id=caller_id, headers=headers, timeout_s=timeout_s
        )

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        """RFC 3515 REFER of the remote party to ``target``; returns after the NOTIFY reported
        success and our BYE went out (``refer.py``; docs/protocol-session-v1.md, ``transfer``)."""
        if self.signalling is None:
            raise TransferError("transfer_failed", "this SIP leg cannot REFER")
        await self.signalling.refer(target, headers)

    async def hangup(self) -> None:
        """BYE (through the call flow's callback), then let the media go. Safe to call twice."""
        if self._hung_up:
            return
        self._hung_up = True
        if self._on_hangup is not None:
            await self._on_hangup()
        await self.close()

    async def close(self) -> None:
        self.closed = True

    # -- the tick --------------------------------------------------------------------------------
    def _end_tick_now(self) -> None:
        self.end_tick(self._clock.now())

    def end_tick(self, now: float) -> None:
        """Finish one media tick: caller audio to the engine, one packet (or events) out."""
        self._tick_open = False
        frame, self._pending = self._pending, None
        if self.closed:
            return
        self._play_in(now)
        for digit in self.dtmf_in.poll(now):
            del digit  # an event that timed out was already reported when it started
        dtmf = self.dtmf_out
        if self._dtmf_sending():
            for ev in dtmf.poll(now, self.rtp.timestamp):
                self._send(self.rtp.event(ev.payload, timestamp=ev.timestamp, marker=ev.marker))
                self.events_sent += 1
            if dtmf.busy or dtmf.next_deadline() is not None:
                self.rtp.skip()  # the audio clock runs on under the event (RFC 4733 §2.5.1.2)
                return
        if not self.negotiated.send:
            self.rtp.skip()  # the caller holds (sendonly/inactive offer): no media to them
            return
        if frame is None:
            if self._ahead:
                self._ahead = False  # this tick's packet left early, with a clear
                return
            frame = self._silence
            self.silence_sent += 1
        self._send_audio(frame)

    def _send_audio(self, frame: bytes) -> None:
        self.frames_sent += 1
        if self._g722_enc is not None:
            frame = self._g722_enc.encode(frame)
        self._send(self.rtp.audio(frame))

    def _dtmf_sending(self) -> bool:
        dtmf = self.dtmf_out
        return dtmf.busy or dtmf.next_deadline() is not None

    def _play_ready(self, now: float) -> None:
        """Frames whose packets are here, in sequence, go on at once: the app and the ears need
        no playout smoothing, and every tick of waiting is added latency; gaps wait for the
        tick."""
        self._play_in(now, self.jitter.pop_ready)

    def _play_in(
        self, now: float, pop: Callable[[float], JitterFrame | None] | None = None
    ) -> None:
        events = self.events
        pop = pop or self.jitter.pop
        while True:
            out = pop(now)
            if out is None:
                return
            if events is not None:
                payload = out.payload
                if not payload or len(payload) != self._wire_bytes:
                    payload = self._silence
                elif self._g722_dec is not None:
                    payload = self._g722_dec.decode(payload)
                self.frames_delivered += 1
                events.on_carrier_audio(payload)

    def _send(self, packet: bytes) -> None:
        addr = self.receiver.send_address
        if addr is None or self._send_datagram is None or addr[1] == 0:
            return
        srtp = self.srtp
        if srtp is not None:
            packet = srtp.protect(packet)
        self._send_datagram(packet, addr)

    # -- RTP in ----------------------------------------------------------------------------------
    def datagram_received(self, data: bytes, source: Address, now: float) -> None:
        if self.closed:
            return
        srtp = self.srtp
        if srtp is not None:
            plain = srtp.unprotect(data, now)
            if plain is None:
                return
            data = plain
        arrival = self.receiver.receive(data, source, now)
        if arrival is None:
            return
        packet = arrival.packet
        if arrival.source_changed:
            self.jitter.reset()
        if packet.payload_type == self.negotiated.receive_event_payload_type:
            try:
                digits = self.dtmf_in.receive(packet.payload, timestamp=packet.timestamp, now=now)
            except ValueError:
                return
            for d in digits:
                if self.events is not None:
                    self.events.on_carrier_dtmf(d.digit)
            return
        if self.negotiated.receive and self.jitter.push(packet, now):
            self._play_ready(now)


class RtpProtocol(asyncio.DatagramProtocol):
    """The asyncio end of one leg's RTP port."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.leg: SipLeg | None = None
        self.transport: asyncio.DatagramTransport | None = None
        self.received_early = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is no subclass
        if self.closed:  # closed before the loop handed over the port (open_rtp cancelled)
            transport.close()

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        leg = self.leg
        if leg is None:
            self.received_early += 1
            return
        # IPv4 sources come as a (str, int) tuple already; IPv6 ones carry flow info and scope
        # as well, which the latch must not compare.
        source = cast(Address, addr) if len(addr) == 2 else (str(addr[0]), int(addr[1]))
        leg.datagram_received(data, source, self.clock.now())

    def send(self, data: bytes, addr: Address) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)

    def close(self) -> None:
        # The leg sends through this protocol (a bound method) and this protocol feeds the leg:
        # once the port closes, let go of the leg, so that no reference cycle outlives the call
        # (the paced collections rely on that: media/gc_pacer.py).
        self.leg = None
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.leg = None


async def open_rtp(
    host: str, pool: RtpPortPool, clock: Clock, attempts: int | None = None
) -> tuple[int, RtpProtocol] | None:
    """Bind a UDP port from ``pool`` on ``host``. A port in use elsewhere is skipped (and
    rests in quarantine); every port of the pool may be tried once (``attempts`` bounds it)."""
    loop = asyncio.get_running_loop()
    for _ in range(len(pool) if attempts is None else attempts):
        port = pool.acquire(clock.now())
        if port is None:
            return None
        proto = RtpProtocol(clock)
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda p=proto: p,  # type: ignore[misc]
                local_addr=(host, port),
            )
        except OSError:
            pool.release(port, clock.now())
            continue
        except asyncio.CancelledError:
            # The caller gave up (a call ended while ringing, a cancelled transfer). uvloop
            # has bound the socket by now and does not close it when its wait is cancelled;
            # it still hands the transport to the protocol, which closes it at once.
            proto.close()
            pool.release(port, clock.now())
            raise
        proto.transport = transport
        return port, proto
    return None
