"""Twilio placing the calls the gateway asks for, played from the outside.

:class:`FakeTwilioDialer` is the Calls-create half of :class:`~.fake_twilio.FakeTwilioRest`:
``POST /2010-04-01/Accounts/{AccountSid}/Calls.json``, form-encoded, HTTP Basic. It answers as
Twilio documents: 201 with the Call resource (status ``queued``, direction ``outbound-api``), or a
Twilio JSON error (401 code 20003, 404 code 20404, 400 for a missing ``To``/``From``/``Twiml``).
Then it acts as Twilio would, per the called number's :class:`Callee` script (a test's map of
``To`` numbers, else :attr:`FakeTwilioDialer.default_callee`):

* status callbacks to ``StatusCallback``, signed with ``X-Twilio-Signature`` over the URL and the
  form (docs/protocol-twilio.md), numbered by ``SequenceNumber`` from 0: ``initiated``, ``ringing``,
  then ``in-progress`` and ``completed``, or ``busy`` / ``no-answer`` / ``failed``, or
  ``canceled`` when the gateway cancels while it rings (REST ``Status=canceled``/``completed``);
* on answer, the TwiML runs: ``<Connect><Stream>`` opens the Media Stream with the signed upgrade,
  ``connected`` and ``start`` (with the ``<Parameter>``\\ s as ``customParameters``), media both
  ways; the stream is a :class:`~.fake_twilio.FakeTwilioCall`, so a test plays and records the
  callee's audio exactly as it does a caller's.

Only inline ``Twiml`` is run (a ``Url`` is refused with 400: the fake fetches nothing). Timing is
real, as the network's other end: ``after_ms`` and Twilio's ``Timeout`` are waited in real time.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import TYPE_CHECKING, Any, Literal

import httpx
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response

from appbridge.testing.fake_twilio import FakeTwilioCall, new_sid, twilio_signature

if TYPE_CHECKING:
    from appbridge.testing.fake_twilio import FakeTwilioRest

__all__ = ["Callee", "FakeOutboundCall", "FakeTwilioDialer", "StatusCallbackRecord"]

CalleeAction = Literal["answer", "busy", "no-answer", "failed", "ring"]
_NUMBER_RE = re.compile(r"\+[1-9][0-9]{1,14}")
_RINGING = frozenset({"queued", "initiated", "ringing"})
#: Twilio's default ``Timeout`` (seconds of ringing before ``no-answer``).
DEFAULT_TIMEOUT_S = 60


@dataclass
class Callee:
    """How a called number behaves.

    ``answer``: picks up after ``after_ms`` and the TwiML runs. ``busy``, ``no-answer``,
    ``failed``: that final status after ``after_ms``. ``ring``: rings until Twilio's ``Timeout``
    (the create request's), then ``no-answer``, unless canceled first.
    """

    action: CalleeAction = "answer"
    after_ms: int = 50
    ring: bool = True  # report ``ringing`` before the outcome
    pace: bool = True
    continuous_media: bool = False


@dataclass
class StatusCallbackRecord:
    """One status callback the fake posted, and how the gateway answered it."""

    status: str
    form: dict[str, str]
    http_status: int | None = None
    error: str | None = None


@dataclass(eq=False)
class FakeOutboundCall:
    """One call the gateway created: its request, its callbacks and (once answered) its stream."""

    call: FakeTwilioCall
    request: dict[str, list[str]]
    callee: Callee
    callbacks: list[StatusCallbackRecord] = field(default_factory=list)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _seq: int = 0

    @property
    def status(self) -> str:
        return self.call.status

    def param(self, name: str) -> str | None:
        """The last value of a form field of the create request."""
        values = self.request.get(name)
        return values[-1] if values else None

    async def wait_for_status(self, status: str, timeout: float = 5.0) -> StatusCallbackRecord:  # noqa: ASYNC109
        """The first callback with ``CallStatus == status`` that the gateway has answered."""
        async with asyncio.timeout(timeout):
            while True:
                for record in self.callbacks:
                    if record.status == status and (record.http_status or record.error):
                        return record
                self._changed.clear()
                await self._changed.wait()

    async def wait_stream(self, timeout: float = 5.0) -> FakeTwilioCall:  # noqa: ASYNC109
        """The answered call, once its Media Stream is open."""
        await self.wait_until(lambda: self.call.has_stream, timeout)
        return self.call

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


def _rfc2822(unix_s: float) -> str:
    return format_datetime(datetime.fromtimestamp(unix_s, UTC).replace(microsecond=0))


class FakeTwilioDialer:
    """The Calls-create endpoint and what Twilio does after it (module doc)."""

    def __init__(self, rest: FakeTwilioRest) -> None:
        self.rest = rest
        self.callees: dict[str, Callee] = {}
        self.default_callee = Callee()
        self.calls: list[FakeOutboundCall] = []
        self._new = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    def find(self, call_sid: str) -> FakeOutboundCall | None:
        return next((out for out in self.calls if out.call.call_sid == call_sid), None)

    async def next_call(self, timeout: float = 5.0) -> FakeOutboundCall:  # noqa: ASYNC109
        """The next call created after the ones already returned by this method."""
        seen = getattr(self, "_handed_out", 0)
        async with asyncio.timeout(timeout):
            while len(self.calls) <= seen:
                self._new.clear()
                await self._new.wait()
        self._handed_out = seen + 1
        return self.calls[seen]

    # -- the endpoint ----------------------------------------------------------------------------
    def create(self, account_sid: str, pairs: list[tuple[str, str]]) -> Response:
        """Answer a Calls-create request whose credentials were already checked."""
        rest = self.rest
        if account_sid != rest.account_sid:
            path = f"/2010-04-01/Accounts/{account_sid}/Calls.json"
            return rest.error(404, 20404, f"The requested resource {path} was not found")
        form: dict[str, list[str]] = {}
        for name, value in pairs:
            form.setdefault(name, []).append(value)
        to = (form.get("To") or [""])[-1]
        from_ = (form.get("From") or [""])[-1]
        if not to:
            return rest.error(400, 21201, "No 'To' number is specified")
        if not from_:
            return rest.error(400, 21213, "No 'From' number is specified")
        if _NUMBER_RE.fullmatch(to) is None and not to.startswith(("sip:", "client:")):
            return rest.error(400, 21211, f"Invalid 'To' Phone Number: {to}")
        if "Url" in form:
            return rest.error(400, 21205, "Url is not supported by this fake; send Twiml")
        if "Twiml" not in form:
            return rest.error(400, 21205, "Url or Twiml is required")
        call = FakeTwilioCall(
            call_sid=new_sid("CA"), account_sid=rest.account_sid, from_=from_, to=to
        )
        callee = self.callees.get(to, self.default_callee)
        call.pace = callee.pace
        call.continuous_media = callee.continuous_media
        call.direction = "outbound-api"
        call.status = "queued"
        out = FakeOutboundCall(call=call, request=form, callee=callee)
        rest.register(call)
        self.calls.append(out)
        self._new.set()
        return JSONResponse(
            rest.resource(call), status_code=201, background=BackgroundTask(self._start, out)
        )

    def on_update(self, call: FakeTwilioCall, status: str | None) -> bool:
        """A REST update of a call we placed that is still ringing: ``canceled`` (or
        ``completed``) stops it. True when handled here."""
        out = self.find(call.call_sid)
        if out is None or call.status not in _RINGING or status not in ("canceled", "completed"):
            return False
        if out.task is not None:
            out.task.cancel()
        call.status = "canceled"
        call.ended_wall = time.time()
        self._spawn(self._callback(out, "canceled"))
        return True

    # -- acting as Twilio -------------------------------------------------------------------------
    async def _start(self, out: FakeOutboundCall) -> None:
        out.task = asyncio.get_running_loop().create_task(
            self._run(out), name=f"fake-twilio-dial-{out.call.call_sid}"
        )
        self._tasks.add(out.task)
        out.task.add_done_callback(self._tasks.discard)

    async def _run(self, out: FakeOutboundCall) -> None:
        call, callee = out.call, out.callee
        call.status = "initiated"
        await self._callback(out, "initiated")
        call.status = "ringing"
        if callee.ring:
            await self._callback(out, "ringing")
        if callee.action == "ring":
            raw = out.param("Timeout") or ""
            await asyncio.sleep(int(raw) if raw.isdigit() else DEFAULT_TIMEOUT_S)
            await self._final(out, "no-answer")
            return
        await asyncio.sleep(callee.after_ms / 1000)
        if callee.action != "answer":
            await self._final(out, callee.action)
            return
        call.status = "in-progress"
        call.started_wall = time.time()
        await self._callback(out, "in-progress")
        call._apply_twiml((out.param("Twiml") or "").encode())
        twilio = self.rest.twilio
        if call.stream_url and twilio is not None:
            await call._open_stream(twilio.dial_url_for(call.stream_url), self.rest.auth_token)
            out._changed.set()
            if call.has_stream:
                await call.wait_closed(timeout=3600)
        # With no stream (or once it closed) the TwiML is over and Twilio hangs up.
        await self._final(out, "completed")

    async def _final(self, out: FakeOutboundCall, status: str) -> None:
        out.call.status = status
        out.call.ended_wall = out.call.ended_wall or time.time()
        await self._callback(out, status)

    async def _callback(self, out: FakeOutboundCall, status: str) -> None:
        """POST the status callback, signed over its public URL (docs/protocol-twilio.md)."""
        call = out.call
        url = out.param("StatusCallback")
        form = {
            "AccountSid": call.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call.call_sid,
            "CallStatus": status,
            "Called": call.to,
            "Caller": call.from_,
            "CallbackSource": "call-progress-events",
            "Direction": "outbound-api",
            "From": call.from_,
            "SequenceNumber": str(out._seq),
            "Timestamp": _rfc2822(time.time()),
            "To": call.to,
        }
        out._seq += 1
        if status in ("completed", "busy", "no-answer", "failed", "canceled"):
            ended = call.ended_wall or time.time()
            answered = status == "completed"
            form["CallDuration"] = str(int(ended - call.started_wall)) if answered else "0"
        record = StatusCallbackRecord(status=status, form=form)
        out.callbacks.append(record)
        twilio = self.rest.twilio
        if not url or twilio is None:
            record.error = "no StatusCallback (or no gateway) to post to"
            out._changed.set()
            return
        target = twilio.dial_url_for(url)
        target = "http" + target[2:]  # ws(s):// → http(s)://
        headers = {"X-Twilio-Signature": twilio_signature(self.rest.auth_token, url, form)}
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
                resp = await client.post(target, data=form, headers=headers)
            record.http_status = resp.status_code
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        out._changed.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop every script and hang up every stream, so nothing outlives a test."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(out.call.aclose() for out in self.calls), return_exceptions=True)
