"""SipLeg pacing in virtual time: one RTP packet per tick, silence when the engine has nothing,
continuous sequence/timestamps, RFC 4733 out replacing audio, caller audio and DTMF in."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from appbridge.carriers.sip.dtmf4733 import TelephoneEvent
from appbridge.carriers.sip.leg import RtpPortPool, SipLeg
from appbridge.carriers.sip.offer_answer import NegotiatedAudio
from appbridge.carriers.sip.rtp import RtpPacket
from appbridge.carriers.sip.sdp import G722, PCMU, Codec
from appbridge.clock import VirtualClock
from appbridge.media.codecs import PCM16_16K
from appbridge.media.g722 import G722Decoder, G722Encoder
from appbridge.media.media_clock import MediaClock
from appbridge.testing.audio import dominant_freq, tone_pcm16

PEER = ("127.0.0.1", 40000)


class Events:
    def __init__(self) -> None:
        self.audio: list[bytes] = []
        self.digits: list[str] = []

    def on_carrier_audio(self, payload: bytes) -> None:
        self.audio.append(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        self.digits.append(digit)

    def on_carrier_hangup(self) -> None:
        pass


def make_leg(
    codec: Codec = PCMU,
) -> tuple[SipLeg, VirtualClock, list[RtpPacket], list[Callable[[], None]], Events]:
    neg = NegotiatedAudio(
        codec=codec,
        send_payload_type=codec.payload_type,
        receive_payload_type=codec.payload_type,
        send_event_payload_type=101,
        receive_event_payload_type=101,
        remote_address=PEER[0],
        remote_port=PEER[1],
        local_direction="sendrecv",
        remote_direction="sendrecv",
        remote_ptime_ms=20,
    )
    clock = VirtualClock()
    sent: list[RtpPacket] = []
    deferred: list[Callable[[], None]] = []
    leg = SipLeg(
        neg,
        clock=clock,
        send_datagram=lambda data, addr: sent.append(RtpPacket.parse(data)),
        defer=deferred.append,
        ssrc=1234,
        initial_sequence=65534,
        initial_timestamp=1000,
    )
    events = Events()
    leg.attach(events)
    return leg, clock, sent, deferred, events


def tick(
    leg: SipLeg, clock: VirtualClock, deferred: list[Callable[[], None]], frame: bytes | None
) -> None:
    assert leg.frames_wanted(frame is not None) == 1
    if frame is not None:
        leg.send_frame(frame)
    assert len(deferred) == 1
    deferred.pop()()
    clock.advance(0.020)


def test_one_packet_per_tick_with_silence_and_continuous_numbers() -> None:
    leg, clock, sent, deferred, _ = make_leg()
    for i in range(6):
        tick(leg, clock, deferred, b"\x11" * 160 if i % 2 == 0 else None)
    assert len(sent) == 6
    assert [p.sequence for p in sent] == [65534, 65535, 0, 1, 2, 3]
    assert [p.timestamp for p in sent] == [1000 + 160 * i for i in range(6)]
    assert {p.ssrc for p in sent} == {1234}
    assert sent[1].payload == b"\xff" * 160  # µ-law silence when the engine had nothing
    assert sent[0].payload == b"\x11" * 160 and sent[0].marker and not sent[1].marker
    assert leg.silence_sent == 3


def test_rfc4733_out_replaces_audio_and_keeps_the_clock() -> None:
    leg, clock, sent, deferred, _ = make_leg()
    tick(leg, clock, deferred, None)
    assert leg.send_dtmf("5")
    for _ in range(15):
        tick(leg, clock, deferred, b"\x11" * 160)
    events = [p for p in sent if p.payload_type == 101]
    audio = [p for p in sent if p.payload_type == 0]
    assert events and events[0].marker
    parsed = [TelephoneEvent.parse_all(p.payload)[0] for p in events]
    assert {e.event for e in parsed} == {5}
    assert sum(1 for e in parsed if e.end) == 3
    # Audio resumes after the event with the timestamp that ran on underneath it.
    assert audio[-1].timestamp == 1000 + 160 * 15
    seqs = [p.sequence for p in sent]
    assert all((b - a) & 0xFFFF == 1 for a, b in itertools.pairwise(seqs))


def test_caller_audio_and_dtmf_in() -> None:
    leg, clock, _, deferred, events = make_leg()
    for i in range(10):
        pkt = RtpPacket(0, 100 + i, 5000 + 160 * i, 99, b"\x22" * 160)
        leg.datagram_received(pkt.serialize(), PEER, clock.now())
        tick(leg, clock, deferred, None)
    for _ in range(5):
        tick(leg, clock, deferred, None)
    # Ten frames, plus one repeat when the stream pauses (jitter.py: conceal by repeating once).
    assert events.audio.count(b"\x22" * 160) == 11
    assert events.audio[-1] == b"\xff" * 160
    ev = TelephoneEvent(event=11, end=False, volume=10, duration_units=0).serialize()
    for i in range(3):
        pkt = RtpPacket(101, 200 + i, 9000, 99, ev, marker=i == 0)
        leg.datagram_received(pkt.serialize(), PEER, clock.now())
    assert events.digits == ["#"]


def test_caller_audio_after_a_step_up_in_delay_reaches_the_engine_once_per_packet() -> None:
    """The caller's packets come 300 ms later from the 100th on, and stay that late (their
    sender lost time and resynchronised): the engine gets every frame once, in order, with one
    short gap, not a burst of concealment after each packet (jitter.py, *Delay*)."""
    leg, clock, _, deferred, events = make_leg()
    start = clock.now()
    arrivals = [(start + 0.020 * i + (0.3 if i >= 100 else 0.0), i) for i in range(200)]
    while arrivals or clock.now() < start + 4.5:
        while arrivals and arrivals[0][0] <= clock.now():
            i = arrivals.pop(0)[1]
            pkt = RtpPacket(0, 100 + i, 5000 + 160 * i, 99, bytes([1 + i]) * 160)
            leg.datagram_received(pkt.serialize(), PEER, clock.now())
        tick(leg, clock, deferred, None)
    heard = [f[0] for f in events.audio if f[0] != 0xFF]  # µ-law 0xff: concealed silence
    assert heard[:100] == list(range(1, 101))
    # After the step: the repeat that conceals the first missing frame, then every packet, then
    # the repeat at the end of the stream.
    assert heard[100:] == [100, *range(101, 201), 200]
    assert leg.jitter.stats.late == 0 and len(events.audio) <= 200 + 300 // 20 + 10


def test_port_pool_quarantines_released_ports() -> None:
    pool = RtpPortPool(20001, 20006, quarantine_s=10.0)
    assert [pool.acquire(0.0) for _ in range(3)] == [20002, 20004, 20006]
    assert pool.acquire(0.0) is None
    pool.release(20004, 1.0)
    assert pool.acquire(5.0) is None
    assert pool.acquire(11.0) == 20004


def test_g722_is_coded_by_the_leg_with_one_encoder_and_one_decoder_per_call() -> None:
    """G.722 is ADPCM: the far end decodes the whole call with one decoder, so the leg encodes
    every frame (items and silence alike) with one encoder; the engine sees pcm16 16 kHz."""
    leg, clock, sent, deferred, events = make_leg(G722)
    assert leg.audio_format == PCM16_16K and leg.audio_format.frame_bytes(20) == 640
    tone = tone_pcm16(1000, 200, 16000, amplitude=8000)
    frames = [tone[i : i + 640] for i in range(0, len(tone), 640)]
    # Two "items" with a silent gap between them, as the output queue hands them over.
    for frame in [*frames[:5], None, None, *frames[5:]]:
        tick(leg, clock, deferred, frame)
    assert all(len(p.payload) == 160 and p.payload_type == G722.payload_type for p in sent)
    far_end = G722Decoder()
    heard = b"".join(far_end.decode(p.payload) for p in sent)
    reference = G722Decoder().decode(
        G722Encoder().encode(b"".join([*frames[:5], bytes(1280), *frames[5:]]))
    )
    assert heard == reference  # the same as one continuous encoding: no splice anywhere
    # Incoming G.722 reaches the engine decoded, 640 bytes per 20 ms.
    encoder = G722Encoder()
    for i, frame in enumerate(frames):
        packet = RtpPacket(
            payload_type=G722.payload_type,
            sequence=100 + i,
            timestamp=5000 + 160 * i,
            ssrc=99,
            payload=encoder.encode(frame),
        )
        leg.datagram_received(packet.serialize(), PEER, clock.now())
    for _ in range(20):
        tick(leg, clock, deferred, None)
    assert events.audio and all(len(a) == 640 for a in events.audio)
    assert dominant_freq(b"".join(events.audio), 16000) == pytest.approx(1000, abs=25)


def test_clear_sends_the_next_packet_at_once_and_keeps_the_rate() -> None:
    """Clear-to-silence: the silent packet leaves with the ``clear``, not on the next
    tick; the next tick with nothing to play sends nothing, so sequence numbers and timestamps
    stay continuous and the stream keeps one packet per 20 ms on average."""
    leg, clock, sent, deferred, _ = make_leg()
    loud = b"\x10" * 160
    tick(leg, clock, deferred, loud)
    tick(leg, clock, deferred, loud)
    clock.advance(0.007)  # the app's clear arrives 7 ms into a tick interval
    leg.clear_output()
    assert len(sent) == 3 and sent[-1].payload == b"\xff" * 160  # µ-law silence, now
    tick(leg, clock, deferred, None)  # the tick it stood in for: nothing more
    assert len(sent) == 3
    tick(leg, clock, deferred, None)
    tick(leg, clock, deferred, loud)
    assert len(sent) == 5
    assert [p.sequence for p in sent] == [(65534 + i) & 0xFFFF for i in range(5)]
    assert [p.timestamp for p in sent] == [1000 + 160 * i for i in range(5)]
    # A clear between a tick's hand-over and its packet drops the frame handed over.
    assert leg.frames_wanted(True) == 1
    leg.send_frame(loud)
    leg.clear_output()
    deferred.pop()()
    assert sent[-1].payload == b"\xff" * 160 and len(sent) == 6
    # Audio right after a clear goes out on its ticks; the first silent tick makes up.
    clock.advance(0.020)
    leg.clear_output()
    tick(leg, clock, deferred, loud)
    tick(leg, clock, deferred, None)
    assert len(sent) == 8 and sent[-1].payload == loud
    tick(leg, clock, deferred, None)
    assert len(sent) == 9 and [p.sequence for p in sent][-1] == (65534 + 8) & 0xFFFF


def test_back_to_back_ticks_send_every_frame() -> None:
    """After a stall the media clock runs its catch-up ticks with no loop turn between them, so
    the next tick begins before the last one's deferred end has run: each frame still leaves,
    in order, and the one end still scheduled closes the last tick."""
    leg, clock, sent, deferred, _ = make_leg()
    frames = [bytes([0x20 + i]) * 160 for i in range(4)]
    for frame in frames:
        assert leg.frames_wanted(True) == 1
        leg.send_frame(frame)
        clock.advance(0.001)
    assert [p.payload for p in sent] == frames[:3]  # each tick's begin ended the one before
    assert len(deferred) == 1
    deferred.pop()()
    assert [p.payload for p in sent] == frames
    assert [p.sequence for p in sent] == [(65534 + i) & 0xFFFF for i in range(4)]
    assert [p.timestamp for p in sent] == [1000 + 160 * i for i in range(4)]
    tick(leg, clock, deferred, None)  # and the next tick is an ordinary one again
    assert len(sent) == 5 and sent[-1].payload == b"\xff" * 160


def test_rtp_sources_reach_the_leg_as_host_and_port() -> None:
    """IPv6 sources carry flow info and scope id too; the latch compares host and port only."""
    from appbridge.carriers.sip.leg import RtpProtocol

    for source, latched in (
        (("127.0.0.1", 4000), ("127.0.0.1", 4000)),
        (("::1", 4002, 0, 0), ("::1", 4002)),
    ):
        leg, clock, _, _, _ = make_leg()
        proto = RtpProtocol(clock)
        proto.leg = leg
        packet = RtpPacket(0, 1, 160, 99, b"\xff" * 160).serialize()
        proto.datagram_received(packet, source)  # type: ignore[arg-type]
        assert leg.receiver.latched_address == latched


async def test_the_legs_of_one_slice_end_their_ticks_in_one_callback_in_order() -> None:
    """One loop callback per slice for every SIP leg (``MediaClock.call_after_slice``), each
    hook its own failure boundary; a hook added while the batch runs waits for the next one."""
    import asyncio

    loop = asyncio.get_running_loop()
    media = MediaClock(clock=VirtualClock())
    ran: list[str] = []

    def failing() -> None:
        ran.append("fails")
        raise RuntimeError("one leg's bug")

    def late() -> None:
        ran.append("late")

    def first() -> None:
        ran.append("first")
        media.call_after_slice(late)  # scheduled from inside the batch: the next callback runs it

    scheduled_before = len(loop._ready) if hasattr(loop, "_ready") else None  # asyncio's own
    media.call_after_slice(first)
    media.call_after_slice(failing)
    media.call_after_slice(lambda: ran.append("third"))
    if scheduled_before is not None:
        assert len(loop._ready) == scheduled_before + 1  # one handle for the three hooks
    await asyncio.sleep(0)
    assert ran == ["first", "fails", "third"]
    await asyncio.sleep(0)
    assert ran == ["first", "fails", "third", "late"]


async def test_a_leg_on_the_media_clock_ends_its_tick_after_the_engine() -> None:
    import asyncio

    neg = make_leg()[0].negotiated
    sent: list[RtpPacket] = []
    clock = VirtualClock()
    leg = SipLeg(
        neg,
        clock=clock,
        defer=MediaClock(clock=clock).call_after_slice,
        send_datagram=lambda d, a: sent.append(RtpPacket.parse(d)),
    )
    leg.attach(Events())
    assert leg.frames_wanted(True) == 1
    leg.send_frame(b"\x01" * 160)
    assert sent == []  # held until the engine's tick is over
    await asyncio.sleep(0)
    assert [p.payload for p in sent] == [b"\x01" * 160]


def _media_leg(
    media: MediaClock, clock: VirtualClock, seen: list[str]
) -> tuple[SipLeg, list[RtpPacket]]:
    """A leg that ends its ticks on ``media``; each packet it sends is noted in ``seen``."""
    neg = make_leg()[0].negotiated
    sent: list[RtpPacket] = []

    def send(data: bytes, addr: object) -> None:
        sent.append(RtpPacket.parse(data))
        seen.append(f"packet {len(sent)}")

    leg = SipLeg(neg, clock=clock, defer=media.call_after_slice, send_datagram=send)
    leg.attach(Events())
    return leg, sent


async def test_the_legs_packet_leaves_once_per_tick_after_every_subscribers_tick() -> None:
    """The engine's tick hands the frame over; the packet leaves after every subscriber of the
    tick has been ticked (all in one slice here), once per tick, with that tick's frame."""
    import asyncio

    clock = VirtualClock()
    media = MediaClock(clock=clock)
    seen: list[str] = []
    leg, sent = _media_leg(media, clock, seen)

    def call_tick(tick: int, now: float) -> None:  # what calls/call.py does with a SIP leg
        seen.append(f"call@{tick}")
        for _ in range(leg.frames_wanted(True)):
            leg.send_frame(bytes([tick]) * 160)

    media.subscribe(lambda tick, now: seen.append(f"before@{tick}"))
    media.subscribe(call_tick)
    media.subscribe(lambda tick, now: seen.append(f"after@{tick}"))
    for tick in (1, 2, 3):
        media.run_tick()
        assert len(sent) == tick - 1  # nothing leaves inside the tick
        await asyncio.sleep(0)
        clock.advance(0.020)
    expected: list[str] = []
    for tick in (1, 2, 3):
        expected += [f"before@{tick}", f"call@{tick}", f"after@{tick}", f"packet {tick}"]
    assert seen == expected
    assert [p.payload for p in sent] == [bytes([t]) * 160 for t in (1, 2, 3)]
    assert [p.sequence for p in sent] == [sent[0].sequence + i for i in range(3)]


async def test_in_a_sliced_tick_the_legs_packet_leaves_before_the_next_slice() -> None:
    """With the tick in slices the packets of a slice's calls leave right after that slice,
    before the next one is ticked: the first slices do not wait for the last."""
    import asyncio

    clock = VirtualClock()
    media = MediaClock(slice_size=1, clock=clock)
    media._loop = asyncio.get_running_loop()  # what start() sets; the test drives the ticks
    seen: list[str] = []
    leg, sent = _media_leg(media, clock, seen)

    def call_tick(tick: int, now: float) -> None:
        seen.append(f"call@{tick}")
        leg.frames_wanted(False)

    media.subscribe(call_tick)
    media.subscribe(lambda tick, now: seen.append(f"other@{tick}"))
    media.begin_tick()
    media._run_slice(1)
    assert seen == ["call@1"] and sent == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert seen == ["call@1", "packet 1", "other@1"] and not media.in_tick
    assert sent[0].payload == b"\xff" * 160  # nothing handed over: the codec's silence


def _udp_port_bound(port: int) -> bool:
    """Whether any UDP socket on this host is bound to ``port`` (Linux's /proc/net/udp)."""
    suffix = f":{port:04X}"
    with open("/proc/net/udp") as table:
        return any(line.split()[1].endswith(suffix) for line in table.readlines()[1:])


async def test_open_rtp_cancelled_after_the_bind_closes_the_socket() -> None:
    """A call that ends while its RTP port is being opened cancels ``open_rtp``. uvloop binds
    the socket before its last wait and does not close it when that wait is cancelled (it
    leaked a port and a ResourceWarning): the protocol closes it when the loop hands it over."""
    import asyncio
    import socket

    from appbridge.carriers.sip.leg import open_rtp

    clock = VirtualClock()
    for cancel_when_bound in (False, True):
        port = 1
        while port % 2:  # the pool hands out even ports only
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        pool = RtpPortPool(port, port, quarantine_s=0.0)
        task = asyncio.ensure_future(open_rtp("127.0.0.1", pool, clock, attempts=1))
        if cancel_when_bound:
            for _ in range(10_000):
                if task.done() or _udp_port_bound(port):
                    break
                await asyncio.sleep(0)
            assert not task.done() and _udp_port_bound(port)  # inside uvloop's last wait
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(5):
            await asyncio.sleep(0)  # the loop hands the transport over; it closes at once
        assert not _udp_port_bound(port)
        assert pool.acquire(clock.now()) == port  # and the port is back in the pool
