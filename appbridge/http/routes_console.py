"""The console's API (docs/operations.md, "The console and the softphone"): this node's calls,
one call's timeline, and hanging a call up. Every route is guarded by http/web_auth.py.

With ``[cluster]`` a node lists and hangs up only its own calls (docs/scaling.md); the console
of another node shows that node's.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.http.errors import error
from appbridge.http.routes_calls import local_delete
from appbridge.http.web_auth import web_guard

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

NO_STORE = {"Cache-Control": "no-store"}


async def list_calls(gw: Gateway, request: Request) -> Response:
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    return JSONResponse(gw.registry.console.listing(), headers=NO_STORE)


async def timeline(gw: Gateway, request: Request) -> Response:
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    raw = request.query_params.get("after", "0") or "0"
    try:
        after = int(raw)
    except ValueError:
        return error(400, "bad_request", "after must be an entry number (an integer)")
    recorder = gw.registry.console.get(request.path_params["call_ref"])
    if recorder is None:
        return error(404, "not_found", "no such call on this node")
    return JSONResponse(recorder.timeline_page(after), headers=NO_STORE)


async def hangup(gw: Gateway, request: Request) -> Response:
    """Ends the call as ``DELETE /v1/calls/{callRef}`` does (``app_hangup``)."""
    refused = await web_guard(gw, request)
    if refused is not None:
        return refused
    answer = await local_delete(gw, request.path_params["call_ref"])
    if answer is None:
        return error(404, "not_found", "no such live call on this node")
    if answer.status_code != 200:
        return answer
    return Response(status_code=204)


def console_routes(gw: Gateway) -> list[BaseRoute]:
    return [
        Route("/v1/console/calls", partial(list_calls, gw), methods=["GET"], name="console_calls"),
        Route(
            "/v1/console/calls/{call_ref}/timeline",
            partial(timeline, gw),
            methods=["GET"],
            name="console_timeline",
        ),
        Route(
            "/v1/console/calls/{call_ref}/hangup",
            partial(hangup, gw),
            methods=["POST"],
            name="console_hangup",
        ),
    ]
