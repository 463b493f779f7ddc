"""Browser calls over HTTP: ``GET /v1/webrtc/directory`` and ``POST /v1/webrtc/calls``
(docs/webrtc.md, "Signalling").

The directory lists what a browser may call: the configured numbers in configuration order
(the ``"*"`` catch-all is no number to dial), the apps, and the ICE servers of
``[webrtc] ice_servers``. A call is one request with the browser's SDP offer, answered 201 with
the gateway's SDP answer once the app answered (carriers/webrtc/signalling.py). What a browser
can make the gateway do is bounded here: the body (:data:`MAX_BODY_BYTES`, 413 beyond), its
JSON shape (400), and in the carrier the SDP work and the offers pending at once.
"""

from __future__ import annotations

import asyncio
import importlib
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.carriers.webrtc.outcome import WebRtcRefusal, ice_servers
from appbridge.http.errors import error
from appbridge.http.web_auth import web_guard
from appbridge.protocol.json_bounds import JsonBodyError, loads_object

if TYPE_CHECKING:
    from appbridge.carriers.webrtc.signalling import WebRtcCalls
    from appbridge.config import AppConfig
    from appbridge.gateway import Gateway

MAX_BODY_BYTES: Final = 64 * 1024
_SIGNALLING: Final = "appbridge.carriers.webrtc.signalling"


def _numbers(gw: Gateway) -> list[dict[str, str]]:
    return [
        {"number": route.number, "app": route.app}
        for route in gw.config.numbers
        if route.number != "*"
    ]


class BrowserCarrier:
    """The browser calls of the gateway, made on the first offer: aiortc and PyAV add tens of
    megabytes and a second to a start-up that gateways without browser calls need not pay
    (docs/PERFORMANCE.md, "Browser calls (WebRTC)"). They are imported in a worker thread, so
    the event loop (and every live call's media) goes on meanwhile."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._calls: WebRtcCalls | None = None

    async def calls(self) -> WebRtcCalls:
        if self._calls is None:
            module = await asyncio.to_thread(importlib.import_module, _SIGNALLING)
            if self._calls is None:
                self._calls = module.WebRtcCalls(self.gw)
        return self._calls


async def directory(gw: Gateway, request: Request) -> Response:
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    return JSONResponse(
        {
            "numbers": _numbers(gw),
            "apps": list(gw.config.apps),
            "iceServers": ice_servers(gw.config.webrtc),
        }
    )


def _target(gw: Gateway, data: dict[str, Any]) -> tuple[AppConfig, str]:
    """The app and the call's ``to``: the number dialled, else the app's first number, else
    its name. Raises :class:`WebRtcRefusal` (400, 404)."""
    to, name = data.get("to"), data.get("app")
    if isinstance(to, str) and to:
        app = gw.config.route(to)
        if app is None:
            raise WebRtcRefusal(404, "not_found", "no app answers that number")
        return app, to
    if isinstance(name, str) and name:
        app = gw.config.apps.get(name)
        if app is None:
            raise WebRtcRefusal(404, "not_found", "no such app")
        first = next((n["number"] for n in _numbers(gw) if n["app"] == name), None)
        return app, first or name
    raise WebRtcRefusal(400, "bad_request", 'a call needs "to" (a number) or "app" (a name)')


async def create_call(gw: Gateway, carrier: BrowserCarrier, request: Request) -> Response:
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return error(413, "too_large", f"offers are limited to {MAX_BODY_BYTES} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return error(413, "too_large", f"offers are limited to {MAX_BODY_BYTES} bytes")
    try:
        data = loads_object(body, max_bytes=MAX_BODY_BYTES)
    except JsonBodyError as exc:
        return error(400, "bad_request", str(exc))
    sdp, kind = data.get("sdp"), data.get("type")
    if kind != "offer" or not isinstance(sdp, str) or not sdp.strip():
        return error(400, "bad_request", 'expected {"type": "offer", "sdp": "<SDP offer>"}')
    try:
        app, to = _target(gw, data)
        calls = await carrier.calls()
        answer = await calls.place(app, to, sdp)
    except WebRtcRefusal as exc:
        return error(exc.status, exc.code, exc.message)
    return JSONResponse(
        {"callRef": answer.call_ref, "type": "answer", "sdp": answer.sdp},
        status_code=201,
        headers={"Location": f"/v1/calls/{answer.call_ref}"},
    )


def webrtc_routes(gw: Gateway) -> list[BaseRoute]:
    carrier = BrowserCarrier(gw)
    return [
        Route("/v1/webrtc/directory", partial(directory, gw), methods=["GET"]),
        Route("/v1/webrtc/calls", partial(create_call, gw, carrier), methods=["POST"]),
    ]
