"""Signature checks of the SDK server, error classes, and decoding of frames from the gateway.

Signatures are computed here with hmac directly (docs/protocol-session-v1.md, "Connection and
frames"), not with the code under test, so a symmetric bug cannot pass.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from appbridge.protocol.session_v1 import ErrorEvent, SessionEnd
from appbridge.sdk import errors
from appbridge.sdk.events import AudioFrame
from appbridge.sdk.inbound import decode_frame
from appbridge.sdk.verification import Verifier, request_url

NOW = 1_700_000_000
URL = "ws://127.0.0.1:9000/session?tenant=7"


def signed(secret: str, url: str = URL, ts: int = NOW) -> dict[str, str]:
    mac = hmac.new(secret.encode(), f"{ts}.{url}".encode(), hashlib.sha256).hexdigest()
    return {"X-Fonoster-Timestamp": str(ts), "X-Fonoster-Signature": mac}


def verifier(secrets: str | list[str] | None, **kw: object) -> Verifier:
    return Verifier(secrets, wall_clock=lambda: NOW, **kw)  # type: ignore[arg-type]


def test_a_good_signature_over_the_exact_url_passes() -> None:
    assert verifier("s3cret").check(URL, signed("s3cret")) is None


def test_wrong_secret_url_or_missing_headers_are_refused() -> None:
    v = verifier("s3cret")
    assert v.check(URL, signed("other")) is not None
    assert v.check(URL.replace("tenant=7", "tenant=8"), signed("s3cret")) is not None
    assert v.check(URL, {}) == "missing signing headers"
    headers = signed("s3cret")
    headers["X-Fonoster-Signature"] = headers["X-Fonoster-Signature"][:-1] + "0"
    assert v.check(URL, headers) is not None


@pytest.mark.parametrize(("skew_s", "ok"), [(-300, True), (300, True), (-301, False), (301, False)])
def test_timestamps_more_than_300_s_off_are_refused(skew_s: int, ok: bool) -> None:
    result = verifier("s3cret").check(URL, signed("s3cret", ts=NOW + skew_s))
    assert (result is None) is ok


def test_secret_rotation_accepts_every_listed_secret() -> None:
    v = verifier(["new-secret", "old-secret"])
    assert v.check(URL, signed("old-secret")) is None
    assert v.check(URL, signed("new-secret")) is None
    assert v.check(URL, signed("third")) is not None


def test_public_url_is_what_the_signature_covers() -> None:
    public = "wss://apps.example.com/voice/session"
    v = verifier("s3cret", public_url=public)
    # Behind a proxy the request arrives for another URL; the gateway signed the public one.
    assert v.check("ws://10.0.0.5:9000/session", signed("s3cret", url=public)) is None
    assert v.check(public, signed("s3cret", url="ws://10.0.0.5:9000/session")) is not None


def test_verification_off_and_bad_secret_lists() -> None:
    assert verifier(None).check(URL, {}) is None
    assert not verifier(None).enabled
    for bad in ([], [""], ""):
        with pytest.raises(ValueError):
            Verifier(bad)


def test_request_url() -> None:
    assert request_url("ws", "127.0.0.1:9000", "/session?a=1") == "ws://127.0.0.1:9000/session?a=1"


def test_every_error_code_has_its_exception() -> None:
    classes = {
        "bad_message": errors.BadMessage,
        "read_only": errors.ReadOnly,
        "provider_unavailable": errors.ProviderUnavailable,
        "provider_timeout": errors.ProviderTimeout,
        "invalid_catalog_id": errors.InvalidCatalogId,
        "feature_not_supported": errors.FeatureNotSupported,
        "transfer_failed": errors.TransferFailed,
        "on_hold": errors.OnHold,
        "queue_full": errors.QueueFull,
        "play_fetch_failed": errors.PlayFetchFailed,
        "internal": errors.InternalError,
    }
    from appbridge.protocol.session_v1 import ERROR_CODES

    assert set(classes) == ERROR_CODES
    for code, cls in classes.items():
        exc = errors.error_from_event(
            ErrorEvent(code=code, message="m", fatal=False, relates_to="sdk-say-1")  # type: ignore[arg-type]
        )
        assert type(exc) is cls and isinstance(exc, errors.CommandError)
        assert (exc.code, exc.message, exc.relates_to) == (code, "m", "sdk-say-1")
    assert isinstance(errors.SessionEnded("transfer"), errors.SessionClosed)


def test_decoding_frames() -> None:
    assert decode_frame(b"\x02abc") == AudioFrame(2, b"abc")
    assert decode_frame(b"") is None
    assert decode_frame("[1,2]") is None
    assert decode_frame('{"type":"future.thing"}') is None
    assert decode_frame('{"type":"dtmf","digit":"x"}') is None
    end = decode_frame('{"type":"session.end","reason":"brand_new","id":"h"}')
    assert isinstance(end, SessionEnd) and (end.reason, end.id) == ("brand_new", "h")
    err = decode_frame('{"type":"error","code":"new_code","message":"m","relatesTo":"x"}')
    assert isinstance(err, ErrorEvent) and (err.code, err.relates_to) == ("new_code", "x")
    assert decode_frame('{"type":"error","message":"no code"}') is None
