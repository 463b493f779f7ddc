"""Transfers on SIP calls: the new party's leg (``dial_party``) and REFER (``refer``).

Theory of operation
-------------------
The call engine (``calls/transfer.py``) asks the call's :class:`~.leg.SipLeg` for a transfer;
the leg hands the work to its :class:`SipCallSignalling`, built by the call flow that owns the
dialog (``inbound.py`` for inbound calls, ``outbound.py`` for ``POST /v1/calls``).

- **Which trunk** (docs/sip.md, "Transfers"): an E.164 target goes through the call's
  own trunk (the trunk an inbound INVITE came from, matched by source address; the trunk an
  outbound call used), else the first trunk; a ``sip:user@host`` target through the trunk whose
  ``host`` it is (the engine already refused other hosts).
- **dial_party**: the gateway's UAC (``uac.py``) places the INVITE: Request-URI user = the E.164
  number or the URI's user, From user = ``caller_id``, the app's ``headers`` as header fields
  (minus those that would break the message, ``refer.safe_headers``). It returns the answered
  leg; busy, no answer within ``timeout_s`` or any failure raise ``TransferError``
  (``transfer_failed``) with the SIP status; a cancelled await CANCELs (or BYEs a late 2xx).
- **refer**: RFC 3515 REFER in the call's dialog (``refer.py``); on success our BYE ends the
  call (docs/sip.md, "`refer`: the far end calls the new party").
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from appbridge.calls.carrier_leg import TransferError
from appbridge.carriers.sip.dialog import Dialog, DialogState
from appbridge.carriers.sip.headers import SipParseError, SipUri
from appbridge.carriers.sip.leg import SipLeg
from appbridge.carriers.sip.message import Request
from appbridge.carriers.sip.refer import E164_RE, refer_to, safe_headers
from appbridge.carriers.sip.uac import SipUac, UacDial, UacError

if TYPE_CHECKING:
    from appbridge.config import SipTrunk
    from appbridge.protocol.session_v1 import EndReason

log = logging.getLogger(__name__)

OUTCOME_TEXT = {
    "busy": "the party is busy",
    "no-answer": "the party did not answer",
    "failed": "the call to the party failed",
    "canceled": "the call to the party was canceled",
}


def trunk_for_source(trunks: Sequence[SipTrunk], host: str | None) -> SipTrunk | None:
    """The trunk an inbound INVITE came from: its ``host`` or one of its ``allow`` networks."""
    if not host:
        return None
    for trunk in trunks:
        if trunk.host == host:
            return trunk
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    for trunk in trunks:
        for cidr in trunk.allow:
            try:
                if addr in ipaddress.ip_network(cidr, strict=False):
                    return trunk
            except ValueError:
                continue
    return None


def route_target(
    trunks: Sequence[SipTrunk], own: SipTrunk | None, target: str
) -> tuple[SipTrunk, str]:
    """The trunk and Request-URI user for a transfer ``target`` (module doc)."""
    if E164_RE.fullmatch(target):
        trunk = own or (trunks[0] if trunks else None)
        if trunk is None:
            raise TransferError("transfer_failed", "no SIP trunk is configured to reach " + target)
        return trunk, target
    try:
        uri = SipUri.parse(target)
    except SipParseError as exc:
        raise TransferError(
            "transfer_failed", f"not an E.164 number or SIP URI: {target!r}"
        ) from exc
    host = uri.host.lower()
    trunk = next((t for t in trunks if t.host.lower() == host), None)
    if not uri.is_sip or trunk is None or not uri.user:
        raise TransferError("transfer_failed", f"{target!r} is not on a configured SIP trunk")
    return trunk, uri.user


class _PartyOwner:
    """A transfer waiting for its new party (``uac.DialOwner``)."""

    def __init__(self, label: str, future: asyncio.Future[SipLeg]) -> None:
        self.label = label
        self.future = future

    def wants_answer(self) -> bool:
        return not self.future.done()

    def ringing(self, d: UacDial) -> None:
        log.info("%s: ringing", self.label)

    def answered(self, d: UacDial, leg: SipLeg) -> None:
        if not self.future.done():
            self.future.set_result(leg)

    def failed(self, d: UacDial, outcome: str, status: int | None, reason: EndReason) -> None:
        if self.future.done():
            return
        text = OUTCOME_TEXT.get(outcome, "the call to the party failed")
        detail = f" (SIP {status})" if status is not None else ""
        if outcome == "no-answer" and status is None:
            detail = " in time"
        self.future.set_exception(TransferError("transfer_failed", text + detail))

    def remote_bye(self, d: UacDial) -> None:
        if d.leg is not None:
            d.leg.remote_hangup()


async def dial_party(
    uac: SipUac,
    trunk: SipTrunk,
    to_user: str,
    *,
    caller_id: str,
    headers: Mapping[str, str] | None,
    timeout_s: float,
    label: str,
) -> SipLeg:
    """Place the new party's call and wait for its answer (module doc)."""
    try:
        d = await uac.prepare(
            trunk,
            to_user=to_user,
            from_user=caller_id or "appbridge",
            headers=safe_headers(headers),
        )
    except UacError as exc:
        raise TransferError("transfer_failed", exc.message) from exc
    future: asyncio.Future[SipLeg] = asyncio.get_running_loop().create_future()
    uac.launch(d, _PartyOwner(label, future), timeout_s)
    uac.transport.rearm()
    try:
        return await future
    except asyncio.CancelledError:
        log.info("%s: transfer abandoned; ending the attempt", label)
        uac.abandon(d)
        raise


@dataclass(eq=False)
class SipCallSignalling:
    """What a call's :class:`~.leg.SipLeg` needs for transfers (module doc). ``dialog`` gives
    the call's dialog (None before the answer); ``send`` sends an in-dialog request to the
    remote party; ``end_call`` sends our BYE (after a successful REFER)."""

    uac: SipUac
    trunks: Sequence[SipTrunk]
    trunk: SipTrunk | None  # the call's own trunk, when known
    label: str
    dialog: Callable[[], Dialog | None]
    send: Callable[[Request], None]
    end_call: Callable[[], None]
    referred_by: str

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> SipLeg:
        trunk, user = route_target(self.trunks, self.trunk, target)
        return await dial_party(
            self.uac,
            trunk,
            user,
            caller_id=caller_id,
            headers=headers,
            timeout_s=timeout_s,
            label=f"party of {self.label}",
        )

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        dialog = self.dialog()
        if dialog is None or dialog.state is DialogState.TERMINATED:
            raise TransferError("transfer_failed", "the call has no SIP dialog to REFER in")
        trunk = self.trunk or (self.trunks[0] if self.trunks else None)
        value = (
            refer_to(target, trunk.host, headers, port=trunk.port, transport=trunk.transport)
            if trunk is not None
            else refer_to(target, None, headers)
        )
        log.info("%s: REFER to %s", self.label, value)
        outcome = await self.uac.refers.refer(
            dialog,
            self.send,
            refer_to_value=value,
            referred_by=self.referred_by,
            now=self.uac.clock.now(),
        )
        if not outcome.success:
            log.info("%s: REFER failed: %s", self.label, outcome.message)
            raise TransferError("transfer_failed", outcome.message)
        log.info("%s: REFER succeeded; BYE", self.label)
        self.end_call()
