"""The routes Twilio and Twilio-built apps reach (docs/protocol-twilio.md).

* ``POST /twilio/voice``, the voice webhook of calls from Twilio (carriers/twilio/webhook.py);
* ``POST /twilio/status``, the status callback of calls the gateway placed through Twilio
  (carriers/twilio/status.py), and clustered its owner's half under ``/internal``
  (cluster/dial_relay.py);
* ``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``, the Twilio-compatible hang-up
  for apps of the Twilio dialect (http/twilio_rest.py);
* ``WS /twilio/stream``, the Media Stream behind ASGI (carriers/twilio/stream.py), for a server
  run without the WebSocket fast path.

Twilio signs its requests over the public URL it was given (docs/configuration.md,
``[server]``), so the URL checked is ``public_url`` + path + query, never the Host the request
came in on. The form is parsed here, the signature checked by the carrier module.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from appbridge.carriers.twilio.stream import TwilioStreamEndpoint
from appbridge.carriers.twilio.webhook import handle_voice_webhook
from appbridge.cluster.auth import AUTH_HEADER
from appbridge.cluster.dial_relay import STATUS_ROUTE
from appbridge.cluster.forward import INTERNAL_PREFIX, forward, internal_refusal
from appbridge.cluster.redis_link import RedisUnavailable
from appbridge.http import twilio_rest
from appbridge.http.errors import error

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

MAX_FORM_BYTES = 64 * 1024
TWILIO_CALL_PATH = "/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"


async def _read_form(request: Request, what: str) -> list[tuple[str, str]] | Response:
    """The request's form fields, or the error to answer (413, 415, 400); ``what`` names the
    request in the error's message."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return error(413, "too_large", f"{what} bodies are limited to {MAX_FORM_BYTES} bytes")
    if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
        return error(415, "unsupported_media_type", f"expected a form-encoded {what}")
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        return error(400, "bad_request", "the form is not UTF-8")


def _signed_url(gw: Gateway, request: Request, path: str) -> str:
    url = gw.config.server.base_url() + path
    if request.url.query:
        url += "?" + request.url.query
    return url


async def twilio_voice(gw: Gateway, request: Request) -> Response:
    pairs = await _read_form(request, "webhook")
    if isinstance(pairs, Response):
        return pairs
    url = _signed_url(gw, request, "/twilio/voice")
    status, ctype, payload = await handle_voice_webhook(
        gw, url, dict(pairs), request.headers.get("x-twilio-signature")
    )
    return Response(payload, status_code=status, media_type=ctype)


async def twilio_status(gw: Gateway, request: Request) -> Response:
    """Twilio's status callback for the calls the gateway placed (carriers/twilio_outbound.py)."""
    from appbridge.carriers.twilio.status import handle_status_callback
    from appbridge.carriers.twilio_outbound import STATUS_PATH

    pairs = await _read_form(request, "callback")
    if isinstance(pairs, Response):
        return pairs
    url = _signed_url(gw, request, STATUS_PATH)
    status, ctype, payload = await handle_status_callback(
        gw, url, pairs, request.headers.get("x-twilio-signature")
    )
    return Response(payload, status_code=status, media_type=ctype)


async def update_call(gw: Gateway, request: Request) -> Response:
    """The Twilio-compatible hang-up (http/twilio_rest.py). Clustered, a call held by another
    node is hung up there: the request, its credentials included, goes to the owner's internal
    route and its answer comes back unchanged (docs/scaling.md)."""
    cluster = gw.cluster
    call_sid = request.path_params["call_sid"]
    if cluster is None or gw.registry.get(call_sid) is not None:
        return await twilio_rest.update_call(gw, request)
    if not twilio_rest._credentials_ok(gw, request.headers.get("authorization")):
        return await twilio_rest.update_call(gw, request)  # its 401, as on one node
    try:
        node = await cluster.locate(call_sid)
    except RedisUnavailable:
        return twilio_rest.twilio_error(
            503, 20503, "the call is not on this node and the cluster directory is unreachable"
        )
    if node is None or node.node_id == cluster.node_id:
        return await twilio_rest.update_call(gw, request)  # its 404
    headers = {"authorization": request.headers.get("authorization", "")}
    content_type = request.headers.get("content-type")
    if content_type:
        headers["content-type"] = content_type
    return await forward(
        cluster,
        node,
        "POST",
        INTERNAL_PREFIX + request.url.path,
        body=await request.body(),
        headers=headers,
    )


def twilio_routes(gw: Gateway) -> list[BaseRoute]:
    return [
        Route("/twilio/voice", partial(twilio_voice, gw), methods=["POST"], name="twilio_voice"),
        Route("/twilio/status", partial(twilio_status, gw), methods=["POST"], name="twilio_status"),
        Route(
            TWILIO_CALL_PATH,
            partial(update_call, gw),
            methods=["POST"],
            name="twilio_update_call",
        ),
        Route(
            TWILIO_CALL_PATH,
            twilio_rest.method_not_allowed,
            methods=["GET", "PUT", "DELETE", "PATCH"],
        ),
        WebSocketRoute("/twilio/stream", TwilioStreamEndpoint(gw)),
    ]


async def _internal_status(gw: Gateway, request: Request) -> Response:
    """A status callback another node took from Twilio and checked, for a dial placed here
    (cluster/dial_relay.py): the cluster signature stands in for Twilio's."""
    from appbridge.carriers.twilio.status import apply_status

    refused = internal_refusal(
        gw.cluster, request.method, request.url.path, request.headers.get(AUTH_HEADER)
    )
    if refused is not None:
        return refused
    pairs = await _read_form(request, "callback")
    if isinstance(pairs, Response):
        return pairs
    status, ctype, payload = apply_status(gw, request.path_params["dial_id"], pairs)
    return Response(payload, status_code=status, media_type=ctype)


async def _internal_update_call(gw: Gateway, request: Request) -> Response:
    """A hang-up another node forwarded: its credentials came along and are checked as on one
    node, once the cluster signature is (docs/scaling.md)."""
    refused = internal_refusal(
        gw.cluster, request.method, request.url.path, request.headers.get(AUTH_HEADER)
    )
    if refused is not None:
        return refused
    return await twilio_rest.update_call(gw, request)


def internal_twilio_routes(gw: Gateway) -> list[BaseRoute]:
    """The owner's half of a forwarded Twilio-compatible hang-up and of a forwarded status
    callback, with ``[cluster]`` only."""
    if gw.config.cluster is None:
        return []
    path = INTERNAL_PREFIX + TWILIO_CALL_PATH
    return [
        Route(path, partial(_internal_update_call, gw), methods=["POST"]),
        Route(STATUS_ROUTE, partial(_internal_status, gw), methods=["POST"]),
    ]
