"""The HTTP and WebSocket routes of INTERFACES §5, as one Starlette application.

Every error answer is JSON (``{"error": ..., "message": ...}``), including unknown routes and
wrong methods, so a client never has to parse an HTML page.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute

from appbridge.carriers.twilio.stream import TwilioStreamEndpoint
from appbridge.carriers.twilio.webhook import handle_voice_webhook
from appbridge.demo.app import DemoAppEndpoint
from appbridge.gateway import Gateway
from appbridge.http import twilio_rest
from appbridge.http.metrics import render_metrics

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 64 * 1024
TWILIO_CALL_PATH = "/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _bearer_ok(gw: Gateway, request: Request) -> bool:
    api = gw.config.api
    if api is None:
        return False
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    ok = False
    for candidate in api.tokens:
        ok |= hmac.compare_digest(candidate.encode(), token.strip().encode())
    return ok


def _unauthorized() -> JSONResponse:
    resp = error(401, "unauthorized", "a valid Bearer token of [api] tokens is required")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="appbridge"'
    return resp


def build_app(gw: Gateway) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if gw.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ready", "calls": len(gw.registry)})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(
            render_metrics(gw), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def list_calls(request: Request) -> Response:
        if not _bearer_ok(gw, request):
            return _unauthorized()
        calls = []
        for call in gw.registry:
            d = call.describe()
            calls.append(
                {
                    k: d[k]
                    for k in (
                        "callRef",
                        "sessionRef",
                        "app",
                        "direction",
                        "from",
                        "to",
                        "started",
                        "state",
                    )
                }
            )
        return JSONResponse({"calls": calls})

    async def create_call(request: Request) -> Response:
        """INTERFACES §5: checks in carriers/sip/outbound.py; 201 once the INVITE is out (SIP)
        or Twilio created the call (carriers/twilio_outbound.py)."""
        from appbridge.carriers.sip.outbound import OutboundError, parse_call_request
        from appbridge.carriers.twilio_outbound import outbound_for

        if not _bearer_ok(gw, request):
            return _unauthorized()
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return error(413, "too_large", f"call requests are limited to {MAX_FORM_BYTES} bytes")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return error(400, "bad_request", "the body must be JSON")
        try:
            req = parse_call_request(gw, data)
            if req.carrier == "twilio":
                call = await outbound_for(gw).place(req)
            else:
                if gw.sip is None:
                    raise OutboundError(503, "unavailable", "the SIP carrier is not running")
                call = await gw.sip.outbound.place(req)
        except OutboundError as exc:
            return error(exc.status, exc.code, exc.message)
        return JSONResponse(
            {"callRef": call.call_ref, "status": "dialing"},
            status_code=201,
            headers={"Location": f"/v1/calls/{call.call_ref}"},
        )

    async def get_call(request: Request) -> Response:
        if not _bearer_ok(gw, request):
            return _unauthorized()
        described = gw.registry.describe(request.path_params["call_ref"])
        if described is None:
            return error(404, "not_found", "no such call")
        return JSONResponse(described)

    async def delete_call(request: Request) -> Response:
        if not _bearer_ok(gw, request):
            return _unauthorized()
        call = gw.registry.get(request.path_params["call_ref"])
        if call is None or call.state in ("ending", "ended"):
            return error(404, "not_found", "no such live call")
        await call.end("app_hangup")
        return JSONResponse(call.describe())

    async def twilio_voice(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return error(413, "too_large", f"webhook bodies are limited to {MAX_FORM_BYTES} bytes")
        content_type = request.headers.get("content-type", "")
        if "application/x-www-form-urlencoded" not in content_type:
            return error(415, "unsupported_media_type", "expected a form-encoded webhook")
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            return error(400, "bad_request", "the form is not UTF-8")
        form = dict(pairs)
        url = gw.config.server.base_url() + "/twilio/voice"
        if request.url.query:
            url += "?" + request.url.query
        status, ctype, payload = await handle_voice_webhook(
            gw, url, form, request.headers.get("x-twilio-signature")
        )
        return Response(payload, status_code=status, media_type=ctype)

    async def twilio_status(request: Request) -> Response:
        """Twilio's status callback for the calls the gateway placed (twilio_outbound.py)."""
        from appbridge.carriers.twilio_outbound import STATUS_PATH, handle_status_callback

        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return error(413, "too_large", f"callback bodies are limited to {MAX_FORM_BYTES} bytes")
        if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
            return error(415, "unsupported_media_type", "expected a form-encoded callback")
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            return error(400, "bad_request", "the form is not UTF-8")
        url = gw.config.server.base_url() + STATUS_PATH
        if request.url.query:
            url += "?" + request.url.query
        status, ctype, payload = await handle_status_callback(
            gw, url, pairs, request.headers.get("x-twilio-signature")
        )
        return Response(payload, status_code=status, media_type=ctype)

    async def twilio_update_call(request: Request) -> Response:
        return await twilio_rest.update_call(gw, request)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        names = {404: "not_found", 405: "method_not_allowed"}
        return error(exc.status_code, names.get(exc.status_code, "http_error"), str(exc.detail))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error(500, "internal", "the gateway failed to answer this request")

    routes: list[Any] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/calls", list_calls, methods=["GET"]),
        Route("/v1/calls", create_call, methods=["POST"]),
        Route("/v1/calls/{call_ref}", get_call, methods=["GET"]),
        Route("/v1/calls/{call_ref}", delete_call, methods=["DELETE"]),
        Route("/twilio/voice", twilio_voice, methods=["POST"]),
        Route("/twilio/status", twilio_status, methods=["POST"]),
        Route(TWILIO_CALL_PATH, twilio_update_call, methods=["POST"]),
        Route(
            TWILIO_CALL_PATH,
            twilio_rest.method_not_allowed,
            methods=["GET", "PUT", "DELETE", "PATCH"],
        ),
        WebSocketRoute("/twilio/stream", TwilioStreamEndpoint(gw)),
        WebSocketRoute("/demo/session", DemoAppEndpoint(gw)),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.gateway = gw
    return app
