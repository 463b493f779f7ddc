"""Hypothesis against the SDP, RTP and RFC 4733 parsers and the media state machines: any input
gives a result or the parser's own error, never another exception."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appbridge.carriers.sip.dtmf4733 import Rfc4733Receiver, TelephoneEvent, TelephoneEventError
from appbridge.carriers.sip.jitter import JitterBuffer
from appbridge.carriers.sip.offer_answer import OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.rtp import RtpError, RtpPacket, RtpReceiver
from appbridge.carriers.sip.sdp import SdpError, SessionDescription

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID_SDP = (
    "v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\ns=-\r\nc=IN IP4 192.0.2.1\r\nt=0 0\r\n"
    "m=audio 4000 RTP/AVP 0 8 9 101\r\na=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\na=ptime:20\r\na=sendrecv\r\n"
)

sdp_line = st.one_of(
    st.sampled_from(VALID_SDP.split("\r\n")),
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from([*list("vosicbtamkrzeup"), "x", "1", ""]),
        st.text(max_size=40),
    ),
    st.builds(
        lambda pt, name, rate: f"a=rtpmap:{pt} {name}/{rate}",
        st.text(max_size=4),
        st.sampled_from(["PCMU", "PCMA", "G722", "telephone-event", "", "opus"]),
        st.text(max_size=6),
    ),
    st.builds(
        lambda port, fmts: f"m=audio {port} RTP/AVP {fmts}",
        st.text(max_size=7),
        st.text(max_size=12),
    ),
    st.sampled_from(
        ["c=IN IP4 0.0.0.0", "a=sendonly", "a=recvonly", "a=inactive", "a=ptime:inf", "m=video 0 x"]
    ),
)


def _answer(sdp: SessionDescription) -> None:
    neg = SdpNegotiator(local_address="10.0.0.1", rtp_port=20000, session_id=1)
    try:
        answer, _ = neg.create_answer(sdp)
    except (SdpError, OfferAnswerError):
        return
    # Whatever we answered parses back.
    SessionDescription.parse(answer.serialize())


@FUZZ
@given(st.binary(max_size=600))
def test_sdp_parser_on_arbitrary_bytes(data: bytes) -> None:
    try:
        sdp = SessionDescription.parse(data)
    except SdpError:
        return
    _answer(sdp)


@FUZZ
@given(st.lists(sdp_line, max_size=25), st.sampled_from(["\r\n", "\n"]))
def test_sdp_parser_and_answerer_on_sdp_like_text(lines: list[str], eol: str) -> None:
    body = eol.join(["v=0", *lines])
    try:
        sdp = SessionDescription.parse(body)
    except SdpError:
        return
    _answer(sdp)
    SessionDescription.parse(sdp.serialize())


@FUZZ
@given(st.binary(max_size=200))
def test_rtp_parser_on_arbitrary_bytes(data: bytes) -> None:
    try:
        p = RtpPacket.parse(data)
    except RtpError:
        return
    # A packet that parses serializes back to the same bytes (padding content aside).
    again = p.serialize()
    if not p.padding_bytes:
        assert again == data
    assert RtpPacket.parse(again) == p


@FUZZ
@given(st.binary(min_size=12, max_size=80))
def test_rtp_parser_on_version_2_headers(tail: bytes) -> None:
    data = bytes([0x80 | (tail[0] & 0x3F)]) + tail[1:]
    try:
        RtpPacket.parse(data)
    except RtpError:
        pass


@FUZZ
@given(st.binary(max_size=40))
def test_telephone_event_parser(data: bytes) -> None:
    try:
        events = TelephoneEvent.parse_all(data)
    except TelephoneEventError:
        return
    # The reserved R bit (RFC 4733 section 2.3) is ignored on receipt and sent as 0.
    expected = bytes(b & 0xBF if i % 4 == 1 else b for i, b in enumerate(data))
    assert b"".join(e.serialize() for e in events) == expected


packet_st = st.builds(
    lambda seq, ts, pt, payload: RtpPacket(pt, seq, ts, 1, payload),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.sampled_from([0, 101]),
    st.binary(max_size=8),
)


@FUZZ
@given(
    st.lists(
        st.tuples(packet_st, st.floats(0, 0.2), st.booleans(), st.sampled_from(["a", "b"])),
        max_size=80,
    )
)
def test_receiver_jitter_buffer_and_dtmf_never_raise_and_stay_bounded(
    steps: list[tuple[RtpPacket, float, bool, str]],
) -> None:
    rx = RtpReceiver(payload_types={0, 101})
    jb = JitterBuffer(capacity_packets=16)
    dtmf = Rfc4733Receiver()
    now = 0.0
    for packet, dt, do_pop, source in steps:
        now += dt
        arrived = rx.receive(packet.serialize(), (source, 1), now)
        if arrived is not None:
            if arrived.source_changed:
                jb.reset()
            if packet.payload_type == 101:
                dtmf.receive(packet.payload, timestamp=packet.timestamp, now=now)
            else:
                jb.push(packet, now)
        assert len(jb) <= 16
        if do_pop:
            while jb.pop(now) is not None:
                pass
        dtmf.poll(now)
    assert rx.stats.lost >= 0
