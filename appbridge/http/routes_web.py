"""The browser pages: ``GET /phone``, ``GET /console`` and their scripts and styles under
``GET /web/{name}`` (docs/operations.md, "The console and the softphone").

The pages are guarded (http/web_auth.py); the scripts and styles are not, as they hold no
secrets. Only files that exist in ``appbridge/web/`` with a suffix of :data:`ASSET_TYPES` are
served, by their bare name: nothing outside that folder is reachable. The pages carry a
Content-Security-Policy that lets them load only from the gateway (and play ``blob:`` media), and
refuse to be framed.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from appbridge.http.errors import error
from appbridge.http.web_auth import web_guard

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

#: Where the pages live; tests point it at their own folder.
WEB_DIR: Path = Path(__file__).resolve().parent.parent / "web"

ASSET_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
PAGE_FILES: Final = {"/phone": "phone.html", "/console": "console.html"}
PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; media-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}
_ASSET_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}")


def _read(name: str) -> bytes | None:
    path = WEB_DIR / name
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


async def page(gw: Gateway, request: Request) -> Response:
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    body = _read(PAGE_FILES[request.url.path])
    if body is None:
        return error(404, "not_found", "this page is not installed")
    return Response(body, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


async def asset(gw: Gateway, request: Request) -> Response:
    name = request.path_params["name"]
    suffix = Path(name).suffix.lower()
    if _ASSET_NAME.fullmatch(name) is None or ".." in name or suffix not in ASSET_TYPES:
        return error(404, "not_found", "no such file")
    body = _read(name)
    if body is None:
        return error(404, "not_found", "no such file")
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    return Response(body, media_type=ASSET_TYPES[suffix], headers=headers)


def web_routes(gw: Gateway) -> list[BaseRoute]:
    endpoint = partial(page, gw)
    return [
        Route("/phone", endpoint, methods=["GET"], name="phone_page"),
        Route("/console", endpoint, methods=["GET"], name="console_page"),
        Route("/web/{name}", partial(asset, gw), methods=["GET"], name="web_asset"),
    ]
