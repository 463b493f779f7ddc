"""Digest authentication against the RFC 2617 and RFC 7616 test vectors."""

from __future__ import annotations

import hashlib

import pytest

from appbridge.carriers.sip.auth_header import AuthHeader
from appbridge.carriers.sip.digest import (
    DigestChallenge,
    DigestError,
    authorization,
    digest_response,
)
from appbridge.carriers.sip.message import Request, make_response, parse_message

# RFC 7616 §3.9.1
RFC7616_NONCE = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v"
RFC7616_CNONCE = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
RFC7616_OPAQUE = "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"


def test_rfc2617_section_3_5_vector() -> None:
    response = digest_response(
        algorithm="MD5",
        username="Mufasa",
        realm="testrealm@host.com",
        password="Circle Of Life",
        method="GET",
        uri="/dir/index.html",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        qop="auth",
        nc="00000001",
        cnonce="0a4f113b",
    )
    assert response == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc7616_section_3_9_1_vectors(algorithm: str, expected: str) -> None:
    challenge = DigestChallenge.parse(
        f'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm={algorithm}, '
        f'nonce="{RFC7616_NONCE}", opaque="{RFC7616_OPAQUE}"'
    )
    assert challenge.qop == ("auth", "auth-int") and challenge.algorithm == algorithm
    name, value = authorization(
        challenge,
        username="Mufasa",
        password="Circle of Life",
        method="GET",
        uri="/dir/index.html",
        cnonce=RFC7616_CNONCE,
    )
    assert name == "Authorization"
    header = AuthHeader.parse(value)
    assert header.scheme == "Digest"
    assert header.get("response") == expected
    assert header.get("username") == "Mufasa" and header.get("realm") == "http-auth@example.org"
    assert header.get("uri") == "/dir/index.html" and header.get("nonce") == RFC7616_NONCE
    assert header.get("opaque") == RFC7616_OPAQUE and header.get("cnonce") == RFC7616_CNONCE
    assert header.get("qop") == "auth" and header.get("nc") == "00000001"
    assert header.get("algorithm") == algorithm
    # qop, nc and algorithm are tokens on the wire (RFC 7616 §3.4).
    assert f"algorithm={algorithm}," in value and "qop=auth," in value and "nc=00000001," in value


def test_no_qop_and_sess_variants() -> None:
    common = {
        "username": "u",
        "realm": "r",
        "password": "p",
        "method": "INVITE",
        "uri": "sip:x@y",
        "nonce": "n",
        "nc": "00000001",
        "cnonce": "c",
    }

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    ha1, ha2 = md5("u:r:p"), md5("INVITE:sip:x@y")
    assert digest_response(algorithm="MD5", qop=None, **common) == md5(f"{ha1}:n:{ha2}")
    sess = md5(f"{ha1}:n:c")
    assert digest_response(algorithm="MD5-sess", qop="auth", **common) == md5(
        f"{sess}:n:00000001:c:auth:{ha2}"
    )
    body = b"v=0\r\n"
    ha2_int = md5(f"INVITE:sip:x@y:{hashlib.md5(body).hexdigest()}")
    assert digest_response(algorithm="MD5", qop="auth-int", body=body, **common) == md5(
        f"{ha1}:n:00000001:c:auth-int:{ha2_int}"
    )


def trunk_invite() -> Request:
    invite = parse_message(
        b"INVITE sip:+15550001111@trunk.example SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP 192.0.2.10;branch=z9hG4bKd1\r\n"
        b"From: <sip:gw@192.0.2.10>;tag=1\r\nTo: <sip:+15550001111@trunk.example>\r\n"
        b"Call-ID: d@192.0.2.10\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
    assert isinstance(invite, Request)
    return invite


def test_challenge_from_401_and_407() -> None:
    invite = trunk_invite()
    unauthorized = make_response(
        invite,
        401,
        headers=[
            ("WWW-Authenticate", 'Digest realm="trunk", nonce="n1", algorithm=MD5, qop="auth"'),
            ("WWW-Authenticate", 'Digest realm="trunk", nonce="n2", algorithm=SHA-256'),
            ("WWW-Authenticate", 'Basic realm="nope"'),
        ],
    )
    best = DigestChallenge.from_response(unauthorized)
    assert (best.algorithm, best.nonce, best.proxy) == ("SHA-256", "n2", False)
    assert "n2" not in repr(best)  # repr shows no nonce, never a secret
    name, value = authorization(
        best, username="gw", password="pw", method="INVITE", uri=str(invite.uri), cnonce="x"
    )
    assert name == "Authorization" and "qop" not in value and "cnonce" not in value
    proxy = make_response(
        invite,
        407,
        headers=[("Proxy-Authenticate", 'Digest realm="edge", nonce="p1", stale=TRUE')],
    )
    challenge = DigestChallenge.from_response(proxy)
    assert challenge.proxy and challenge.stale and challenge.algorithm == "MD5"
    name, value = authorization(
        challenge, username="gw", password="pw", method="INVITE", uri=str(invite.uri), nc=2
    )
    assert name == "Proxy-Authorization"
    assert AuthHeader.parse(value).get("response") == digest_response(
        algorithm="MD5",
        username="gw",
        realm="edge",
        password="pw",
        method="INVITE",
        uri=str(invite.uri),
        nonce="p1",
        qop=None,
        nc="00000002",
        cnonce="",
    )


def test_userhash() -> None:
    challenge = DigestChallenge.parse(
        'Digest realm="api", nonce="n", algorithm=SHA-256, qop="auth", userhash=true'
    )
    _, value = authorization(challenge, username="Jason", password="p", method="GET", uri="/")
    header = AuthHeader.parse(value)
    assert header.get("userhash") == "true"
    assert header.get("username") == hashlib.sha256(b"Jason:api").hexdigest()


@pytest.mark.parametrize(
    "value",
    [
        'Basic realm="x"',
        'Digest nonce="n"',
        'Digest realm="r"',
        'Digest realm="r", nonce="n", algorithm=SHA-512-256',
        'Digest realm="r", nonce="n',
    ],
)
def test_unusable_challenges(value: str) -> None:
    with pytest.raises(DigestError):
        DigestChallenge.parse(value)


def test_response_without_usable_challenge() -> None:
    invite = trunk_invite()
    with pytest.raises(DigestError):
        DigestChallenge.from_response(make_response(invite, 401))
