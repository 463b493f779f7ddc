"""RFC 3515 REFER from the gateway: the referrer's side of a ``transfer`` with mode ``refer``.

Theory of operation
-------------------
The gateway asks the remote party of a call (the caller of an inbound call, the callee of an
outbound one) to call ``target`` itself: a REFER inside the call's dialog with
``Refer-To: <sip:...>`` (RFC 3515 §2.1) and ``Referred-By`` our contact (RFC 3892). The REFER
creates an implicit subscription in that dialog; the referee reports progress with NOTIFYs
(``Event: refer``, a ``message/sipfrag`` body holding the status line of its INVITE to the
target, RFC 3515 §2.4.4-2.4.5), each of which we answer 200 (§2.4.4).

:class:`ReferMachine` is the sans-I/O core of one such transfer. Inputs, each with ``now``:

- the final response to the REFER (``on_response``): 2xx (normally 202) starts the wait for a
  final NOTIFY, 300-699 fails;
- no response at all (``on_timeout``: Timer F or B of the transaction layer) fails;
- each NOTIFY (``on_notify``, which says what to answer it): a sipfrag 1xx is progress, 2xx is
  success, 300 or more fails; ``Subscription-State: terminated`` without a final status fails;
- time (``next_deadline``/``on_timer``): no final NOTIFY within :data:`NOTIFY_WAIT_S` fails.

Its :attr:`ReferMachine.outcome` is set once, success or failure with a message for the app.
After success the caller of this module ends the call with a BYE (docs/sip.md, "Transfers").

:class:`ReferClient` is the thin asyncio glue: it keeps the machines of REFERs in flight by
Call-ID, receives their messages from the SIP transaction user, resolves one future per REFER and
takes part in the transport's single timer (``next_deadline``/``on_timer``), so every timing
rule is exercised in virtual time by the unit tests.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.dialog import Dialog, DialogError
from appbridge.carriers.sip.headers import SipParseError, SipUri, canonical_name, is_token
from appbridge.carriers.sip.message import Request, Response

log = logging.getLogger(__name__)

NOTIFY_WAIT_S = 30.0  # a final NOTIFY must arrive this long after the REFER was accepted
SIPFRAG_TYPE = "message/sipfrag"
E164_RE = re.compile(r"\+[1-9][0-9]{1,14}")
_SIPFRAG_STATUS_RE = re.compile(r"\s*SIP/2\.0\s+([1-6][0-9]{2})\b")
# RFC 3261 §19.1.1: hname/hvalue are hnv-unreserved / unreserved / escaped.
_HNV_SAFE = "-_.!~*'()[]/?:+$"
# Header fields a caller of this module may never set: they make the message or its dialog.
CORE_HEADERS = frozenset(
    {
        "via",
        "call-id",
        "cseq",
        "from",
        "to",
        "contact",
        "max-forwards",
        "route",
        "record-route",
        "refer-to",
        "referred-by",
        "event",
        "subscription-state",
        "authorization",
        "proxy-authorization",
    }
)


def safe_headers(headers: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """The app's ``headers`` that can travel as SIP header fields (docs/protocol-session-v1.md,
    ``transfer``).

    A name that is not an RFC 3261 token, a value with CR, LF or NUL (it would split the
    message), a core header (Via, Call-ID, CSeq, From, To, Contact...) or any ``Content-*``
    header would break the message or its dialog: each is left out with a warning."""
    out: list[tuple[str, str]] = []
    for name, value in (headers or {}).items():
        canonical = canonical_name(name) if isinstance(name, str) else ""
        lower = canonical.lower()
        if (
            not isinstance(name, str)
            or not isinstance(value, str)
            or not is_token(name)
            or any(ch in value for ch in "\r\n\x00")
            or lower in CORE_HEADERS
            or lower.startswith("content-")
        ):
            log.warning("sip: header %r left out: it would break the SIP message", name)
            continue
        out.append((name, value.strip()))
    return out


def refer_to(
    target: str,
    trunk_host: str | None,
    headers: Mapping[str, str] | None,
    *,
    port: int = 5060,
    transport: str = "udp",
) -> str:
    """The Refer-To value for ``target`` (RFC 3515 §2.1): an E.164 number becomes
    ``sip:+1555...@<trunk host>[:port][;transport=tcp]`` (the referee must reach the trunk
    where the trunk really listens), a ``sip:`` URI is kept as given; ``headers`` ride along as
    escaped URI headers (RFC 3261 §19.1.1) so the referee puts them on its INVITE."""
    if E164_RE.fullmatch(target):
        if not trunk_host:
            raise TransferError("transfer_failed", "no SIP trunk to reach " + target)
        uri = f"sip:{target}@{trunk_host}"
        if port != 5060:
            uri += f":{port}"
        if transport != "udp":
            uri += f";transport={transport}"
    else:
        try:
            parsed = SipUri.parse(target)
        except SipParseError as exc:
            raise TransferError("transfer_failed", f"not a SIP URI: {target!r}") from exc
        if not parsed.is_sip:
            raise TransferError("transfer_failed", f"not a SIP URI: {target!r}")
        uri = target
    pairs = [
        f"{quote(name, safe=_HNV_SAFE)}={quote(value, safe=_HNV_SAFE)}"
        for name, value in safe_headers(headers)
    ]
    if pairs:
        uri += ("&" if "?" in uri else "?") + "&".join(pairs)
    return f"<{uri}>"


def sipfrag_status(body: bytes) -> int | None:
    """The status code of a ``message/sipfrag`` status line (RFC 3420), or None."""
    m = _SIPFRAG_STATUS_RE.match(body.decode("utf-8", "replace"))
    return int(m.group(1)) if m else None


def _token(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


@dataclass(frozen=True, slots=True)
class ReferOutcome:
    success: bool
    message: str


@dataclass
class ReferMachine:
    """One REFER in flight (module doc). Sans-I/O: nothing here reads a clock or sends."""

    sent_at: float
    notify_wait_s: float = NOTIFY_WAIT_S
    accepted: bool = False
    progress: list[int] = field(default_factory=list)  # sipfrag statuses seen, in order
    outcome: ReferOutcome | None = None
    _deadline: float | None = None

    def on_response(self, status: int, now: float) -> None:
        if self.outcome is not None or status < 200:
            return
        if status < 300:
            self._accept(now)
        else:
            self._finish(False, f"the REFER was rejected with SIP {status}")

    def on_timeout(self) -> None:
        """Timer F (B): the REFER got no final response (RFC 3261 §17.1.2.2)."""
        self._finish(False, "no response to the REFER (SIP 408)")

    def on_notify(
        self,
        *,
        event: str | None,
        subscription_state: str | None,
        content_type: str | None,
        body: bytes,
        now: float,
    ) -> int:
        """One NOTIFY of the implicit subscription; returns the status to answer it with."""
        if _token(event) != "refer":
            return 489  # Bad Event (RFC 6665 §8.3.2)
        if not self.accepted:
            self._accept(now)  # a NOTIFY may overtake the 202 (RFC 3515 §2.4.4)
        status = sipfrag_status(body) if _token(content_type) == SIPFRAG_TYPE else None
        if status is not None:
            self.progress.append(status)
            if 200 <= status < 300:
                self._finish(True, f"the target answered (SIP {status})")
            elif status >= 300:
                self._finish(False, f"the transfer target answered SIP {status}")
        if _token(subscription_state) == "terminated":
            self._finish(False, "the referee ended the subscription without a final status")
        return 200

    def next_deadline(self) -> float | None:
        return self._deadline if self.outcome is None else None

    def on_timer(self, now: float) -> None:
        if self._deadline is not None and now >= self._deadline:
            self._finish(
                False, f"no final NOTIFY within {self.notify_wait_s:g} s of the REFER's acceptance"
            )

    def abort(self, message: str) -> None:
        self._finish(False, message)

    def _accept(self, now: float) -> None:
        self.accepted = True
        self._deadline = now + self.notify_wait_s

    def _finish(self, success: bool, message: str) -> None:
        if self.outcome is None:
            self.outcome = ReferOutcome(success, message)
            self._deadline = None


@dataclass(eq=False)
class _Refer:
    machine: ReferMachine
    dialog: Dialog
    future: asyncio.Future[ReferOutcome]
    seq: int


Responder = Callable[[Request, Any, int], None]  # (request, its transport peer, status)


class ReferClient:
    """REFERs in flight, by Call-ID (module doc). ``respond(request, peer, status)`` answers a
    NOTIFY;
    ``rearm()`` asks the transport to re-arm its one timer."""

    def __init__(
        self, respond: Responder, rearm: Callable[[], None], notify_wait_s: float = NOTIFY_WAIT_S
    ) -> None:
        self._respond = respond
        self._rearm = rearm
        self.notify_wait_s = notify_wait_s
        self.active: dict[str, _Refer] = {}

    async def refer(
        self,
        dialog: Dialog,
        send: Callable[[Request], None],
        *,
        refer_to_value: str,
        referred_by: str,
        now: float,
    ) -> ReferOutcome:
        """Send the REFER in ``dialog`` and wait for the outcome (success or not)."""
        call_id = dialog.call_id
        if call_id in self.active:
            raise TransferError("transfer_failed", "a REFER is already in progress on this call")
        try:
            request = dialog.create_request(
                "REFER", headers=[("Refer-To", refer_to_value), ("Referred-By", referred_by)]
            )
        except ValueError as exc:
            raise TransferError("transfer_failed", "the call's dialog has ended") from exc
        future: asyncio.Future[ReferOutcome] = asyncio.get_running_loop().create_future()
        entry = _Refer(ReferMachine(now, self.notify_wait_s), dialog, future, request.cseq.seq)
        self.active[call_id] = entry
        try:
            send(request)
            self._rearm()
            return await future
        finally:
            if self.active.get(call_id) is entry:
                del self.active[call_id]

    def on_message(self, message: Request | Response, peer: Any, now: float) -> bool:
        """A REFER response or a NOTIFY of a REFER in flight; False: not ours."""
        entry = self.active.get(message.call_id)
        if entry is None:
            return False
        if isinstance(message, Response):
            if message.cseq.method != "REFER" or message.cseq.seq != entry.seq:
                return False
            entry.machine.on_response(message.status, now)
        else:
            if message.method != "NOTIFY":
                return False
            try:
                entry.dialog.on_request(message)
            except DialogError as exc:
                self._respond(message, peer, exc.status)
                return True
            status = entry.machine.on_notify(
                event=message.headers.get("Event"),
                subscription_state=message.headers.get("Subscription-State"),
                content_type=message.content_type,
                body=message.body,
                now=now,
            )
            self._respond(message, peer, status)
        self._settle(entry)
        return True

    def on_timeout(self, request: Request) -> bool:
        entry = self.active.get(request.call_id)
        if entry is None or request.method != "REFER":
            return False
        entry.machine.on_timeout()
        self._settle(entry)
        return True

    def abort(self, call_id: str, message: str) -> None:
        """The call's dialog ended (a BYE) while its REFER was in flight: it failed."""
        entry = self.active.get(call_id)
        if entry is not None:
            entry.machine.abort(message)
            self._settle(entry)

    def next_deadline(self) -> float | None:
        return min(
            (d for e in self.active.values() if (d := e.machine.next_deadline()) is not None),
            default=None,
        )

    def on_timer(self, now: float) -> None:
        for entry in list(self.active.values()):
            entry.machine.on_timer(now)
            self._settle(entry)

    def _settle(self, entry: _Refer) -> None:
        outcome = entry.machine.outcome
        if outcome is not None and not entry.future.done():
            entry.future.set_result(outcome)
        self._rearm()
