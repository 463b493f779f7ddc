"""Twilio, played from the outside: the caller's leg of a call and the REST API.

The gateway meets Twilio as its carrier (docs/protocol-twilio.md, "Carrier side"): Twilio POSTs
the voice webhook, reads the TwiML answer, opens the bidirectional Media Stream that
``<Connect><Stream>`` names and plays back what the gateway sends. That part ships with the test
caller (:mod:`appbridge.caller.twilio_carrier`, :mod:`appbridge.caller.twilio_stream`) and is
re-exported here under the tests' names; :class:`FakeTwilio` adds :class:`FakeTwilioRest`, which
answers the call-update endpoint the gateway uses to hang up or transfer.

These fakes speak the wire format with json, base64 and hmac only, never through the gateway's
own codecs (``appbridge.protocol``/``appbridge.media``), so that a bug in those cannot be mirrored
here and pass unnoticed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from appbridge.caller.twilio_carrier import TwilioCarrier, voice_webhook_form
from appbridge.caller.twilio_stream import (
    FRAME_BYTES,
    FRAME_S,
    ULAW_RATE_HZ,
    Matcher,
    new_sid,
    twilio_signature,
)
from appbridge.caller.twilio_stream import TwilioStreamCall as FakeTwilioCall

__all__ = [
    "FRAME_BYTES",
    "FRAME_S",
    "ULAW_RATE_HZ",
    "FakeTwilio",
    "FakeTwilioCall",
    "FakeTwilioRest",
    "LoopbackServer",
    "Matcher",
    "RestRequest",
    "new_sid",
    "twilio_signature",
    "voice_webhook_form",
]


class FakeTwilio(TwilioCarrier):
    """The test caller's :class:`TwilioCarrier` with an optional fake REST API: every call it
    places is registered there, and calls the gateway places reach the gateway through it."""

    def __init__(
        self,
        gateway_base_url: str,
        *,
        account_sid: str,
        auth_token: str | None,
        public_url: str | None = None,
        rest: FakeTwilioRest | None = None,
        webhook_timeout_s: float = 15.0,
    ) -> None:
        super().__init__(
            gateway_base_url,
            account_sid=account_sid,
            auth_token=auth_token,
            public_url=public_url,
            webhook_timeout_s=webhook_timeout_s,
        )
        self.rest = rest
        if rest is not None:
            rest.twilio = self  # calls the gateway places reach it through these addresses

    def _answered(self, call: FakeTwilioCall) -> None:
        if self.rest is not None:
            self.rest.register(call)


# ---------------------------------------------------------------------- loopback HTTP server
class _InProcessServer(uvicorn.Server):
    """uvicorn without signal capture: a peer inside a test must not take over Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class LoopbackServer:
    """Run an ASGI app with uvicorn inside the current event loop, on a free loopback port.

    ``ws`` picks uvicorn's WebSocket implementation ("none" for plain HTTP; "websockets-sansio"
    for apps with WebSocket routes).
    """

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, ws: str = "none"):
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            ws=ws,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = _InProcessServer(self._config)
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="loopback-uvicorn")
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("uvicorn stopped during start-up")
            await asyncio.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(SystemExit):
            await self._task
        self._task = None


# ---------------------------------------------------------------------- REST API
def _rfc2822(unix_s: float | None) -> str | None:
    if unix_s is None:
        return None
    return format_datetime(datetime.fromtimestamp(unix_s, UTC).replace(microsecond=0))


@dataclass
class RestRequest:
    """One request the fake REST API received."""

    method: str
    path: str
    form: dict[str, str] = field(default_factory=dict)
    auth_ok: bool = False
    status: int = 0


class FakeTwilioRest:
    """Twilio's call-update REST endpoint on loopback, which the gateway uses to hang up and
    transfer Twilio calls.

    ``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``, form-encoded. Checked in
    Twilio's order: HTTP Basic (401, code 20003), then the account and a registered call (404,
    code 20404). ``Status=completed`` ends a live call; ``Twiml`` or ``Url`` moves it on. Either
    way the call leaves ``<Connect><Stream>``, so its stream gets ``stop`` and is closed, after the
    answer is sent. Every answer is JSON.
    """

    CALL_PATH = "/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"
    CALLS_PATH = "/2010-04-01/Accounts/{account_sid}/Calls.json"

    def __init__(self, *, account_sid: str, auth_token: str, host: str = "127.0.0.1") -> None:
        from appbridge.testing.fake_twilio_outbound import FakeTwilioDialer

        self.account_sid = account_sid
        self.auth_token = auth_token
        self.requests: list[RestRequest] = []
        self.transfers: list[tuple[str, str]] = []
        self._calls: dict[str, FakeTwilioCall] = {}
        self._fail: tuple[int, int] | None = None
        #: Calls the gateway creates (``Calls.json``): scripts per ``To`` number, and the calls.
        self.dialer = FakeTwilioDialer(self)
        #: Where the gateway is (set by :class:`FakeTwilio`): streams and callbacks go there.
        self.twilio: FakeTwilio | None = None
        app = Starlette(
            routes=[
                Route(self.CALL_PATH, self._call_endpoint, methods=["GET", "POST"]),
                Route(self.CALLS_PATH, self._calls_endpoint, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_error},  # type: ignore[dict-item]
        )
        self._server = LoopbackServer(app, host=host)

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def register(self, call: FakeTwilioCall) -> None:
        self._calls[call.call_sid] = call

    def fail_next(self, status: int, code: int) -> None:
        """Make the next request, whatever it is, fail with a Twilio-shaped error."""
        self._fail = (status, code)

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self.dialer.aclose()
        await self._server.stop()

    @staticmethod
    def error(status: int, code: int, message: str) -> JSONResponse:
        body = {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        }
        return JSONResponse(body, status_code=status)

    def _auth_ok(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user_ok = hmac.compare_digest(user.encode(), self.account_sid.encode())
        password_ok = hmac.compare_digest(password.encode(), self.auth_token.encode())
        return user_ok and password_ok

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        auth_ok = self._auth_ok(request.headers.get("authorization"))
        self.requests.append(
            RestRequest(request.method, request.url.path, {}, auth_ok, exc.status_code)
        )
        code = 20404 if exc.status_code == 404 else 20001
        return self.error(exc.status_code, code, f"{exc.detail}: {request.url.path}")

    def resource(self, call: FakeTwilioCall) -> dict[str, Any]:
        """The Call resource as Twilio renders it (RFC 2822 dates, duration as a string)."""
        uri = f"/2010-04-01/Accounts/{self.account_sid}/Calls/{call.call_sid}.json"
        ended = call.ended_wall if call.status == "completed" else None
        duration = None if ended is None else str(int(ended - call.started_wall))
        return {
            "sid": call.call_sid,
            "account_sid": call.account_sid,
            "to": call.to,
            "from": call.from_,
            "status": call.status,
            "direction": call.direction,
            "date_created": _rfc2822(call.started_wall),
            "date_updated": _rfc2822(ended or call.started_wall),
            "start_time": _rfc2822(call.started_wall),
            "end_time": _rfc2822(ended),
            "duration": duration,
            "api_version": "2010-04-01",
            "parent_call_sid": None,
            "price": None,
            "uri": uri,
        }

    async def _call_endpoint(self, request: Request) -> Response:
        form: dict[str, str] = {}
        if request.method == "POST":
            # Parsed by hand: form-encoded bodies need no python-multipart.
            form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
        record = RestRequest(
            request.method,
            request.url.path,
            form,
            self._auth_ok(request.headers.get("authorization")),
        )
        self.requests.append(record)
        response = self._answer(request, record)
        record.status = response.status_code
        return response

    async def _calls_endpoint(self, request: Request) -> Response:
        """Calls create (fake_twilio_outbound.py): Twilio's checks, in its order."""
        pairs = parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
        record = RestRequest(
            request.method,
            request.url.path,
            dict(pairs),
            self._auth_ok(request.headers.get("authorization")),
        )
        self.requests.append(record)
        if self._fail is not None:
            http_status, code = self._fail
            self._fail = None
            response: Response = self.error(http_status, code, f"Injected failure {code}")
        elif not record.auth_ok:
            response = self.error(401, 20003, "Authentication Error - invalid username")
            response.headers["WWW-Authenticate"] = 'Basic realm="Twilio API"'
        else:
            response = self.dialer.create(request.path_params["account_sid"], pairs)
        record.status = response.status_code
        return response

    def _answer(self, request: Request, record: RestRequest) -> Response:
        if self._fail is not None:
            http_status, code = self._fail
            self._fail = None
            return self.error(http_status, code, f"Injected failure {code}")
        if not record.auth_ok:
            response = self.error(401, 20003, "Authentication Error - invalid username")
            response.headers["WWW-Authenticate"] = 'Basic realm="Twilio API"'
            return response
        call = self._calls.get(request.path_params["call_sid"])
        if request.path_params["account_sid"] != self.account_sid or call is None:
            path = request.url.path
            return self.error(404, 20404, f"The requested resource {path} was not found")
        if request.method == "GET":
            return JSONResponse(self.resource(call))
        status = record.form.get("Status")
        moves_on = "Twiml" in record.form or "Url" in record.form
        if status not in (None, "completed", "canceled"):
            # The fake's own choice of code for a value Twilio would refuse.
            return self.error(400, 20001, f"Invalid Status: {status}")
        if status == "completed" or moves_on:
            call.updates.append(dict(record.form))
        if not moves_on and self.dialer.on_update(call, status):
            return JSONResponse(self.resource(call))  # a call we placed, canceled while ringing
        if call.status != "in-progress":
            if moves_on:
                return self.error(400, 21220, "Call is not in-progress. Cannot redirect.")
            return JSONResponse(self.resource(call))
        # The stream is stopped once the answer has gone out, as Twilio answers then acts.
        if status == "completed":
            call.status = "completed"
            call.ended_wall = time.time()
            return JSONResponse(
                self.resource(call), background=BackgroundTask(call._end_stream, "rest")
            )
        if moves_on:
            self.transfers.append((call.call_sid, record.form.get("Twiml") or record.form["Url"]))
            end = BackgroundTask(call._end_stream, "transfer")
            return JSONResponse(self.resource(call), background=end)
        # Status=canceled only affects queued or ringing calls: a live call is left as is.
        return JSONResponse(self.resource(call))
