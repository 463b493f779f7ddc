"""Twilio's REST API, as far as the gateway uses it (docs/protocol-twilio.md, "Outbound calls").

Kept apart from the leg: a REST request is never on the per-frame path, so this module is not
compiled (appbridge/compiled.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import httpx

from appbridge.config import TwilioCarrierConfig

log = logging.getLogger(__name__)


class TwilioRestClient:
    """Creating a call (outbound calls and transfer parties, carriers/twilio_outbound.py) and
    updating a live one (hang-up, cold transfer), authenticated with ``[carriers.twilio]``'s
    ``account_sid:auth_token`` (docs/configuration.md)."""

    def __init__(self, http: httpx.AsyncClient, cfg: TwilioCarrierConfig) -> None:
        self._http = http
        self._cfg = cfg

    @property
    def usable(self) -> bool:
        return bool(self._cfg.auth_token)

    async def update_call(self, call_sid: str, form: dict[str, str]) -> httpx.Response:
        cfg = self._cfg
        url = f"{cfg.api_base}/2010-04-01/Accounts/{cfg.account_sid}/Calls/{call_sid}.json"
        return await self._post(url, form, timeout_s=5.0)

    async def create_call(self, form: Mapping[str, str | list[str]]) -> httpx.Response:
        """``POST /2010-04-01/Accounts/{AccountSid}/Calls.json``, form-encoded; a list value
        repeats its field (``StatusCallbackEvent``). Twilio answers 201 with the Call resource."""
        cfg = self._cfg
        url = f"{cfg.api_base}/2010-04-01/Accounts/{cfg.account_sid}/Calls.json"
        return await self._post(url, dict(form), timeout_s=10.0)

    async def _post(
        self, url: str, form: Mapping[str, str | list[str]], *, timeout_s: float
    ) -> httpx.Response:
        cfg = self._cfg
        resp = await self._http.post(
            url, data=form, auth=(cfg.account_sid, cfg.auth_token or ""), timeout=timeout_s
        )
        # The body is read (``post`` reads it whole): drop httpx's stream wrapper, which points
        # back at the response. The pair is otherwise a reference cycle per request that only
        # a full collection frees (media/gc_pacer.py).
        resp.stream = httpx.ByteStream(b"")
        return resp

    async def hangup(self, call_sid: str) -> bool:
        try:
            resp = await self.update_call(call_sid, {"Status": "completed"})
        except httpx.HTTPError as exc:
            log.warning("twilio: hang-up of %s failed: %s", call_sid, exc)
            return False
        if resp.status_code >= 400:
            log.warning("twilio: hang-up of %s answered %s", call_sid, resp.status_code)
            return False
        return True
