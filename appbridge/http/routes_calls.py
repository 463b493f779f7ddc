"""The gateway's own REST API, ``/v1/calls`` (docs/operations.md, "The `/v1` API").

Every request needs ``Authorization: Bearer`` with one of ``[api] tokens`` (docs/configuration.md,
``[api]``); without a valid one, or without ``[api]``, the answer is 401 with
``WWW-Authenticate`` (RFC 6750). Tokens are compared in constant time, every one of them, so the
answer's timing says nothing about which token came close.
"""

from __future__ import annotations

import hmac
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.carriers.requests import OutboundError, parse_call_request
from appbridge.carriers.twilio_outbound import outbound_for
from appbridge.cluster.auth import AUTH_HEADER
from appbridge.cluster.forward import INTERNAL_PREFIX, forward, internal_refusal, unavailable
from appbridge.cluster.redis_link import RedisUnavailable
from appbridge.http.errors import error
from appbridge.protocol.json_bounds import JsonBodyError, loads_object

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


def _node(gw: Gateway, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with this node's id when clustered (docs/scaling.md); one node answers as ever."""
    if gw.cluster is not None:
        body["node"] = gw.cluster.node_id
    return body


def local_listing(gw: Gateway) -> list[dict[str, Any]]:
    calls = []
    for call in gw.registry:
        d = call.describe()
        calls.append(_node(gw, {k: d[k] for k in LISTED_FIELDS}))
    return calls


async def list_calls(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    calls = local_listing(gw)
    if gw.cluster is None:
        return JSONResponse({"calls": calls})
    try:
        remote = await gw.cluster.remote_calls()
    except RedisUnavailable:
        return JSONResponse({"calls": calls, "partial": True})
    for record in remote:
        calls.append({**{k: record.get(k) for k in LISTED_FIELDS}, "node": record["node"]})
    return JSONResponse({"calls": calls, "partial": False})


async def local_create(gw: Gateway, data: Any) -> Response:
    """Place the call on this node (a request already decoded from JSON)."""
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
        _node(gw, {"callRef": call.call_ref, "status": "dialing"}),
        status_code=201,
        headers={"Location": f"/v1/calls/{call.call_ref}"},
    )


async def create_call(gw: Gateway, request: Request) -> Response:
    """Checked in carriers/requests.py; 201 once the INVITE is out (SIP) or Twilio created
    the call (carriers/twilio_outbound.py). Clustered, the call goes to the node with the most
    free capacity (docs/scaling.md, "Placing a call")."""

    if not _bearer_ok(gw, request):
        return _unauthorized()
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return error(413, "too_large", f"call requests are limited to {MAX_BODY_BYTES} bytes")
    try:
        data = loads_object(body, max_bytes=MAX_BODY_BYTES)
    except JsonBodyError as exc:
        return error(400, "bad_request", str(exc))
    if gw.cluster is not None:
        try:
            parse_call_request(gw, data)
        except OutboundError as exc:
            return error(exc.status, exc.code, exc.message)
        node = await gw.cluster.placement()
        if node is not None:
            path = f"{INTERNAL_PREFIX}/v1/calls"
            headers = {"content-type": "application/json"}
            return await forward(gw.cluster, node, "POST", path, body=body, headers=headers)
    return await local_create(gw, data)


def local_get(gw: Gateway, call_ref: str) -> Response | None:
    """The call's description, or None when this node never had it."""
    described = gw.registry.describe(call_ref)
    if described is None:
        return None
    return JSONResponse(_node(gw, dict(described)))


async def get_call(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    call_ref = request.path_params["call_ref"]
    answer = local_get(gw, call_ref)
    if answer is None and gw.cluster is not None:
        answer = await _at_owner(gw, "GET", call_ref)
    return answer or error(404, "not_found", "no such call")


async def local_delete(gw: Gateway, call_ref: str) -> Response | None:
    """End the live call, or None when this node never had it."""
    call = gw.registry.get(call_ref)
    if call is None or call.over:
        if call is None and gw.registry.describe(call_ref) is None:
            return None
        return error(404, "not_found", "no such live call")
    await call.end("app_hangup")
    return JSONResponse(_node(gw, call.describe()))


async def delete_call(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    call_ref = request.path_params["call_ref"]
    answer = await local_delete(gw, call_ref)
    if answer is None and gw.cluster is not None:
        answer = await _at_owner(gw, "DELETE", call_ref)
    return answer or error(404, "not_found", "no such live call")


async def _at_owner(gw: Gateway, method: str, call_ref: str) -> Response | None:
    """The owner's answer for a call this node does not hold; None when no live node holds it,
    503 when the directory is unreachable."""
    assert gw.cluster is not None
    try:
        node = await gw.cluster.locate(call_ref)
    except RedisUnavailable:
        return unavailable()
    if node is None or node.node_id == gw.cluster.node_id:
        return None
    path = f"{INTERNAL_PREFIX}/v1/calls/{quote(call_ref, safe='')}"
    return await forward(gw.cluster, node, method, path)


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


# -- the owner's half, for the other nodes of a cluster (docs/scaling.md) -------------------------


async def _internal(gw: Gateway, request: Request) -> Response:
    """A request another node forwarded: the local answer, once its signature is checked."""
    refused = internal_refusal(
        gw.cluster, request.method, request.url.path, request.headers.get(AUTH_HEADER)
    )
    if refused is not None:
        return refused
    if "call_ref" not in request.path_params:
        try:
            data = loads_object(await request.body(), max_bytes=MAX_BODY_BYTES)
        except JsonBodyError as exc:
            return error(400, "bad_request", str(exc))
        return await local_create(gw, data)
    call_ref = request.path_params["call_ref"]
    if request.method == "DELETE":
        answer = await local_delete(gw, call_ref)
        return answer or error(404, "not_found", "no such live call")
    return local_get(gw, call_ref) or error(404, "not_found", "no such call")


def internal_calls_routes(gw: Gateway) -> list[BaseRoute]:
    """``/internal/v1/calls`` and ``/internal/v1/calls/{callRef}``, with ``[cluster]`` only."""
    if gw.config.cluster is None:
        return []
    endpoint = partial(_internal, gw)
    return [
        Route(f"{INTERNAL_PREFIX}/v1/calls", endpoint, methods=["POST"]),
        Route(f"{INTERNAL_PREFIX}/v1/calls/{{call_ref}}", endpoint, methods=["GET", "DELETE"]),
    ]
