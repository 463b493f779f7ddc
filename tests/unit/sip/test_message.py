"""SIP header values, message parse/serialise, framing, responses, rport, numbers."""

from __future__ import annotations

import pytest

from appbridge.carriers.sip.auth_header import AuthHeader, format_auth
from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.header_values import (
    CSeq,
    parse_content_length,
    parse_max_forwards,
)
from appbridge.carriers.sip.headers import (
    NameAddr,
    SipParseError,
    SipUri,
    Via,
    canonical_name,
    split_list,
)
from appbridge.carriers.sip.message import (
    MAX_MESSAGE_BYTES,
    Headers,
    Request,
    Response,
    apply_received,
    make_response,
    new_branch,
    parse_message,
    response_address,
)
from appbridge.carriers.sip.numbers import (
    called_number,
    caller_number,
    from_address_number,
    number_from_uri,
    sanitize_user_part,
    to_header_number,
)

INVITE = (
    b"INVITE sip:+15550002222@gw.example.com SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 198.51.100.7:5060;branch=z9hG4bKabc;rport\r\n"
    b"Max-Forwards: 70\r\n"
    b'From: "Ann" <sip:+15551230001@trunk.example>;tag=from1\r\n'
    b"To: <sip:+15550002222@gw.example.com>\r\n"
    b"Call-ID: call-1@198.51.100.7\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"Contact: <sip:ann@198.51.100.7:5060>\r\n"
    b"Record-Route: <sip:p1.example;lr>, <sip:p2.example;lr>\r\n"
    b"Content-Type: application/sdp\r\n"
    b"Content-Length: 4\r\n"
    b"\r\n"
    b"v=0\n"
)


def invite() -> Request:
    m = parse_message(INVITE)
    assert isinstance(m, Request)
    return m


# --- URIs ------------------------------------------------------------------------------------


def test_sip_uri_components_and_round_trip() -> None:
    text = "sips:alice:secret@[2001:db8::1]:5061;transport=tcp;lr?subject=hi&x=%20"
    uri = SipUri.parse(text)
    assert (uri.scheme, uri.user, uri.password) == ("sips", "alice", "secret")
    assert (uri.host, uri.port) == ("[2001:db8::1]", 5061)
    assert uri.param("TRANSPORT") == "tcp" and uri.has_param("lr") and uri.param("lr") is None
    assert uri.headers == "subject=hi&x=%20"
    assert str(uri) == text
    assert str(uri.with_param("transport", "udp")).startswith("sips:alice:secret@[2001:db8::1]")


def test_tel_and_opaque_uris() -> None:
    tel = SipUri.parse("tel:+1-555-123-4567;phone-context=example.com")
    assert (tel.scheme, tel.user, tel.param("phone-context")) == (
        "tel",
        "+1-555-123-4567",
        "example.com",
    )
    assert str(tel) == "tel:+1-555-123-4567;phone-context=example.com"
    other = SipUri.parse("urn:service:sos")
    assert (other.scheme, other.opaque, str(other)) == ("urn", "service:sos", "urn:service:sos")


@pytest.mark.parametrize(
    "text",
    [
        "sip:user@exa mple.com",
        "sip:user@example.com:99999",
        "sip:us%zzer@example.com",
        "sip:@example.com",
        "sip:user@",
        "sip:user@example.com;",
        "sip:user@example.com;a;;b",
        "sip:user@example.com?noequals",
        "tel:+1 555",
        "nocolon",
        "sip:user@[::1",
        "<sip:user@example.com>",
    ],
)
def test_bad_uris_are_rejected(text: str) -> None:
    with pytest.raises(SipParseError):
        SipUri.parse(text)


# --- name-addr, Via, CSeq, scalars -------------------------------------------------------------


def test_name_addr_forms() -> None:
    quoted = NameAddr.parse('"A \\"B\\" C" <sip:a@x.example;user=phone> ;tag=7 ; q=0.5')
    assert quoted.display_name == 'A "B" C' and quoted.tag == "7" and quoted.param("q") == "0.5"
    assert quoted.uri.param("user") == "phone"
    assert str(quoted) == '"A \\"B\\" C" <sip:a@x.example;user=phone>;tag=7;q=0.5'
    tokens = NameAddr.parse("Bob  Smith<sip:b@x.example>")
    assert tokens.display_name == "Bob  Smith" and str(tokens) == '"Bob  Smith" <sip:b@x.example>'
    bare = NameAddr.parse("sip:c@x.example;tag=9")
    assert bare.display_name is None and bare.tag == "9" and bare.uri.params == ()
    assert NameAddr.parse("*").star
    assert str(bare.with_param("tag", "10").without_params()) == "<sip:c@x.example>"


@pytest.mark.parametrize(
    "text",
    [
        '"unterminated <sip:a@x.example>',
        "<sip:a@x.example",
        "<sip:a@x.example>;;tag=1",
        "<sip:a@x.example>;tag=",
        "<sip:a@x.example> junk",
        "Bad, Name <sip:a@x.example>",
        '"Quoted" sip:a@x.example',
        "sip:a@x.example?h=v",
        "< sip:a@x.example>",
    ],
)
def test_bad_name_addrs_are_rejected(text: str) -> None:
    with pytest.raises(SipParseError):
        NameAddr.parse(text)


def test_via_parsing_and_rport_states() -> None:
    via = Via.parse("SIP/2.0/udp [2001:db8::9]:5070;branch=z9hG4bK1;rport;received=192.0.2.1")
    assert (via.transport, via.host, via.port) == ("UDP", "[2001:db8::9]", 5070)
    assert via.sent_by == "[2001:db8::9]:5070" and via.rport == "" and via.received == "192.0.2.1"
    assert Via.parse("SIP/2.0/TCP h.example").rport is None
    assert Via.parse("SIP/2.0/UDP h;rport=5000").rport == "5000"
    assert str(via.with_param("rport", "7000")).endswith(";rport=7000;received=192.0.2.1")
    assert len(Via.parse_list("SIP/2.0/UDP a;branch=1, SIP/2.0/TCP b:5061;branch=2")) == 2
    for bad in ("SIP/2.0 host", "SIP/2.0/UDP", "SIP/2.0/UDP h;ttl=300", "SIP/2.0/UDP h;rport=x"):
        with pytest.raises(SipParseError):
            Via.parse(bad)
    with pytest.raises(SipParseError):
        Via.parse_list("SIP/2.0/UDP a,,SIP/2.0/UDP b")


def test_scalars_and_limits() -> None:
    assert CSeq.parse("4294967295 INVITE") == CSeq(4294967295, "INVITE")
    for bad in ("4294967296 INVITE", "1", "-1 INVITE", "1 INV ITE", "x INVITE"):
        with pytest.raises(SipParseError):
            CSeq.parse(bad)
    assert parse_max_forwards(" 0 ") == 0 and parse_max_forwards("255") == 255
    assert parse_content_length("0042") == 42
    for bad_mf in ("256", "-1", "", "1e2", "٣"):
        with pytest.raises(SipParseError):
            parse_max_forwards(bad_mf)
    for bad_cl in ("-5", "+5", "five", "", "99999999999"):
        with pytest.raises(SipParseError):
            parse_content_length(bad_cl)


def test_split_list_respects_quotes_and_brackets() -> None:
    assert split_list('"a, b" <sip:x;p=1,2>, <sip:y>') == ['"a, b" <sip:x;p=1,2>', "<sip:y>"]
    with pytest.raises(SipParseError):
        split_list('"open, <sip:x>')


def test_auth_header_round_trip() -> None:
    value = 'Digest realm="sip.example", nonce="a,b=c", qop="auth,auth-int", algorithm=MD5'
    header = AuthHeader.parse(value)
    assert header.scheme == "Digest"
    assert header.get("NONCE") == "a,b=c" and header.get("qop") == "auth,auth-int"
    assert dict(header)["algorithm"] == "MD5"
    out = format_auth("Digest", [("realm", "r", True), ("nc", "00000001", False)])
    assert out == 'Digest realm="r", nc=00000001'
    for bad in ('Digest realm="open', "Digest realm", "Digest =x", 'Digest a="1" b="2"'):
        with pytest.raises(SipParseError):
            AuthHeader.parse(bad)


# --- headers and messages -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("short", "long"),
    [
        ("i", "Call-ID"),
        ("m", "Contact"),
        ("f", "From"),
        ("t", "To"),
        ("v", "Via"),
        ("l", "Content-Length"),
        ("c", "Content-Type"),
        ("k", "Supported"),
        ("s", "Subject"),
        ("call-id", "Call-ID"),
        ("CSEQ", "CSeq"),
        ("www-authenticate", "WWW-Authenticate"),
        ("X-Custom", "X-Custom"),
    ],
)
def test_compact_and_canonical_names(short: str, long: str) -> None:
    assert canonical_name(short) == long


def test_headers_container() -> None:
    h = Headers([("v", "SIP/2.0/UDP a"), ("X-A", "1"), ("Via", "SIP/2.0/UDP b, SIP/2.0/UDP c")])
    assert h.get("VIA") == "SIP/2.0/UDP a" and "via" in h and "Route" not in h
    assert h.values("Via") == ["SIP/2.0/UDP a", "SIP/2.0/UDP b", "SIP/2.0/UDP c"]
    h.replace_first("Via", "SIP/2.0/UDP z")
    h.prepend("Via", "SIP/2.0/TCP top")
    assert [n for n, _ in h] == ["Via", "Via", "X-A", "Via"]
    h.set("via", "only")
    assert list(h) == [("Via", "only"), ("X-A", "1")]
    h.remove("x-a")
    assert len(h) == 1 and len(h.copy()) == 1


def test_parse_invite_and_typed_access() -> None:
    m = invite()
    assert m.method == "INVITE" and m.uri.user == "+15550002222"
    assert m.top_via.branch == "z9hG4bKabc" and m.top_via.rport == ""
    assert m.from_.display_name == "Ann" and m.from_.tag == "from1" and m.to.tag is None
    assert m.call_id == "call-1@198.51.100.7" and m.cseq == CSeq(1, "INVITE")
    assert [r.uri.host for r in m.record_routes] == ["p1.example", "p2.example"]
    assert m.max_forwards == 70 and m.content_type == "application/sdp" and m.body == b"v=0\n"
    assert repr(m) == "<Request INVITE sip:+15550002222@gw.example.com>"


def test_lenient_framing_of_lf_only_and_leading_crlf() -> None:
    lf = b"\r\n\r\n" + INVITE.replace(b"\r\n", b"\n")
    m = parse_message(lf)
    assert isinstance(m, Request) and m.call_id == "call-1@198.51.100.7"
    assert m.body == b"v=0\n"


def test_serialize_fixes_content_length_and_expands_compact_names() -> None:
    m = parse_message(INVITE.replace(b"Call-ID:", b"i:").replace(b"Content-Length: 4", b"l: 4"))
    m.body = b"v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\n"
    wire = m.serialize()
    assert b"\r\nCall-ID: call-1@198.51.100.7\r\n" in wire
    assert f"\r\nContent-Length: {len(m.body)}\r\n".encode() in wire
    assert wire.endswith(b"\r\n\r\n" + m.body)
    assert bytes(m) == wire
    bare = Request("OPTIONS", SipUri.parse("sip:x.example"), [("CSeq", "1 OPTIONS")])
    assert bare.serialize().endswith(b"CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n")


def test_latin1_octets_survive_a_round_trip() -> None:
    data = INVITE.replace(b'"Ann"', b'"M\xfcller"')
    m = parse_message(data)
    assert m.serialize() == data


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (INVITE.replace(b"Max-Forwards: 70\r\n", b"Max-Forwards 70\r\n"), "Malformed header line"),
        (INVITE.replace(b"CSeq: 1 INVITE\r\n", b""), "Missing CSeq header"),
        (INVITE.replace(b"Content-Length: 4", b"Content-Length: 40"), "Content-Length larger"),
        (INVITE.replace(b"Record-Route: <", b"Record-Route: "), "Malformed Record-Route"),
        (INVITE.replace(b"\r\n\r\n", b"\r\n"), "Incomplete header section"),
    ],
)
def test_malformed_requests(data: bytes, reason: str) -> None:
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    assert caught.value.reason.startswith(reason)
    assert caught.value.status == 400


def test_request_line_errors_still_allow_a_400() -> None:
    with pytest.raises(SipParseError) as caught:
        parse_message(INVITE.replace(b"INVITE sip:", b"INVITE  sip:", 1))
    error = caught.value
    assert error.can_respond and isinstance(error.message, Request)
    assert error.message.method == "INVITE"
    response = make_response(error.message, 400, error.reason)
    assert response.headers.get("Call-ID") == "call-1@198.51.100.7"


def test_no_answer_to_a_bad_ack_or_a_bad_response() -> None:
    ack = INVITE.replace(b"INVITE sip:", b"ACK sip:").replace(b"1 INVITE", b"1 ACK")
    with pytest.raises(SipParseError) as caught:
        parse_message(ack.replace(b"Record-Route: <", b"Record-Route: "))
    assert not caught.value.can_respond
    with pytest.raises(SipParseError) as caught:
        parse_message(b"SIP/2.0 99 Odd\r\nVia: SIP/2.0/UDP h\r\nCSeq: 1 X\r\n\r\n")
    assert not caught.value.can_respond and caught.value.message is None


def test_datagram_over_the_limit_is_too_large() -> None:
    big = INVITE.replace(b"Content-Length: 4", f"Content-Length: {MAX_MESSAGE_BYTES}".encode())
    with pytest.raises(SipParseError) as caught:
        parse_message(big + b"x" * MAX_MESSAGE_BYTES)
    assert (caught.value.status, caught.value.kind) == (513, "too_large")


def test_stream_parse_requires_exact_content_length() -> None:
    assert parse_message(INVITE, datagram=False).body == b"v=0\n"
    with pytest.raises(SipParseError):
        parse_message(INVITE.replace(b"Content-Length: 4\r\n", b""), datagram=False)
    without = parse_message(INVITE.replace(b"Content-Length: 4\r\n", b""))
    assert without.body == b"v=0\n"  # §18.3: on a datagram the body runs to the end


# --- responses and rport --------------------------------------------------------------------------


def test_make_response_copies_and_tags() -> None:
    m = invite()
    m.headers.add("Via", "SIP/2.0/UDP second.example;branch=z9hG4bK2")
    contact = [("Contact", "<sip:gw@192.0.2.10>")]
    ok = make_response(
        m, 200, to_tag="gw", headers=contact, body=b"v=0\r\n", content_type="application/sdp"
    )
    assert ok.reason == "OK"
    assert ok.headers.get_all("Via") == m.headers.get_all("Via")
    assert ok.headers.get_all("Record-Route") == m.headers.get_all("Record-Route")
    assert ok.to.tag == "gw" and ok.from_.tag == "from1" and ok.cseq == m.cseq
    assert ok.headers.get("Content-Type") == "application/sdp"
    again = parse_message(ok.serialize())
    assert isinstance(again, Response) and again.status == 200 and again.body == b"v=0\r\n"
    trying = make_response(m, 100, to_tag="gw")
    assert trying.to.tag is None and trying.reason == "Trying"
    assert (
        "Record-Route" not in trying.headers and "Record-Route" not in make_response(m, 486).headers
    )
    assert make_response(m, 299).reason == ""
    m.headers.set("To", "<sip:x@y>;tag=old")
    assert make_response(m, 486, to_tag="new").to.tag == "old"


def test_apply_received_follows_rfc_3581() -> None:
    m = invite()
    apply_received(m, "203.0.113.5", 40000)
    top = m.top_via
    assert (top.received, top.rport) == ("203.0.113.5", "40000")
    assert response_address(top) == ("203.0.113.5", 40000)
    assert next(iter(m.headers))[0] == "Via"

    plain = parse_message(INVITE.replace(b";rport", b""))
    assert isinstance(plain, Request)
    apply_received(plain, "198.51.100.7", 5060)  # same host: nothing to add (§18.2.1)
    assert plain.top_via.received is None
    assert response_address(plain.top_via) == ("198.51.100.7", 5060)
    apply_received(plain, "203.0.113.9", 6000)
    assert plain.top_via.received == "203.0.113.9" and plain.top_via.rport is None
    assert response_address(plain.top_via) == ("203.0.113.9", 5060)

    two = parse_message(INVITE.replace(b";rport", b";rport, SIP/2.0/UDP inner.example"))
    assert isinstance(two, Request)
    apply_received(two, "203.0.113.5", 1234)
    assert [v.host for v in two.vias] == ["198.51.100.7", "inner.example"]
    assert response_address(Via.parse("SIP/2.0/UDP h:5070;maddr=224.0.0.1")) == ("224.0.0.1", 5070)


def test_new_branch_has_magic_cookie() -> None:
    a, b = new_branch(), new_branch()
    assert a.startswith("z9hG4bK") and a != b


# --- stream framing -------------------------------------------------------------------------------


def test_framer_splits_and_reassembles() -> None:
    framer = SipStreamFramer()
    stream = b"\r\n\r\n" + INVITE + INVITE + b"\r\n"
    out: list[bytes | SipParseError] = []
    for i in range(len(stream)):
        out += framer.feed(stream[i : i + 1])
    assert out == [INVITE, INVITE]
    assert framer.pending == 0
    assert framer.feed(INVITE * 3) == [INVITE] * 3


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (INVITE.replace(b"Content-Length: 4\r\n", b""), "Missing Content-Length"),
        (INVITE.replace(b"Content-Length: 4", b"Content-Length: 4\r\nl: 4"), "Multiple"),
        (INVITE.replace(b"Content-Length: 4", b"Content-Length: four"), "Malformed Content"),
    ],
)
def test_framer_errors_are_fatal(data: bytes, reason: str) -> None:
    framer = SipStreamFramer()
    (error,) = framer.feed(data + INVITE)
    assert isinstance(error, SipParseError) and error.reason.startswith(reason)
    assert error.fatal and error.kind == "framing" and error.can_respond
    assert framer.broken and framer.pending == 0


def test_framer_answers_513_over_the_limit() -> None:
    framer = SipStreamFramer()
    big = INVITE.replace(b"Content-Length: 4", f"Content-Length: {MAX_MESSAGE_BYTES}".encode())
    (error,) = framer.feed(big)
    assert isinstance(error, SipParseError)
    assert (error.status, error.kind, error.fatal, error.can_respond) == (
        513,
        "too_large",
        True,
        True,
    )
    endless = SipStreamFramer(max_size=1000)
    (error2,) = endless.feed(b"INVITE sip:x SIP/2.0\r\nX: " + b"a" * 1200)
    assert isinstance(error2, SipParseError) and error2.status == 513 and error2.message is None


def test_framer_keeps_a_bad_but_framed_message_for_the_parser() -> None:
    framer = SipStreamFramer()
    bad = INVITE.replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE")
    chunks = framer.feed(bad + INVITE)
    assert chunks == [bad, INVITE] and not framer.broken
    first = chunks[0]
    assert isinstance(first, bytes)
    with pytest.raises(SipParseError) as caught:
        parse_message(first, datagram=False)
    assert caught.value.can_respond and not caught.value.fatal


# --- numbers (docs/sip.md, "Inbound calls") -------------------------------------------------------


def test_numbers_from_invite() -> None:
    m = invite()
    assert caller_number(m) == "+15551230001"
    assert called_number(m) == "+15550002222"
    assert to_header_number(m) == "+15550002222"


@pytest.mark.parametrize(
    ("uri", "number"),
    [
        ("sip:+15551230001@trunk.example", "+15551230001"),
        ("sips:alice@x.example", "alice"),
        ("sip:%2B1555%23123@x.example", "+1555#123"),
        ("sip:+15551230001;npdi;rn=+1555@x.example;user=phone", "+15551230001"),
        ("sip:+15551230001;npdi@x.example", None),
        ("tel:+1-555-123-4567;phone-context=x", "+1-555-123-4567"),
        ("sip:x.example", None),
        ("sip:ann%20smith@x.example", None),
        ("sip:ann%0d%0aX@x.example", None),
        ("sip:" + "1" * 64 + "@x.example", "1" * 64),
        ("sip:" + "1" * 65 + "@x.example", None),
        ("http://x.example/", None),
    ],
)
def test_number_sanitising(uri: str, number: str | None) -> None:
    assert number_from_uri(SipUri.parse(uri)) == number


def test_sanitize_edge_cases() -> None:
    assert sanitize_user_part(None) is None and sanitize_user_part("") is None
    assert sanitize_user_part("*21#") == "*21#" and sanitize_user_part("a:b") is None
    assert sanitize_user_part("\u0661\u0662") is None  # non-ASCII digits are not 0-9
    assert from_address_number('"X" <tel:+15550001111>;tag=1') == "+15550001111"
    assert from_address_number("not an address <") is None
