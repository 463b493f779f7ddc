"""The gateway's own REST API, ``/v1/calls`` (docs/operations.md, "The `/v1` API").

Every request needs ``Authorization: Bearer`` with one of ``[api] tokens`` (docs/configuration.md,
``[api]``); without a valid one, or without ``[api]``, the answer is 401 with
``WWW-Authenticate`` (RFC 6750). Tokens are compared in constant time, every one of them, so the
answer's timing says nothing about which token came close.
"""

from __future__ import annotations

import hmac
import json
from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.carriers.requests import OutboundError, parse_call_request
from appbridge.carriers.twilio_outbound import outbound_for
from appbridge.http.errors import error

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

MAX_BODY_BYTES = 64 * 1024
# What ``GET /v1/calls`` shows of each live call; ``GET /v1/calls/{callRef}`` shows it all.
LISTED_FIELDS = ("callRef", "sessionRef", "app", "direction", "from", "to", "started", "state")


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


async def list_calls(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    calls = []
    for call in gw.registry:
        d = call.describe()
        calls.append({k: d[k] for k in LISTED_FIELDS})
    return JSONResponse({"calls": calls})


async def create_call(gw: Gateway, request: Request) -> Response:
    """Checked in carriers/requests.py; 201 once the INVITE is out (SIP) or Twilio created
    the call (carriers/twilio_outbound.py)."""

    if not _bearer_ok(gw, request):
        return _unauthorized()
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return error(413, "too_large", f"call requests are limited to {MAX_BODY_BYTES} bytes")
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


async def get_call(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    described = gw.registry.describe(request.path_params["call_ref"])
    if described is None:
        return error(404, "not_found", "no such call")
    return JSONResponse(described)


async def delete_call(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    call = gw.registry.get(request.path_params["call_ref"])
    if call is None or call.over:
        return error(404, "not_found", "no such live call")
    await call.end("app_hangup")
    return JSONResponse(call.describe())


def calls_routes(gw: Gateway) -> list[BaseRoute]:
    return [
        Route("/v1/calls", partial(list_calls, gw), methods=["GET"], name="list_calls"),
        Route("/v1/calls", partial(create_call, gw), methods=["POST"], name="create_call"),
        Route("/v1/calls/{call_ref}", partial(get_call, gw), methods=["GET"], name="get_call"),
        Route(
            "/v1/calls/{call_ref}",
            partial(delete_call, gw),
            methods=["DELETE"],
            name="delete_call",
        ),
    ]
