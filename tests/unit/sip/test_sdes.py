"""SDES (RFC 4568): the a=crypto grammar, the srtp policy table of docs/sip.md and rekeying."""

from __future__ import annotations

import base64
import logging

import pytest

from appbridge.carriers.sip.offer_answer import OfferAnswerError, SdpNegotiator
from appbridge.carriers.sip.sdes import (
    KEY_SALT_BYTES,
    CryptoLine,
    SdesError,
    SrtpKeys,
    SrtpPolicy,
    parse_crypto,
    redact_sdp,
    usable_crypto,
)
from appbridge.carriers.sip.sdp import SessionDescription

KEY = bytes(range(KEY_SALT_BYTES))
B64 = base64.b64encode(KEY).decode()
SUITE80 = "AES_CM_128_HMAC_SHA1_80"
SUITE32 = "AES_CM_128_HMAC_SHA1_32"


def offer(proto: str = "RTP/AVP", crypto: tuple[str, ...] = (), version: int = 1) -> str:
    lines = [
        "v=0",
        f"o=- 77 {version} IN IP4 192.0.2.9",
        "s=-",
        "c=IN IP4 192.0.2.9",
        "t=0 0",
        f"m=audio 30000 {proto} 0 101",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=sendrecv",
        *(f"a=crypto:{c}" for c in crypto),
    ]
    return "\r\n".join(lines) + "\r\n"


def negotiator(srtp: SrtpPolicy = "off") -> SdpNegotiator:
    return SdpNegotiator(local_address="10.0.0.5", rtp_port=20002, session_id=42, srtp=srtp)


# -- the grammar ----------------------------------------------------------------------------


def test_parse_a_good_line_and_produce_it_back() -> None:
    line = parse_crypto(f"1 {SUITE80} inline:{B64}")
    assert line == CryptoLine(1, SUITE80, KEY)
    assert line.value() == f"1 {SUITE80} inline:{B64}"
    assert parse_crypto(line.value()) == line
    assert parse_crypto(f"7 {SUITE32} inline:{B64}").suite == SUITE32


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"1 AES_256_CM_HMAC_SHA1_80 inline:{B64}", "suite"),
        (f"1 F8_128_HMAC_SHA1_80 inline:{B64}", "suite"),
        (f"1 {SUITE80} inline:{B64[:-4]}!!!!", "base64"),
        (f"1 {SUITE80} inline:{base64.b64encode(KEY[:29]).decode()}", "29 bytes"),
        (f"1 {SUITE80} inline:{base64.b64encode(KEY + b'x').decode()}", "31 bytes"),
        (f"1 {SUITE80} inline:{B64}|1:4", "MKI"),
        (f"1 {SUITE80} inline:{B64}|2^31|1:4", "MKI"),
        (f"1 {SUITE80} inline:{B64}|2^20", "lifetime"),
        (f"1 {SUITE80} inline:{B64}|1048576", "lifetime"),
        (f"1 {SUITE80} inline:{B64}|2^49", "2^48"),
        (f"1 {SUITE80} inline:{B64}|forever", "lifetime"),
        (f"1 {SUITE80} inline:{B64} UNENCRYPTED_SRTP", "UNENCRYPTED_SRTP"),
        (f"1 {SUITE80} inline:{B64} KDR=1", "KDR"),
        (f"1 {SUITE80} inline:{B64}|2^31|1:4;inline:{B64}|2^31|2:4", "more than one key"),
        (f"x {SUITE80} inline:{B64}", "tag"),
        (f"1234567890 {SUITE80} inline:{B64}", "tag"),
        (f"1 {SUITE80} uri:{B64}", "inline"),
        (f"1 {SUITE80}", "needs"),
    ],
)
def test_unusable_lines_are_refused_with_a_reason(value: str, why: str) -> None:
    with pytest.raises(SdesError, match=why.replace("^", r"\^")):
        parse_crypto(value)


def test_lifetimes_we_can_honour_and_the_window_hint_are_accepted() -> None:
    for suffix in ("|2^31", "|2^48", f"|{1 << 40}"):
        assert parse_crypto(f"1 {SUITE80} inline:{B64}{suffix}").key == KEY
    assert parse_crypto(f"1 {SUITE80} inline:{B64} WSH=128").tag == 1


def test_usable_crypto_skips_bad_lines_and_duplicate_tags() -> None:
    values = [
        f"1 AES_256_CM_HMAC_SHA1_80 inline:{B64}",
        f"2 {SUITE32} inline:{B64}",
        f"2 {SUITE80} inline:{B64}",
        f"3 {SUITE80} inline:{B64}|1:4",
        f"4 {SUITE80} inline:{B64}",
    ]
    assert [(c.tag, c.suite) for c in usable_crypto(values)] == [(2, SUITE32), (4, SUITE80)]


def test_keys_never_appear_in_reprs_and_sdp_logs_are_redacted() -> None:
    keys = SrtpKeys(SUITE80, 1, KEY, KEY)
    line = CryptoLine(1, SUITE80, KEY)
    session = SessionDescription.parse(offer("RTP/SAVP", (f"1 {SUITE80} inline:{B64}|2^31",)))
    for text in (repr(keys), repr(line), repr(session), repr(session.media[0].attributes)):
        assert B64 not in text and repr(KEY) not in text, text
    redacted = redact_sdp(session.serialize())
    assert B64 not in redacted and "inline:<redacted>" in redacted
    assert "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:<redacted>" in redacted


# -- we answer: the policy table ------------------------------------------------------------

GOOD = (f"1 {SUITE80} inline:{B64}", f"2 {SUITE32} inline:{B64}")


@pytest.mark.parametrize(
    ("policy", "proto", "crypto", "outcome"),
    [
        ("off", "RTP/AVP", (), "plain"),
        ("off", "RTP/AVP", GOOD, "plain"),  # best-effort offer: answered without crypto
        ("off", "RTP/SAVP", GOOD, "488"),  # off never runs SRTP, and cannot answer AVP to SAVP
        ("follow", "RTP/AVP", GOOD, "plain"),
        ("follow", "RTP/SAVP", GOOD, "srtp"),
        ("follow", "RTP/SAVP", (), "488"),
        ("optional", "RTP/AVP", (), "plain"),
        ("optional", "RTP/AVP", GOOD, "srtp"),
        ("optional", "RTP/SAVP", GOOD, "srtp"),
        ("optional", "RTP/SAVP", (f"1 {SUITE80} inline:{B64}|1:4",), "488"),
        ("required", "RTP/AVP", (), "488"),
        ("required", "RTP/AVP", GOOD, "srtp"),
        ("required", "RTP/SAVP", GOOD, "srtp"),
        ("required", "RTP/SAVP", (f"1 {SUITE80} inline:{B64} UNENCRYPTED_SRTP",), "488"),
    ],
)
def test_answer_table(
    policy: SrtpPolicy, proto: str, crypto: tuple[str, ...], outcome: str
) -> None:
    neg = negotiator(policy)
    remote = SessionDescription.parse(offer(proto, crypto))
    if outcome == "488":
        with pytest.raises(OfferAnswerError) as err:
            neg.create_answer(remote)
        assert err.value.warning, "an SRTP refusal carries the text of its Warning"
        return
    answer, negotiated = neg.create_answer(remote)
    m = answer.media[0]
    assert m.proto == proto  # RFC 3264 §6: the answer keeps the offer's profile
    if outcome == "plain":
        assert negotiated.srtp is None and not m.has_attribute("crypto")
        return
    assert negotiated.srtp is not None
    [value] = m.attribute_values("crypto")
    ours = parse_crypto(value)
    assert (ours.tag, ours.suite) == (1, SUITE80)  # the first offered line wins
    assert negotiated.srtp.receive_key == KEY and negotiated.srtp.send_key == ours.key
    assert ours.key != KEY


def test_a_fresh_key_for_every_answer() -> None:
    remote = SessionDescription.parse(offer("RTP/SAVP", GOOD))
    keys = {negotiator("required").create_answer(remote)[1].srtp for _ in range(5)}
    assert len({k.send_key for k in keys if k is not None}) == 5


def test_reinvite_with_the_same_line_keeps_the_session_a_new_one_rekeys() -> None:
    neg = negotiator("required")
    first_answer, first = neg.create_answer(SessionDescription.parse(offer("RTP/SAVP", GOOD)))
    assert first.srtp is not None
    same_answer, same = neg.create_answer(
        SessionDescription.parse(offer("RTP/SAVP", GOOD, version=2))
    )
    assert same.srtp == first.srtp
    assert same_answer.origin.session_version == first_answer.origin.session_version
    new_key = base64.b64encode(bytes(reversed(KEY))).decode()
    _, rekeyed = neg.create_answer(
        SessionDescription.parse(offer("RTP/SAVP", (f"1 {SUITE80} inline:{new_key}",), 3))
    )
    assert rekeyed.srtp is not None
    assert rekeyed.srtp.receive_key == bytes(reversed(KEY))
    assert rekeyed.srtp.send_key != first.srtp.send_key


def test_a_refused_reinvite_keeps_the_session() -> None:
    neg = negotiator("required")
    _, first = neg.create_answer(SessionDescription.parse(offer("RTP/SAVP", GOOD)))
    with pytest.raises(OfferAnswerError):
        neg.create_answer(SessionDescription.parse(offer("RTP/AVP", (), 2)))
    assert neg.srtp == first.srtp


# -- we offer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "proto", "lines"),
    [("off", "RTP/AVP", 0), ("optional", "RTP/AVP", 2), ("required", "RTP/SAVP", 2)],
)
def test_offers(policy: SrtpPolicy, proto: str, lines: int) -> None:
    m = negotiator(policy).create_offer().media[0]
    assert m.proto == proto
    crypto = [parse_crypto(v) for v in m.attribute_values("crypto")]
    assert len(crypto) == lines
    if lines:
        assert [(c.tag, c.suite) for c in crypto] == [(1, SUITE80), (2, SUITE32)]
        assert crypto[0].key != crypto[1].key


def answer_to(neg: SdpNegotiator, callee: SdpNegotiator) -> SessionDescription:
    made = neg.create_offer()
    answer, _ = callee.create_answer(SessionDescription.parse(made.serialize()))
    return SessionDescription.parse(answer.serialize())


@pytest.mark.parametrize(
    ("policy", "callee", "outcome"),
    [
        ("required", "required", "srtp"),
        ("required", "follow", "srtp"),
        ("optional", "optional", "srtp"),
        ("optional", "off", "plain"),  # a peer without SRTP answers the AVP offer plainly
        ("off", "optional", "plain"),
    ],
)
def test_process_answer_table(policy: SrtpPolicy, callee: SrtpPolicy, outcome: str) -> None:
    neg = negotiator(policy)
    peer = negotiator(callee)
    answer = answer_to(neg, peer)
    negotiated = neg.process_answer(answer)
    if outcome == "plain":
        assert negotiated.srtp is None
        return
    assert negotiated.srtp is not None and peer.srtp is not None
    # What we send the peer checks, and the other way round.
    assert negotiated.srtp.send_key == peer.srtp.receive_key
    assert negotiated.srtp.receive_key == peer.srtp.send_key


def test_required_fails_an_answer_without_crypto() -> None:
    neg = negotiator("required")
    neg.create_offer()
    plain = SessionDescription.parse(offer("RTP/SAVP"))
    with pytest.raises(OfferAnswerError, match="required"):
        neg.process_answer(plain)


@pytest.mark.parametrize("policy", ["optional", "required"])
def test_an_answer_with_a_tag_we_did_not_offer_fails(policy: SrtpPolicy) -> None:
    neg = negotiator(policy)
    neg.create_offer()
    wrong = SessionDescription.parse(offer("RTP/SAVP", (f"9 {SUITE80} inline:{B64}",)))
    with pytest.raises(OfferAnswerError, match="none of the offered"):
        neg.process_answer(wrong)
    neg.create_offer()
    suite = SessionDescription.parse(offer("RTP/SAVP", (f"1 {SUITE32} inline:{B64}",)))
    with pytest.raises(OfferAnswerError, match="none of the offered"):
        neg.process_answer(suite)


def test_no_key_in_the_negotiated_repr() -> None:
    _, negotiated = negotiator("required").create_answer(
        SessionDescription.parse(offer("RTP/SAVP", GOOD))
    )
    assert negotiated.srtp is not None
    text = repr(negotiated)
    assert "SrtpKeys(suite='AES_CM_128_HMAC_SHA1_80', tag=1)" in text
    assert B64 not in text and repr(KEY) not in text
    assert repr(negotiated.srtp.send_key) not in text


def test_no_key_is_logged_by_negotiation(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    neg = negotiator("required")
    neg.create_answer(SessionDescription.parse(offer("RTP/SAVP", GOOD)))
    assert B64 not in caplog.text
