"""The routes other nodes of the cluster call, under ``/internal`` (docs/scaling.md, "Requests
between nodes").

Each one is the local half of a public route: the request was received, checked and found to
concern a call of this node by another node, which relays this node's answer unchanged. Every
request must carry a valid :data:`~appbridge.cluster.auth.AUTH_HEADER`: without one it is refused
with 401, with a wrong or stale one with 403. Without ``[cluster]`` none of these routes exist.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from appbridge.cluster import auth
from appbridge.cluster.forward import INTERNAL_PREFIX
from appbridge.http import routes_calls, twilio_rest
from appbridge.http.errors import error

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

Handler = Callable[["Gateway", Request], Awaitable[Response]]


def refusal(gw: Gateway, method: str, path: str, header: str | None) -> Response | None:
    """The answer to an internal request that is not signed by a node of this cluster."""
    cluster = gw.cluster
    if cluster is None:
        return error(404, "not_found", "this gateway is not part of a cluster")
    result = cluster.verify(method, path, header)
    if result is auth.AuthResult.MISSING:
        return error(401, "unauthorized", "a signed request of a cluster node is required")
    if result is auth.AuthResult.REFUSED:
        return error(403, "forbidden", "the cluster signature does not match or is stale")
    return None


async def _guarded(gw: Gateway, handler: Handler, request: Request) -> Response:
    refused = refusal(gw, request.method, request.url.path, request.headers.get(auth.AUTH_HEADER))
    if refused is not None:
        return refused
    return await handler(gw, request)


async def _get_call(gw: Gateway, request: Request) -> Response:
    answer = routes_calls.local_get(gw, request.path_params["call_ref"])
    return answer or error(404, "not_found", "no such call")


async def _delete_call(gw: Gateway, request: Request) -> Response:
    answer = await routes_calls.local_delete(gw, request.path_params["call_ref"])
    return answer or error(404, "not_found", "no such live call")


async def _create_call(gw: Gateway, request: Request) -> Response:
    try:
        data = json.loads(await request.body())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return error(400, "bad_request", "the body must be JSON")
    return await routes_calls.local_create(gw, data)


async def _twilio_update(gw: Gateway, request: Request) -> Response:
    # The original request's credentials came along: checked here as on one node.
    return await twilio_rest.update_call(gw, request)


def internal_routes(gw: Gateway) -> list[BaseRoute]:
    if gw.config.cluster is None:
        return []
    p = INTERNAL_PREFIX
    twilio_path = p + "/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"
    return [
        Route(f"{p}/v1/calls", partial(_guarded, gw, _create_call), methods=["POST"]),
        Route(f"{p}/v1/calls/{{call_ref}}", partial(_guarded, gw, _get_call), methods=["GET"]),
        Route(
            f"{p}/v1/calls/{{call_ref}}", partial(_guarded, gw, _delete_call), methods=["DELETE"]
        ),
        Route(twilio_path, partial(_guarded, gw, _twilio_update), methods=["POST"]),
    ]
