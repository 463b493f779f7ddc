"""SDP parsing (RFC 4566) and offer/answer (RFC 3264) with hold, resume and re-offers."""

from __future__ import annotations

import pytest

from appbridge.carriers.sip.offer_answer import OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.sdp import (
    G722,
    PCMA,
    PCMU,
    Attribute,
    Connection,
    SdpError,
    SessionDescription,
)
from appbridge.media import g722

CARRIER_OFFER = (
    "v=0\r\n"
    "o=- 3912345678 3912345678 IN IP4 198.51.100.20\r\n"
    "s=SIP Call\r\n"
    "c=IN IP4 198.51.100.21\r\n"
    "t=0 0\r\n"
    "m=audio 31000 RTP/AVP 0 8 18 101\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:18 G729/8000\r\n"
    "a=fmtp:18 annexb=no\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\n"
    "a=ptime:20\r\n"
    "a=sendrecv\r\n"
)

# baresip-like: opus first, G722 with its 8000 clock, two telephone-event rates, video too.
BARESIP_OFFER = (
    "v=0\n"
    "o=- 1714 2048 IN IP4 127.0.0.1\n"
    "s=-\n"
    "c=IN IP4 127.0.0.1\n"
    "t=0 0\n"
    "m=audio 10002 RTP/AVP 96 9 0 8 100 101\n"
    "b=AS:128\n"
    "a=rtpmap:96 opus/48000/2\n"
    "a=fmtp:96 stereo=1;sprop-stereo=1\n"
    "a=rtpmap:9 G722/8000\n"
    "a=rtpmap:0 PCMU/8000\n"
    "a=rtpmap:8 PCMA/8000\n"
    "a=rtpmap:100 telephone-event/48000\n"
    "a=rtpmap:101 telephone-event/8000\n"
    "a=fmtp:101 0-15\n"
    "a=rtcp-mux\n"
    "m=video 10004 RTP/AVP 97\n"
    "a=rtpmap:97 H264/90000\n"
)

SIPP_OFFER = (
    "v=0\r\n"
    "o=user1 53655765 2353687637 IN IP4 127.0.1.1\r\n"
    "s=-\r\n"
    "c=IN IP4 127.0.1.1\r\n"
    "t=0 0\r\n"
    "m=audio 6000 RTP/AVP 0\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
)


def negotiator(**kw: object) -> SdpNegotiator:
    args: dict[str, object] = {"local_address": "10.0.0.5", "rtp_port": 20002, "session_id": 42}
    args.update(kw)
    return SdpNegotiator(**args)  # type: ignore[arg-type]


def with_direction(body: str, direction: str, version: int | None = None) -> SessionDescription:
    s = SessionDescription.parse(body.replace("a=sendrecv", f"a={direction}"))
    if direction not in body:
        s.media[0].attributes = [a for a in s.media[0].attributes if a.name != "sendrecv"]
        s.media[0].attributes.append(Attribute(direction))
    if version is not None:
        s.origin = type(s.origin)(
            s.origin.username,
            s.origin.session_id,
            version,
            s.origin.net_type,
            s.origin.addr_type,
            s.origin.address,
        )
    return s


# -- RFC 4566 --------------------------------------------------------------------------------


def test_parse_carrier_offer() -> None:
    s = SessionDescription.parse(CARRIER_OFFER.encode())
    assert s.origin.session_id == "3912345678" and s.origin.session_version == 3912345678
    assert s.connection == Connection("IN", "IP4", "198.51.100.21")
    m = s.media[0]
    assert (m.media, m.port, m.proto, m.formats) == (
        "audio",
        31000,
        "RTP/AVP",
        ["0", "8", "18", "101"],
    )
    assert m.rtpmap()[101] == ("telephone-event", 8000, 1)
    assert m.fmtp(101) == "0-16" and m.fmtp(18) == "annexb=no" and m.fmtp(0) is None
    assert m.ptime_ms() == 20 and m.direction() == "sendrecv"


def test_round_trip_keeps_everything() -> None:
    for body in (CARRIER_OFFER, BARESIP_OFFER.replace("\n", "\r\n")):
        s = SessionDescription.parse(body)
        assert s.serialize().decode() == body
        assert SessionDescription.parse(s.serialize()) == s


def test_round_trip_with_optional_lines_in_rfc_order() -> None:
    body = (
        "v=0\r\no=a 1 2 IN IP6 ::1\r\ns=x\r\ni=info\r\nu=http://x\r\ne=a@b\r\np=+1\r\n"
        "c=IN IP6 ::1\r\nb=AS:64\r\nt=0 0\r\nr=7d 1h 0\r\nz=0 0\r\nk=prompt\r\na=tool:x\r\n"
        "m=audio 4000/2 RTP/AVP 0\r\ni=m info\r\nc=IN IP6 ::2\r\nb=AS:10\r\nk=clear:x\r\n"
        "a=recvonly\r\n"
    )
    s = SessionDescription.parse(body)
    assert s.serialize().decode() == body
    assert s.media[0].port_count == 2 and s.media[0].direction() == "recvonly"


@pytest.mark.parametrize(
    "body",
    [
        "",
        "o=- 1 1 IN IP4 1.2.3.4\r\n",
        "v=1\r\no=- 1 1 IN IP4 1.2.3.4\r\n",
        "v=0\r\ns=-\r\n",
        "v=0\r\no=- 1 1 IN IP4\r\n",
        "v=0\r\no=- x 1 IN IP4 1.2.3.4\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\no=- 1 1 IN IP4 1.2.3.4\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nthis is not sdp\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 99999 RTP/AVP 0\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio x RTP/AVP 0\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nc=IN IP4\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nm=audio 1 RTP/AVP 0\r\ns=late\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\na=\r\n",
        "v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nv=0\r\n",
    ],
)
def test_malformed_sdp_raises_sdp_error(body: str) -> None:
    with pytest.raises(SdpError):
        SessionDescription.parse(body)


def test_non_utf8_and_oversized_bodies() -> None:
    with pytest.raises(SdpError):
        SessionDescription.parse(b"v=0\r\no=\xff\r\n")
    with pytest.raises(SdpError):
        SessionDescription.parse(b"v=0\r\n" + b"a=x\r\n" * 20000)


# -- answering -------------------------------------------------------------------------------


def test_answer_picks_one_codec_plus_telephone_event() -> None:
    neg = negotiator()
    answer, media = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    text = answer.serialize().decode()
    assert "m=audio 20002 RTP/AVP 0 101\r\n" in text
    assert "a=rtpmap:0 PCMU/8000\r\n" in text
    assert "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\n" in text
    assert "a=ptime:20\r\na=sendrecv\r\n" in text
    assert "c=IN IP4 10.0.0.5\r\n" in text and "o=appbridge 42 " in text
    assert media.codec == PCMU and media.send_payload_type == media.receive_payload_type == 0
    assert media.send_event_payload_type == media.receive_event_payload_type == 101
    assert (media.remote_address, media.remote_port) == ("198.51.100.21", 31000)
    assert media.send and media.receive and not media.remote_hold
    assert media.remote_ptime_ms == 20 and media.receive_payload_types == {0, 101}


def test_answer_uses_public_address() -> None:
    neg = negotiator(public_address="203.0.113.10")
    answer, _ = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    text = answer.serialize().decode()
    assert "c=IN IP4 203.0.113.10\r\n" in text and " IN IP4 203.0.113.10\r\n" in text
    assert "10.0.0.5" not in text


@pytest.mark.skipif(not g722.AVAILABLE, reason="the G722 package is not installed")
def test_answer_to_baresip_picks_g722_and_rejects_video() -> None:
    neg = negotiator()
    answer, media = neg.create_answer(SessionDescription.parse(BARESIP_OFFER))
    assert media.codec == G722 and media.codec.rtp_clock_hz == 8000
    assert media.codec.audio_rate_hz == 16000
    assert media.send_event_payload_type == 101  # the 8000 Hz one, not the 48 kHz one
    audio, video = answer.media
    assert audio.formats == ["9", "101"] and audio.port == 20002
    assert "a=rtpmap:9 G722/8000" in answer.serialize().decode()
    assert (video.media, video.port, video.formats) == ("video", 0, ["97"])


def test_answer_with_local_preference() -> None:
    neg = negotiator(codecs=["PCMA", "PCMU"], prefer="local")
    _, media = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    assert media.codec == PCMA


def test_answer_to_sipp_without_telephone_event() -> None:
    answer, media = negotiator().create_answer(SessionDescription.parse(SIPP_OFFER))
    assert answer.media[0].formats == ["0"]
    assert media.send_event_payload_type is None and media.receive_event_payload_type is None
    assert "telephone-event" not in answer.serialize().decode()


def test_dynamic_payload_type_mapping_by_rtpmap() -> None:
    offer = SIPP_OFFER.replace("RTP/AVP 0", "RTP/AVP 112 0").replace(
        "a=rtpmap:0", "a=rtpmap:112 PCMA/8000\r\na=rtpmap:0"
    )
    _, media = negotiator().create_answer(SessionDescription.parse(offer))
    assert media.codec.name == "PCMA" and media.send_payload_type == 112


def test_static_payload_type_without_rtpmap() -> None:
    offer = SIPP_OFFER.replace("a=rtpmap:0 PCMU/8000\r\n", "").replace("RTP/AVP 0", "RTP/AVP 8")
    _, media = negotiator().create_answer(SessionDescription.parse(offer))
    assert media.codec == PCMA


@pytest.mark.parametrize(
    "offer",
    [
        SIPP_OFFER.replace("RTP/AVP 0", "RTP/AVP 18").replace("PCMU", "G729"),
        SIPP_OFFER.replace("RTP/AVP", "RTP/SAVP"),
        SIPP_OFFER.replace("m=audio 6000", "m=audio 0"),
        SIPP_OFFER.replace("m=audio", "m=video"),
        SIPP_OFFER.replace("PCMU/8000", "PCMU/16000"),
    ],
)
def test_unacceptable_offers_raise_488(offer: str) -> None:
    with pytest.raises(OfferAnswerError):
        negotiator().create_answer(SessionDescription.parse(offer))


def test_missing_connection_is_an_sdp_error() -> None:
    with pytest.raises(SdpError):
        negotiator().create_answer(
            SessionDescription.parse(SIPP_OFFER.replace("c=IN IP4 127.0.1.1\r\n", ""))
        )


def test_media_level_connection_overrides_session_level() -> None:
    offer = SIPP_OFFER.replace("a=rtpmap:0", "c=IN IP4 192.0.2.99\r\na=rtpmap:0")
    _, media = negotiator().create_answer(SessionDescription.parse(offer))
    assert media.remote_address == "192.0.2.99"


@pytest.mark.parametrize(
    ("offered", "answered", "send", "receive"),
    [
        ("sendrecv", "sendrecv", True, True),
        ("sendonly", "recvonly", False, True),
        ("recvonly", "sendonly", True, False),
        ("inactive", "inactive", False, False),
    ],
)
def test_direction_answers(offered: str, answered: str, send: bool, receive: bool) -> None:
    answer, media = negotiator().create_answer(with_direction(CARRIER_OFFER, offered))
    assert answer.media[0].direction() == answered
    assert (media.send, media.receive) == (send, receive)
    assert media.remote_hold == (offered in ("sendonly", "inactive"))


def test_session_level_direction_applies() -> None:
    offer = CARRIER_OFFER.replace("a=sendrecv\r\n", "").replace(
        "t=0 0\r\n", "t=0 0\r\na=sendonly\r\n"
    )
    answer, media = negotiator().create_answer(SessionDescription.parse(offer))
    assert answer.media[0].direction() == "recvonly" and media.remote_hold


def test_old_style_hold_with_zero_address() -> None:
    offer = CARRIER_OFFER.replace("c=IN IP4 198.51.100.21", "c=IN IP4 0.0.0.0")
    answer, media = negotiator().create_answer(SessionDescription.parse(offer))
    assert media.remote_hold and not media.send
    assert answer.media[0].direction() == "recvonly"


def test_hold_and_resume_by_the_caller_with_versions() -> None:
    neg = negotiator()
    first, m1 = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    v1 = first.origin.session_version
    held, m2 = neg.create_answer(with_direction(CARRIER_OFFER, "sendonly", version=3912345679))
    assert m2.remote_hold and held.media[0].direction() == "recvonly"
    assert held.origin.session_id == "42" and held.origin.session_version == v1 + 1
    resumed, m3 = neg.create_answer(with_direction(CARRIER_OFFER, "sendrecv", version=3912345680))
    assert not m3.remote_hold and resumed.media[0].direction() == "sendrecv"
    assert resumed.origin.session_version == v1 + 2
    assert not m1.unchanged and not m3.unchanged


def test_session_refresh_keeps_our_version_and_is_reported_unchanged() -> None:
    neg = negotiator()
    a1, _ = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    a2, media = neg.create_answer(SessionDescription.parse(CARRIER_OFFER))
    assert media.unchanged
    assert a2.origin.session_version == a1.origin.session_version
    assert a2.serialize() == a1.serialize()


def test_our_own_hold_wish_limits_the_answer() -> None:
    neg = negotiator()
    answer, media = neg.create_answer(SessionDescription.parse(CARRIER_OFFER), direction="sendonly")
    assert answer.media[0].direction() == "sendonly" and media.send and not media.receive


# -- offering --------------------------------------------------------------------------------


def test_offer_lists_codecs_and_telephone_event() -> None:
    neg = negotiator(codecs=["PCMU", "PCMA", "G722"] if g722.AVAILABLE else ["PCMU", "PCMA"])
    offer = neg.create_offer()
    text = offer.serialize().decode()
    formats = ["0", "8", "9", "101"] if g722.AVAILABLE else ["0", "8", "101"]
    assert offer.media[0].formats == formats
    assert "a=fmtp:101 0-16\r\n" in text and "a=ptime:20\r\n" in text and "a=sendrecv" in text
    assert text.startswith("v=0\r\no=appbridge 42 ")


def test_offer_answer_and_reoffer_for_hold() -> None:
    neg = negotiator(codecs=["PCMU", "PCMA"], event_payload_type=96)
    offer = neg.create_offer()
    v = offer.origin.session_version
    answer = (
        "v=0\r\no=peer 9 9 IN IP4 192.0.2.8\r\ns=-\r\nc=IN IP4 192.0.2.8\r\nt=0 0\r\n"
        "m=audio 5004 RTP/AVP 8 97\r\na=rtpmap:8 PCMA/8000\r\n"
        "a=rtpmap:97 telephone-event/8000\r\na=fmtp:97 0-15\r\na=sendrecv\r\n"
    )
    media = neg.process_answer(SessionDescription.parse(answer))
    assert media.codec == PCMA and (media.remote_address, media.remote_port) == ("192.0.2.8", 5004)
    # We send telephone-events as the peer numbered them and receive them as we did.
    assert media.send_event_payload_type == 97 and media.receive_event_payload_type == 96
    hold = neg.create_offer("sendonly")
    assert hold.origin.session_id == offer.origin.session_id
    assert hold.origin.session_version == v + 1
    assert hold.media[0].direction() == "sendonly"
    held = neg.process_answer(SessionDescription.parse(answer.replace("sendrecv", "recvonly")))
    assert held.send and not held.receive
    again = neg.create_offer("sendonly")
    assert again.origin.session_version == v + 1  # unchanged content, same version
    resume = neg.create_offer("sendrecv")
    assert resume.origin.session_version == v + 2


def test_process_answer_errors() -> None:
    neg = negotiator(codecs=["PCMU"])
    with pytest.raises(OfferAnswerError):
        neg.process_answer(SessionDescription.parse(SIPP_OFFER))  # no offer outstanding
    neg.create_offer()
    with pytest.raises(OfferAnswerError):
        neg.process_answer(
            SessionDescription.parse(SIPP_OFFER.replace("m=audio 6000", "m=audio 0"))
        )
    neg.create_offer()
    with pytest.raises(OfferAnswerError):
        neg.process_answer(SessionDescription.parse(SIPP_OFFER.replace("RTP/AVP 0", "RTP/AVP 8")))


def test_ipv6_addresses() -> None:
    neg = negotiator(local_address="2001:db8::5")
    text = neg.create_offer().serialize().decode()
    assert "c=IN IP6 2001:db8::5\r\n" in text


def test_unknown_codec_names_are_rejected() -> None:
    with pytest.raises(ValueError):
        negotiator(codecs=["OPUS"])
