"""The browser pages' login (http/web_auth.py; docs/operations.md, "The console and the
softphone"): loopback lets everyone in, elsewhere a Bearer token or the session cookie that
``POST /login`` sets; sessions expire in virtual time and the store is bounded."""

from __future__ import annotations

import logging
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from appbridge.clock import VirtualClock
from appbridge.console.logins import SessionStore
from appbridge.http import web_auth
from appbridge.http.web_auth import (
    COOKIE_NAME,
    auth_routes,
    loopback_only,
    safe_next,
    web_guard,
)

TOKEN = "web-token-1"


class FakeGateway:
    """What web_guard reads of the gateway: the configuration and the clock."""

    def __init__(self, host: str = "0.0.0.0", tokens: tuple[str, ...] = (TOKEN,), **server: Any):
        api = SimpleNamespace(tokens=tokens) if tokens else None
        self.config = SimpleNamespace(
            server=SimpleNamespace(host=host, public_url=server.get("public_url"), tls=None),
            api=api,
        )
        self.clock = VirtualClock()
        self.web_sessions = SessionStore()


async def _guarded(gw: FakeGateway, request: Request) -> Response:
    refused = await web_guard(gw, request)  # type: ignore[arg-type]
    return refused or JSONResponse({"ok": True})


def client_for(gw: FakeGateway, base_url: str = "http://testserver") -> TestClient:
    routes = [
        *auth_routes(gw),  # type: ignore[arg-type]
        Route("/phone", partial(_guarded, gw), methods=["GET"]),
        Route("/v1/console/calls", partial(_guarded, gw), methods=["GET"]),
    ]
    return TestClient(Starlette(routes=routes), base_url=base_url, follow_redirects=False)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gateway.example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert loopback_only(host) is loopback


def test_loopback_needs_no_login() -> None:
    with client_for(FakeGateway(host="127.0.0.1", tokens=())) as http:
        assert http.get("/phone").json() == {"ok": True}
        assert http.get("/v1/console/calls").json() == {"ok": True}


def test_refusals_are_a_login_form_for_pages_and_json_for_the_api() -> None:
    with client_for(FakeGateway()) as http:
        page = http.get("/phone")
        assert page.status_code == 401
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["cache-control"] == "no-store"
        assert '<form method="post" action="/login">' in page.text
        assert 'name="next" value="/phone"' in page.text
        api = http.get("/v1/console/calls")
        assert api.status_code == 401 and api.json()["error"] == "unauthorized"
        wrong = http.get("/v1/console/calls", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = http.get("/v1/console/calls", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.json() == {"ok": True}


def test_login_sets_an_opaque_session_cookie_and_logout_clears_it() -> None:
    gw = FakeGateway()
    with client_for(gw) as http:
        login = http.post("/login", data={"token": TOKEN, "next": "/console"})
        assert login.status_code == 303 and login.headers["location"] == "/console"
        assert login.headers["cache-control"] == "no-store"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE_NAME}=") and TOKEN not in cookie
        attributes = {part.strip().lower() for part in cookie.split(";")}
        assert {"httponly", "samesite=strict", "path=/"} <= attributes
        assert "secure" not in attributes  # plain http
        assert http.get("/phone").json() == {"ok": True}
        assert len(gw.web_sessions) == 1
        out = http.post("/logout")
        assert out.status_code == 303
        assert len(gw.web_sessions) == 0
        http.cookies.clear()
        http.cookies.set(COOKIE_NAME, login.cookies[COOKIE_NAME])
        assert http.get("/phone").status_code == 401  # the old key is gone server-side


def test_login_defaults_to_the_phone_and_refuses_foreign_next() -> None:
    with client_for(FakeGateway()) as http:
        assert http.post("/login", data={"token": TOKEN}).headers["location"] == "/phone"
        for bad in ("https://evil.example/", "//evil.example/", "/\\evil", "phone"):
            login = http.post("/login", data={"token": TOKEN, "next": bad})
            assert login.headers["location"] == "/phone"


def test_a_wrong_token_is_401_again_and_logged_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with client_for(FakeGateway()) as http, caplog.at_level(logging.INFO, web_auth.__name__):
        wrong = http.post("/login", data={"token": "guess-123", "next": "/console"})
        assert wrong.status_code == 401 and "<form" in wrong.text
        assert wrong.headers["cache-control"] == "no-store"
        assert 'value="/console"' in wrong.text and "set-cookie" not in wrong.headers
    assert any("web login refused" in r.getMessage() for r in caplog.records)
    assert "guess-123" not in caplog.text


def test_the_cookie_is_secure_over_https() -> None:
    with client_for(FakeGateway(), base_url="https://testserver") as http:
        cookie = http.post("/login", data={"token": TOKEN}).headers["set-cookie"]
        assert "secure" in {part.strip().lower() for part in cookie.split(";")}
    with client_for(FakeGateway(public_url="https://voice.example.com")) as http:
        cookie = http.post("/login", data={"token": TOKEN}).headers["set-cookie"]
        assert "secure" in {part.strip().lower() for part in cookie.split(";")}


def test_a_login_form_that_is_too_large_is_refused() -> None:
    with client_for(FakeGateway()) as http:
        big = http.post("/login", data={"token": "x" * 10_000})
        assert big.status_code == 400 and big.json()["error"] == "bad_request"


def test_sessions_expire_after_12_hours_in_virtual_time() -> None:
    gw = FakeGateway()
    with client_for(gw) as http:
        http.post("/login", data={"token": TOKEN})
        gw.clock.advance(12 * 3600 - 1)
        assert http.get("/phone").status_code == 200
        gw.clock.advance(2)
        assert http.get("/phone").status_code == 401


def test_the_store_is_bounded_oldest_first() -> None:
    store = SessionStore(limit=3, lifetime_s=60.0)
    keys = [store.open(0.0) for _ in range(4)]
    assert len(store) == 3
    assert not store.valid(keys[0], 1.0)
    assert all(store.valid(k, 1.0) for k in keys[1:])
    assert len(set(keys)) == 4 and all(len(k) >= 40 for k in keys)


def test_safe_next() -> None:
    assert safe_next("/console?x=1") == "/console?x=1"
    assert safe_next(None) == "/phone"
    assert safe_next("/\x00") == "/phone"
