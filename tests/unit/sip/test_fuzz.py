"""Hypothesis: arbitrary and mutated input never raises anything but SipParseError."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appbridge.carriers.sip.auth_header import AuthHeader
from appbridge.carriers.sip.digest import DigestChallenge, DigestError
from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.header_values import (
    CSeq,
)
from appbridge.carriers.sip.headers import (
    NameAddr,
    SipParseError,
    SipUri,
    Via,
    split_list,
)
from appbridge.carriers.sip.message import (
    Request,
    Response,
    make_response,
    parse_message,
)
from appbridge.carriers.sip.numbers import number_from_uri
from tests.unit.sip.test_torture import INVALID, SEMANTIC, VALID

SEEDS = [data for _, data in VALID.values()] + [
    data for _, data, _ in (*INVALID.values(), *SEMANTIC.values())
]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIAL = b' \t\r\n;,:"<>=%@?&/\\[]()*+#.-0123456789'


def check(data: bytes, *, datagram: bool = True) -> None:
    """The parser's whole contract on one input."""
    try:
        message = parse_message(data, datagram=datagram)
    except SipParseError as error:
        assert error.status in (400, 505, 513)
        assert error.reason and "\r" not in error.reason and "\n" not in error.reason
        if error.can_respond:
            assert isinstance(error.message, Request)
            make_response(error.message, error.status, error.reason, to_tag="t").serialize()
        return
    # Whatever parsed can be read and written again, identically.
    message.vias, message.from_, message.to, message.call_id, message.cseq  # noqa: B018
    message.contacts, message.routes, message.record_routes, message.max_forwards  # noqa: B018
    again = parse_message(message.serialize())
    assert type(again) is type(message) and again.body == message.body

    def fields(m: Request | Response) -> list[tuple[str, str]]:
        return [(n, v) for n, v in m.headers if n != "Content-Length"]  # always (re)written

    assert fields(again) == fields(message)


@FUZZ
@given(st.binary(max_size=1500))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)
    check(data, datagram=False)


@FUZZ
@given(st.binary(max_size=600))
def test_arbitrary_header_section_after_a_valid_request_line(data: bytes) -> None:
    check(b"INVITE sip:a@b.example SIP/2.0\r\n" + data + b"\r\n\r\n")
    check(b"SIP/2.0 200 OK\r\n" + data + b"\r\n\r\n")


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "special", "insert", "delete", "dup", "truncate"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == "special":
            data[pos:pos] = bytes([draw(st.sampled_from(SPECIAL))])
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "dup":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 64))]
        else:
            del data[pos:]
    return bytes(data)


@FUZZ
@given(mutated())
def test_mutated_torture_messages(data: bytes) -> None:
    check(data)
    check(data, datagram=False)


TEXT = st.text(
    alphabet=st.sampled_from(list(" \t;,:\"<>=%@?&/\\[]()*+#.-_~!`'aZ09sip")), max_size=80
)


@FUZZ
@given(TEXT | st.text(max_size=80))
def test_header_value_parsers(text: str) -> None:
    for parse in (SipUri.parse, NameAddr.parse, Via.parse, Via.parse_list, CSeq.parse):
        try:
            parsed = parse(text)
        except SipParseError:
            continue
        for value in parsed if isinstance(parsed, list) else [parsed]:
            assert type(value).parse(str(value)) == value  # canonical form is stable
            if isinstance(value, SipUri):
                number_from_uri(value)
    for other in (AuthHeader.parse, split_list):
        try:
            other(text)
        except SipParseError:
            pass
    try:
        DigestChallenge.parse(text)
    except DigestError:
        pass


FRAMEABLE = [d for _, d in VALID.values()]


@FUZZ
@given(st.lists(st.sampled_from(FRAMEABLE)), st.lists(st.integers(1, 400), max_size=30))
def test_framer_reassembles_any_chunking(messages: list[bytes], cuts: list[int]) -> None:
    framed = [parse_message(m) for m in messages]
    stream = b"".join(m.serialize() for m in framed)
    framer = SipStreamFramer()
    out: list[bytes | SipParseError] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        out += framer.feed(stream[pos : pos + cut])
        pos += cut
    out += framer.feed(stream[pos:])
    assert out == [m.serialize() for m in framed]


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_framer_never_raises(chunks: list[bytes]) -> None:
    framer = SipStreamFramer(max_size=2048)
    for chunk in chunks:
        for item in framer.feed(chunk):
            if isinstance(item, bytes):
                check(item, datagram=False)
            else:
                assert item.fatal and framer.broken


def test_adversarial_inputs_stay_fast() -> None:
    """Inputs shaped against backtracking regexes, near the 64 KiB limit."""
    n = 20_000
    base = (
        b"INVITE sip:a@b.example SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP h;branch=z9hG4bK1\r\nCSeq: 1 INVITE\r\n"
    )
    for header in (
        b"From: " + b"a " * n + b"!",
        b"From: " + b"a" * (2 * n) + b"<",
        b"To: " + b'"' + b"\\a" * n,
        b"Contact: " + b"<sip:a@b>;" * (n // 10),
        b"Via: SIP/2.0/UDP " + b"a." * n + b"!",
        b"Route: " + b"<sip:x>," * (n // 8),
        b"Call-ID: " + b"@" * n,
    ):
        check(base + header + b"\r\n\r\n")
