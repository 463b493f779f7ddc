"""Fonoster connection signatures and X-Twilio-Signature (docs/protocol-twilio.md)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from appbridge.clock import VirtualClock
from appbridge.protocol.signing import (
    fonoster_headers,
    fonoster_signature,
    twilio_body_hash_matches,
    twilio_signature,
    twilio_url_variants,
    verify_fonoster,
    verify_twilio,
)

URL = "wss://app.example.com/session?tenant=7"
SECRET = "s3cret"
TS = 1_700_000_000

# Twilio's published test vector
TW_TOKEN = "12345"
TW_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TW_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+14158675309",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
}
TW_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="


# -- fonoster ---------------------------------------------------------------------------------


def test_fonoster_signature_is_hmac_sha256_of_timestamp_dot_url() -> None:
    expected = hmac.new(SECRET.encode(), f"{TS}.{URL}".encode(), hashlib.sha256).hexdigest()
    signature = fonoster_signature(SECRET, URL, TS)
    assert signature == expected
    assert signature == signature.lower() and len(signature) == 64


def test_fonoster_signature_known_value() -> None:
    # Fixed vector, computed independently with: printf '10.ws://x/y' | openssl sha256 -hmac s
    assert (
        fonoster_signature("s", "ws://x/y", 10)
        == "df60c654cbbbdb46a61a0ddbd4aa2759f5f733bda74267e12c60aa8f46651def"
    )


def test_fonoster_signature_covers_query_and_timestamp() -> None:
    base = fonoster_signature(SECRET, URL, TS)
    assert fonoster_signature(SECRET, URL + "&x=1", TS) != base
    assert fonoster_signature(SECRET, URL, TS + 1) != base
    assert fonoster_signature(SECRET + "x", URL, TS) != base


def test_fonoster_headers() -> None:
    headers = fonoster_headers(SECRET, URL, TS)
    assert headers == {
        "X-Fonoster-Timestamp": str(TS),
        "X-Fonoster-Signature": fonoster_signature(SECRET, URL, TS),
    }


def _headers(secret: str = SECRET, url: str = URL, ts: int = TS) -> tuple[str, str]:
    headers = fonoster_headers(secret, url, ts)
    return headers["X-Fonoster-Timestamp"], headers["X-Fonoster-Signature"]


def test_verify_fonoster_accepts_a_fresh_signature() -> None:
    clock = VirtualClock(wall_start=TS)
    ts, sig = _headers()
    assert verify_fonoster(SECRET, URL, ts, sig, now_s=clock.wall())
    clock.advance(300)
    assert verify_fonoster(SECRET, URL, ts, sig, now_s=clock.wall())  # at the edge
    clock.advance(1)
    assert not verify_fonoster(SECRET, URL, ts, sig, now_s=clock.wall())  # stale


def test_verify_fonoster_rejects_a_timestamp_from_the_future() -> None:
    ts, sig = _headers(ts=TS + 301)
    assert not verify_fonoster(SECRET, URL, ts, sig, now_s=TS)
    ts, sig = _headers(ts=TS + 300)
    assert verify_fonoster(SECRET, URL, ts, sig, now_s=TS)


def test_verify_fonoster_custom_tolerance() -> None:
    ts, sig = _headers()
    assert not verify_fonoster(SECRET, URL, ts, sig, now_s=TS + 11, tolerance_s=10)
    assert verify_fonoster(SECRET, URL, ts, sig, now_s=TS + 10, tolerance_s=10)


def test_verify_fonoster_any_of_several_secrets() -> None:
    ts, sig = _headers(secret="new")
    assert verify_fonoster(["old", "new"], URL, ts, sig, now_s=TS)
    assert verify_fonoster(("new",), URL, ts, sig, now_s=TS)
    assert not verify_fonoster(["old", "other"], URL, ts, sig, now_s=TS)
    assert not verify_fonoster([], URL, ts, sig, now_s=TS)


def test_verify_fonoster_accepts_uppercase_hex_and_surrounding_space() -> None:
    ts, sig = _headers()
    assert verify_fonoster(SECRET, URL, ts, f" {sig.upper()} ", now_s=TS)


@pytest.mark.parametrize(
    ("timestamp", "signature"),
    [
        (None, "sig"),
        ("ts", None),
        (None, None),
        ("", "x"),
        ("-1700000000", "x"),
        ("+1700000000", "x"),
        (" 1700000000", "x"),
        ("1_700_000_000", "x"),
        ("1700000000.0", "x"),
        ("\uff11\uff17", "x"),  # fullwidth digits
        ("9" * 40, "x"),
    ],
)
def test_verify_fonoster_rejects_bad_headers(timestamp: str | None, signature: str | None) -> None:
    if signature == "x":
        signature = fonoster_signature(SECRET, URL, TS)
    assert not verify_fonoster(SECRET, URL, timestamp, signature, now_s=TS)


def test_verify_fonoster_rejects_wrong_url_or_signature() -> None:
    ts, sig = _headers()
    assert not verify_fonoster(SECRET, URL + "x", ts, sig, now_s=TS)
    assert not verify_fonoster(SECRET, URL, ts, sig[:-1] + ("0" if sig[-1] != "0" else "1"), TS)
    assert not verify_fonoster(SECRET, URL, ts, "", now_s=TS)
    assert not verify_fonoster(SECRET, URL, ts, "é" * 64, now_s=TS)  # non-ASCII is no crash


# -- twilio -----------------------------------------------------------------------------------


def test_twilio_reference_vector() -> None:
    assert twilio_signature(TW_TOKEN, TW_URL, TW_PARAMS) == TW_SIGNATURE
    assert verify_twilio(TW_TOKEN, TW_URL, TW_PARAMS, TW_SIGNATURE)


def test_twilio_signature_is_base64_hmac_sha1_of_url_plus_sorted_pairs() -> None:
    data = TW_URL + "".join(f"{k}{TW_PARAMS[k]}" for k in sorted(TW_PARAMS))
    expected = base64.b64encode(
        hmac.new(TW_TOKEN.encode(), data.encode(), hashlib.sha1).digest()
    ).decode()
    assert twilio_signature(TW_TOKEN, TW_URL, dict(reversed(TW_PARAMS.items()))) == expected


def test_twilio_multi_valued_params_are_sorted_per_name() -> None:
    url = "https://gw.example/twilio/voice"
    manual = base64.b64encode(
        hmac.new(b"tok", (url + "Aa1Bb1Bb2Bb3").encode(), hashlib.sha1).digest()
    ).decode()
    params = {"Bb": ["3", "1", "2"], "Aa": "1"}
    assert twilio_signature("tok", url, params) == manual
    assert verify_twilio("tok", url, {"Aa": ["1"], "Bb": ("2", "3", "1")}, manual)


def test_twilio_empty_params_sign_the_url_alone() -> None:
    url = "wss://gw.example/twilio/stream"
    expected = base64.b64encode(hmac.new(b"tok", url.encode(), hashlib.sha1).digest()).decode()
    assert twilio_signature("tok", url, None) == expected
    assert twilio_signature("tok", url, {}) == expected
    assert verify_twilio("tok", url, None, expected)


@pytest.mark.parametrize(
    ("signed_url", "checked_url"),
    [
        ("https://mycompany.com:443/myapp.php?foo=1&bar=2", TW_URL),
        (TW_URL, "https://mycompany.com:443/myapp.php?foo=1&bar=2"),
        ("http://h.example/x", "http://h.example:80/x"),
        ("http://h.example:80/x", "http://h.example/x"),
        ("wss://h.example/twilio/stream", "wss://h.example:443/twilio/stream"),
        ("https://u:p@h.example:443/x", "https://u:p@h.example/x"),
        ("https://[2001:db8::1]/x", "https://[2001:db8::1]:443/x"),
    ],
)
def test_verify_twilio_accepts_default_port_added_or_removed(
    signed_url: str, checked_url: str
) -> None:
    signature = twilio_signature(TW_TOKEN, signed_url, TW_PARAMS)
    assert verify_twilio(TW_TOKEN, checked_url, TW_PARAMS, signature)


def test_verify_twilio_keeps_non_default_ports_distinct() -> None:
    signature = twilio_signature(TW_TOKEN, "https://h.example:8443/x", None)
    assert not verify_twilio(TW_TOKEN, "https://h.example/x", None, signature)
    assert not verify_twilio(TW_TOKEN, "https://h.example:443/x", None, signature)
    assert twilio_url_variants("https://h.example:8443/x") == ["https://h.example:8443/x"]
    # http's default is 80, not 443
    signature = twilio_signature(TW_TOKEN, "http://h.example:443/x", None)
    assert not verify_twilio(TW_TOKEN, "http://h.example/x", None, signature)


def test_verify_twilio_rejections() -> None:
    assert not verify_twilio(TW_TOKEN, TW_URL, TW_PARAMS, None)
    assert not verify_twilio(TW_TOKEN, TW_URL, TW_PARAMS, "")
    assert not verify_twilio("54321", TW_URL, TW_PARAMS, TW_SIGNATURE)
    assert not verify_twilio(TW_TOKEN, TW_URL, {**TW_PARAMS, "Digits": "1235"}, TW_SIGNATURE)
    assert not verify_twilio(TW_TOKEN, TW_URL + "&x=1", TW_PARAMS, TW_SIGNATURE)
    assert not verify_twilio(TW_TOKEN, TW_URL, TW_PARAMS, "ü" + TW_SIGNATURE[1:])
    assert not verify_twilio(TW_TOKEN, "https://[bad/x", TW_PARAMS, TW_SIGNATURE)


def test_twilio_body_hash() -> None:
    body = b'{"a":1}'
    digest = hashlib.sha256(body).hexdigest()
    assert twilio_body_hash_matches(f"https://h/x?bodySHA256={digest}", body)
    assert not twilio_body_hash_matches(f"https://h/x?bodySHA256={digest}", body + b" ")
    assert not twilio_body_hash_matches("https://h/x", body)
    assert not twilio_body_hash_matches(f"https://h/x?bodySHA256={digest}&bodySHA256=0", body)
