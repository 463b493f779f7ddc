"""bench/sip_caller.py: the benchmark's SIP/RTP caller against a scripted UAS on loopback.

The UAS here is built on the same cores (message, sdp) and answers like the gateway does
(docs/sip.md): 100/180 then 200 with an SDP answer, 503 with Retry-After when full, 200 to
BYE. RTP ticks are driven by hand (the worker's 20 ms ticker is off), so no test waits on
real time beyond loopback delivery.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator

import pytest

from appbridge.carriers.sip.message import Request, Response, make_response, parse_message
from appbridge.carriers.sip.offer_answer import SdpNegotiator
from appbridge.carriers.sip.sdp import SessionDescription
from bench.measure import is_loud, onset_latencies_ms
from bench.sip_caller import (
    FRAME_BYTES,
    SIP_CALLER_PREFIX,
    ULAW_SILENCE,
    SipCaller,
    SipCallError,
    SipEndpoint,
    sip_caller_number,
)

WAIT_S = 5.0


class Uas(asyncio.DatagramProtocol):
    """A scripted UAS: answers INVITE with ``status`` and keeps what it received."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[Request] = []
        self.rtp_packets: list[bytes] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.rtp: asyncio.DatagramTransport | None = None
        self.peer: tuple[str, int] | None = None
        self.got: dict[str, asyncio.Event] = {m: asyncio.Event() for m in ("ACK", "BYE")}

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        message = parse_message(data)
        assert isinstance(message, Request)
        self.requests.append(message)
        self.peer = (str(addr[0]), int(addr[1]))
        if message.method == "INVITE":
            self.send(make_response(message, 100))
            if self.status != 200:
                self.send(
                    make_response(
                        message, self.status, to_tag="uas", headers=[("Retry-After", "5")]
                    )
                )
                return
            assert self.rtp is not None
            negotiator = SdpNegotiator(
                local_address="127.0.0.1", rtp_port=self.rtp.get_extra_info("sockname")[1]
            )
            answer, _ = negotiator.create_answer(SessionDescription.parse(message.body))
            ok = make_response(
                message,
                200,
                to_tag="uas",
                headers=[("Contact", f"<sip:gw@127.0.0.1:{self.port}>")],
                body=answer.serialize(),
                content_type="application/sdp",
            )
            self.send(ok)
        elif message.method in self.got:
            if message.method == "BYE":
                self.send(make_response(message, 200))
            self.got[message.method].set()

    @property
    def port(self) -> int:
        assert self.transport is not None
        port: int = self.transport.get_extra_info("sockname")[1]
        return port

    def send(self, response: Response) -> None:
        assert self.transport is not None and self.peer is not None
        self.transport.sendto(response.serialize(), self.peer)


class RtpSink(asyncio.DatagramProtocol):
    def __init__(self, uas: Uas) -> None:
        self.uas = uas
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.uas.rtp_packets.append(data)
        self.uas.peer_rtp = (str(addr[0]), int(addr[1]))  # type: ignore[attr-defined]
        self.arrived.set()


async def start_uas(status: int = 200) -> tuple[Uas, RtpSink]:
    loop = asyncio.get_running_loop()
    uas = Uas(status)
    uas.transport, _ = await loop.create_datagram_endpoint(lambda: uas, local_addr=("127.0.0.1", 0))
    sink = RtpSink(uas)
    uas.rtp, _ = await loop.create_datagram_endpoint(lambda: sink, local_addr=("127.0.0.1", 0))
    return uas, sink


@pytest.fixture
async def uas_and_endpoint() -> AsyncIterator[tuple[Uas, RtpSink, SipEndpoint]]:
    uas, sink = await start_uas()
    endpoint = SipEndpoint(("127.0.0.1", uas.port), ticking=False)
    await endpoint.start()
    yield uas, sink, endpoint
    await endpoint.stop()
    assert uas.transport is not None and uas.rtp is not None
    uas.transport.close()
    uas.rtp.close()


async def test_invite_ack_rtp_both_ways_and_bye(
    uas_and_endpoint: tuple[Uas, RtpSink, SipEndpoint],
) -> None:
    uas, _sink, endpoint = uas_and_endpoint
    call = SipCaller(endpoint, sip_caller_number(3, 7), "+15552000000")
    await call.place(timeout_s=WAIT_S)
    await asyncio.wait_for(uas.got["ACK"].wait(), WAIT_S)
    invite, ack = uas.requests[0], uas.requests[1]
    assert invite.method == "INVITE" and invite.uri.user == "+15552000000"
    assert invite.from_.uri.user == call.caller and call.caller.startswith(SIP_CALLER_PREFIX)
    assert SessionDescription.parse(invite.body).media[0].formats[0] == "0"  # PCMU
    assert ack.method == "ACK" and ack.to.tag == "uas" and ack.cseq.seq == 1
    assert ack.uri.port == uas.port  # to the Contact of the 2xx (RFC 3261 §12.1.2)
    assert call.has_stream and call.call_sid == call.caller

    # Caller -> gateway: the tone, then silence.
    call.talk(b"\x10" * (FRAME_BYTES + 40))
    before = time.monotonic()
    for k in range(3):
        call.tick(100.0 + 0.02 * k)  # the ticker's deadlines: the records take the real instant
    after = time.monotonic()
    await asyncio.wait_for(_until(lambda: len(uas.rtp_packets) == 3), WAIT_S)
    payloads = [p[12:] for p in uas.rtp_packets]
    assert payloads[0] == b"\x10" * FRAME_BYTES
    assert payloads[1] == b"\x10" * 40 + ULAW_SILENCE[40:]
    assert payloads[2] == ULAW_SILENCE
    sent = list(call.sent_media_times())
    assert len(sent) == 3 and before <= sent[0] <= sent[1] <= sent[2] <= after
    assert list(call.onset_times) == [sent[0]]  # the tone's first packet

    # Gateway -> caller: audio is told from silence.
    assert uas.rtp is not None
    head = bytes([0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1])
    sent_at = time.monotonic()
    uas.rtp.sendto(head + b"\x22" * FRAME_BYTES, uas.peer_rtp)  # type: ignore[attr-defined]
    uas.rtp.sendto(head + ULAW_SILENCE, uas.peer_rtp)  # type: ignore[attr-defined]
    await asyncio.wait_for(_until(lambda: len(call.recv_times) == 2), WAIT_S)
    assert list(call.recv_audio_bytes) == [FRAME_BYTES, 0]
    # Kernel receive stamps (bench/stamped.py): after the send, never after the loop's read.
    assert len(call.recv_loop_times) == 2
    for kernel, loop in zip(call.recv_times, call.recv_loop_times, strict=True):
        assert sent_at - 0.001 <= kernel <= loop
    assert [n for _, n in call.media_arrivals()] == [FRAME_BYTES]

    await call.hangup(timeout_s=WAIT_S)
    assert uas.got["BYE"].is_set() and call.closed
    bye = uas.requests[-1]
    assert bye.method == "BYE" and bye.cseq.seq == 2 and bye.to.tag == "uas"


async def test_a_503_is_a_refusal_and_is_acked() -> None:
    uas, _ = await start_uas(status=503)
    endpoint = SipEndpoint(("127.0.0.1", uas.port), ticking=False)
    await endpoint.start()
    try:
        call = SipCaller(endpoint, sip_caller_number(0, 1), "+15552000000")
        with pytest.raises(SipCallError) as refused:
            await call.place(timeout_s=WAIT_S)
        assert refused.value.status == 503 and str(refused.value).startswith("503")
        await asyncio.wait_for(uas.got["ACK"].wait(), WAIT_S)
        ack = uas.requests[-1]
        # The ACK of a non-2xx final response reuses the INVITE's branch (RFC 3261 §17.1.1.3).
        assert ack.top_via.branch == uas.requests[0].top_via.branch
        assert call.closed and not call.has_stream
    finally:
        await endpoint.stop()
        assert uas.transport is not None and uas.rtp is not None
        uas.transport.close()
        uas.rtp.close()


async def test_the_gateways_bye_is_answered_and_ends_the_call(
    uas_and_endpoint: tuple[Uas, RtpSink, SipEndpoint],
) -> None:
    uas, _, endpoint = uas_and_endpoint
    call = SipCaller(endpoint, sip_caller_number(0, 2), "+15552000000")
    await call.place(timeout_s=WAIT_S)
    await asyncio.wait_for(uas.got["ACK"].wait(), WAIT_S)
    bye = Request(
        "BYE",
        uas.requests[0].from_.uri,
        [
            ("Via", f"SIP/2.0/UDP 127.0.0.1:{uas.port};branch=z9hG4bKgwbye"),
            ("From", "<sip:+15552000000@127.0.0.1>;tag=uas"),
            ("To", uas.requests[0].headers.get("From") or ""),
            ("Call-ID", call.call_id),
            ("CSeq", "1 BYE"),
            ("Max-Forwards", "70"),
        ],
    )
    assert uas.transport is not None and uas.peer is not None
    uas.transport.sendto(bye.serialize(), uas.peer)
    await asyncio.wait_for(call.done, WAIT_S)
    assert call.closed and call.ended_by_gateway


async def test_views_for_the_analysis() -> None:
    """heard_frames / silence_after / clear_times on a recorded timeline (no network)."""
    call = SipCaller(SipEndpoint(("127.0.0.1", 9), ticking=False), "+155530000000001", "x")
    for k, n in enumerate([FRAME_BYTES, FRAME_BYTES, 0, 0, FRAME_BYTES, 0]):
        call.recv_times.append(10.0 + 0.02 * k)
        call.recv_audio_bytes.append(n)
    assert [n for _, _, n in call.heard_frames()] == [160, 160, 0, 0, 160, 0]
    assert call.silence_after(10.005) == pytest.approx(10.04)
    assert call.silence_after(10.045) == pytest.approx(10.045)  # silence was already playing
    assert call.silence_after(10.2) is None
    assert call.clear_times == pytest.approx([10.04, 10.10])
    assert sip_caller_number(3, 7) == SIP_CALLER_PREFIX + "03000007"


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():  # noqa: ASYNC110 - loopback datagrams raise no event
        await asyncio.sleep(0)


def test_onset_latency_finds_the_first_loud_frame_after_each_talkspurt() -> None:
    quiet = bytes(640)
    loud = struct.pack("<320h", *([3000, -3000] * 160))
    received = [(1.00, quiet), (1.02, quiet), (1.04, loud), (1.06, loud), (3.05, loud)]
    # Onsets at 1.01 and 3.00; one at 5.00 never heard; one outside the window at 0.5.
    latencies = onset_latencies_ms([0.5, 1.01, 3.00, 5.00], received, window=(1.0, 6.0))
    assert latencies == pytest.approx([30.0, 50.0])
    assert is_loud(loud) and not is_loud(quiet)
