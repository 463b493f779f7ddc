"""The Twilio-compatible hang-up endpoint (docs/protocol-twilio.md, "The REST endpoint, exactly").

``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with ``Status=completed`` and
HTTP Basic ``account_sid:auth_token`` of ``[http]``, so that apps built for Twilio (Pipecat's
``auto_hang_up``) end their calls unchanged. Checked in this order: credentials (401, code
20003), then the call — unknown, ended, or of an app whose ``workspace_ref`` is not the URL's
AccountSid (404, code 20404) — then the request itself (400). Every answer is JSON with
``Content-Type: application/json``; nothing here can answer 500.

After a 200 the call ends as an app hang-up: the app gets ``stop`` and its socket is closed, in
that order, and only once the 200 has been sent (a Starlette background task runs after the
response is written).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from email.utils import formatdate
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.gateway import Gateway

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024
API_VERSION = "2010-04-01"


def twilio_error(status: int, code: int, message: str) -> JSONResponse:
    return JSONResponse(
        {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        },
        status_code=status,
    )


def _credentials_ok(gw: Gateway, header: str | None) -> bool:
    http = gw.config.http
    if http is None or not header:
        return False
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, sep, password = decoded.partition(":")
    if not sep:
        return False
    user_ok = hmac.compare_digest(user.encode(), http.account_sid.encode())
    password_ok = hmac.compare_digest(password.encode(), http.auth_token.encode())
    return user_ok and password_ok


def _rfc2822(wall: float | None) -> str | None:
    return formatdate(wall, usegmt=True) if wall is not None else None


def call_resource(
    call: Call, account_sid: str, status: str, ended_wall: float | None
) -> dict[str, Any]:
    start = call.started_wall
    duration = str(int(max(0.0, (ended_wall or call.gw.clock.wall()) - start)))
    return {
        "sid": call.call_ref,
        "account_sid": account_sid,
        "to": call.to,
        "from": call.from_,
        "status": status,
        "direction": "inbound" if call.direction == "inbound" else "outbound-api",
        "date_created": _rfc2822(start),
        "date_updated": _rfc2822(ended_wall or call.gw.clock.wall()),
        "start_time": _rfc2822(start),
        "end_time": _rfc2822(ended_wall),
        "duration": duration,
        "api_version": API_VERSION,
        "uri": f"/{API_VERSION}/Accounts/{account_sid}/Calls/{call.call_ref}.json",
    }


async def update_call(gw: Gateway, request: Request) -> Response:
    account_sid = request.path_params["account_sid"]
    call_sid = request.path_params["call_sid"]
    if not _credentials_ok(gw, request.headers.get("authorization")):
        return twilio_error(401, 20003, "Authentication Error - invalid username")
    path = f"/{API_VERSION}/Accounts/{account_sid}/Calls/{call_sid}.json"
    call = gw.registry.get(call_sid)
    if call is None or call.over or call.app.workspace_ref != account_sid:
        return twilio_error(404, 20404, f"The requested resource {path} was not found")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return twilio_error(400, 20001, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    try:
        form = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return twilio_error(400, 20001, "the request body is not a UTF-8 form")
    status = form.get("Status")
    if "Twiml" in form or "Url" in form:
        return twilio_error(
            400, 20001, "TwiML and Url updates are not supported: this endpoint only hangs up"
        )
    if status not in ("completed", "canceled"):
        return twilio_error(400, 20001, f"Status must be 'completed', not {status!r}")
    ended_wall = gw.clock.wall()
    resource = call_resource(call, account_sid, "completed", ended_wall)
    log.info("call %s: hang-up through the Twilio-compatible endpoint", call_sid)

    async def hang_up() -> None:
        # A function defined here, not ``call.end`` itself: Starlette runs a background task in a
        # thread unless ``inspect`` calls it a coroutine function, which it does not for a
        # compiled one (appbridge/compiled.py).
        await call.end("app_hangup")

    return JSONResponse(resource, background=BackgroundTask(hang_up))


async def method_not_allowed(request: Request) -> Response:
    return twilio_error(405, 20004, "Method not allowed")
