"""Who may open the browser pages and their APIs (docs/operations.md, "The console and the
softphone").

A gateway that listens on loopback only lets everyone in: whoever reaches it is on the machine.
Elsewhere a request needs one of ``[api] tokens``, either as ``Authorization: Bearer`` (as the
``/v1`` API does) or as the ``appbridge_session`` cookie that ``POST /login`` sets. The cookie's
value is an opaque random key into a bounded in-memory store: the token itself never reaches a
cookie, a URL or a log, and a restart logs everyone out. Tokens are compared in constant time,
every one of them, like http/routes_calls.py does.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import logging
from functools import partial
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.console.logins import SESSION_LIFETIME_S
from appbridge.http.errors import error

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

log = logging.getLogger(__name__)

COOKIE_NAME: Final = "appbridge_session"
MAX_FORM_BYTES: Final = 8 * 1024
DEFAULT_NEXT: Final = "/phone"
#: The pages whose refusal is a login form rather than JSON.
PAGES: Final = frozenset({"/phone", "/console"})
NO_STORE: Final = {"Cache-Control": "no-store"}


def loopback_only(host: str) -> bool:
    """Whether ``[server] host`` accepts connections from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_ok(gw: Gateway, token: str) -> bool:
    """``token`` is one of ``[api] tokens``; every one is compared, in constant time."""
    api = gw.config.api
    if api is None or not token:
        return False
    given = token.encode()
    ok = False
    for candidate in api.tokens:
        ok |= hmac.compare_digest(candidate.encode(), given)
    return ok


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def secure_cookie(gw: Gateway, request: Request) -> bool:
    """Served over https: by the gateway itself (``[server] tls``) or behind a proxy whose
    ``public_url`` is https."""
    server = gw.config.server
    public = server.public_url or ""
    return (
        request.url.scheme == "https"
        or getattr(server, "tls", None) is not None
        or public.startswith("https:")
    )


async def web_guard(gw: Gateway, request: Request) -> Response | None:
    """None when the request may go on; else the 401 to answer (a login form for a page)."""
    if loopback_only(gw.config.server.host):
        return None
    if token_ok(gw, _bearer(request)):
        return None
    key = request.cookies.get(COOKIE_NAME)
    if key and gw.web_sessions.valid(key, gw.clock.now()):
        return None
    if request.method == "GET" and request.url.path in PAGES:
        return login_page(request.url.path, status=401)
    resp = error(401, "unauthorized", "log in at /login or send a Bearer token of [api] tokens")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="appbridge"'
    return resp


def safe_next(value: str | None) -> str:
    """A relative path on this gateway; anything else (``//host``, a URL) is the default."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return DEFAULT_NEXT
    if any(ord(ch) < 0x20 for ch in value):
        return DEFAULT_NEXT
    return value


def login_page(next_path: str, *, status: int, message: str = "") -> HTMLResponse:
    """The login form; it POSTs, so the token is never part of a URL."""
    note = f'<p role="alert">{html.escape(message)}</p>' if message else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>AppBridge login</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>AppBridge</h1>{note}
<form method="post" action="/login">
<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<input type="hidden" name="next" value="{html.escape(safe_next(next_path))}">
<button type="submit">Log in</button>
</form></main></body></html>
"""
    resp = HTMLResponse(body, status_code=status, headers=NO_STORE)
    resp.headers["Content-Security-Policy"] = "default-src 'self'; form-action 'self'"
    resp.headers["X-Frame-Options"] = "DENY"
    return resp


async def _form(request: Request) -> dict[str, str] | None:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return None
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        return None
    return {k: v[0] for k, v in parsed.items() if v}


async def login_form(gw: Gateway, request: Request) -> Response:
    return login_page(request.query_params.get("next", DEFAULT_NEXT), status=200)


async def login(gw: Gateway, request: Request) -> Response:
    """``POST /login``: a right token sets the session cookie and goes on to ``next``."""
    form = await _form(request)
    if form is None:
        return error(400, "bad_request", f"a login form of at most {MAX_FORM_BYTES} bytes")
    next_path = safe_next(form.get("next"))
    if not token_ok(gw, form.get("token", "").strip()):
        client = request.client.host if request.client is not None else "?"
        log.info("web login refused from %s: not a token of [api] tokens", client)
        return login_page(next_path, status=401, message="That token is not valid.")
    key = gw.web_sessions.open(gw.clock.now())
    resp = RedirectResponse(next_path, status_code=303, headers=NO_STORE)
    resp.set_cookie(
        COOKIE_NAME,
        key,
        max_age=int(SESSION_LIFETIME_S),
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure_cookie(gw, request),
    )
    return resp


async def logout(gw: Gateway, request: Request) -> Response:
    key = request.cookies.get(COOKIE_NAME)
    if key:
        gw.web_sessions.close(key)
    resp = RedirectResponse("/login", status_code=303, headers=NO_STORE)
    resp.delete_cookie(
        COOKIE_NAME, path="/", httponly=True, samesite="strict", secure=secure_cookie(gw, request)
    )
    return resp


def auth_routes(gw: Gateway) -> list[BaseRoute]:
    return [
        Route("/login", partial(login_form, gw), methods=["GET"], name="login_form"),
        Route("/login", partial(login, gw), methods=["POST"], name="login"),
        Route("/logout", partial(logout, gw), methods=["POST"], name="logout"),
    ]
