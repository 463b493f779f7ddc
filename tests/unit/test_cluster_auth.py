"""Signed requests between nodes (docs/scaling.md, "Requests between nodes"): HMAC-SHA256 over
method, path and a timestamp within ±60 s, compared in constant time."""

from __future__ import annotations

import pytest

from appbridge.cluster.auth import MAX_SKEW_S, AuthResult, sender_of, sign, verify

SECRET = "cluster-secret"
NOW = 1_800_000_000.0


def test_a_signed_request_verifies() -> None:
    header = sign(SECRET, "GET", "/internal/v1/calls/c1", "node-a", NOW)
    assert verify(SECRET, "GET", "/internal/v1/calls/c1", header, NOW) is AuthResult.OK
    assert sender_of(header) == "node-a"


@pytest.mark.parametrize("header", [None, "", "garbage", "t=abc,n=a,s=00", "t=1,n=,s=00"])
def test_a_missing_or_malformed_header_is_missing(header: str | None) -> None:
    assert verify(SECRET, "GET", "/internal/v1/calls", header, NOW) is AuthResult.MISSING


def test_a_bad_secret_is_refused() -> None:
    header = sign("another-secret", "GET", "/internal/v1/calls/c1", "node-a", NOW)
    assert verify(SECRET, "GET", "/internal/v1/calls/c1", header, NOW) is AuthResult.REFUSED


@pytest.mark.parametrize(
    ("method", "path"), [("DELETE", "/internal/v1/calls/c1"), ("GET", "/internal/v1/calls/c2")]
)
def test_the_signature_covers_method_and_path(method: str, path: str) -> None:
    header = sign(SECRET, "GET", "/internal/v1/calls/c1", "node-a", NOW)
    assert verify(SECRET, method, path, header, NOW) is AuthResult.REFUSED


def test_the_signature_covers_the_node_id() -> None:
    header = sign(SECRET, "GET", "/p", "node-a", NOW).replace("n=node-a", "n=node-b")
    assert verify(SECRET, "GET", "/p", header, NOW) is AuthResult.REFUSED


@pytest.mark.parametrize("skew", [MAX_SKEW_S + 1, -(MAX_SKEW_S + 1), 3600.0])
def test_a_stale_timestamp_is_refused(skew: float) -> None:
    header = sign(SECRET, "GET", "/p", "node-a", NOW)
    assert verify(SECRET, "GET", "/p", header, NOW + skew) is AuthResult.REFUSED


@pytest.mark.parametrize("skew", [0.0, MAX_SKEW_S, -MAX_SKEW_S])
def test_within_a_minute_either_way_is_accepted(skew: float) -> None:
    header = sign(SECRET, "GET", "/p", "node-a", NOW)
    assert verify(SECRET, "GET", "/p", header, NOW + skew) is AuthResult.OK
