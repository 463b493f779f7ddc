"""Twilio Programmable Voice placing an inbound call on the gateway: the webhook, then the stream.

Twilio POSTs the voice webhook (``POST /twilio/voice``, signed with X-Twilio-Signature when the
gateway has an auth token), reads the TwiML answer and opens the Media Stream that
``<Connect><Stream>`` names (docs/protocol-twilio.md, "Carrier side"). :class:`TwilioCarrier` does
that; the stream itself is :class:`~appbridge.caller.twilio_stream.TwilioStreamCall`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

import httpx

from appbridge.caller.twilio_stream import TwilioStreamCall, new_sid, twilio_signature

__all__ = ["TwilioCarrier", "voice_webhook_form"]


def voice_webhook_form(
    call_sid: str,
    account_sid: str,
    from_: str,
    to: str,
    extra_params: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The form Twilio POSTs to the voice webhook for a new inbound call, ``extra_params`` on
    top."""
    form = {
        "CallSid": call_sid,
        "AccountSid": account_sid,
        "From": from_,
        "To": to,
        "CallStatus": "ringing",
        "Direction": "inbound",
        "ApiVersion": "2010-04-01",
        "Caller": from_,
        "Called": to,
        "FromCountry": "US",
        "ToCountry": "US",
    }
    form.update(extra_params or {})
    return form


class TwilioCarrier:
    """Twilio Programmable Voice placing inbound calls on the gateway (docs/protocol-twilio.md,
    "Carrier side").

    ``gateway_base_url`` is where the gateway really listens (``http://127.0.0.1:PORT``);
    ``public_url`` is how it is known to Twilio (its ``[server] public_url``, maybe with a proxy's
    path prefix). Signatures are computed over public URLs, connections go to the base URL.
    """

    def __init__(
        self,
        gateway_base_url: str,
        *,
        account_sid: str,
        auth_token: str | None,
        public_url: str | None = None,
        webhook_timeout_s: float = 15.0,
    ) -> None:
        self.gateway_base_url = gateway_base_url.rstrip("/")
        self.public_url = (public_url or gateway_base_url).rstrip("/")
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.webhook_timeout_s = webhook_timeout_s
        self.calls: list[TwilioStreamCall] = []

    def dial_url_for(self, stream_url: str) -> str:
        """The stream URL from TwiML, re-pointed at the gateway's real address: the public
        URL's path prefix (a reverse proxy's) is removed and the rest appended to the base URL."""
        stream = urlsplit(stream_url)
        gateway = urlsplit(self.gateway_base_url)
        path = stream.path
        prefix = urlsplit(self.public_url).path.rstrip("/")
        if prefix and (path == prefix or path.startswith(prefix + "/")):
            path = path[len(prefix) :]
        scheme = "wss" if gateway.scheme in ("https", "wss") else "ws"
        return urlunsplit(
            (scheme, gateway.netloc, gateway.path.rstrip("/") + path, stream.query, "")
        )

    async def place_call(
        self,
        from_: str,
        to: str,
        *,
        call_sid: str | None = None,
        extra_params: Mapping[str, str] | None = None,
        pace: bool = True,
        continuous_media: bool = False,
    ) -> TwilioStreamCall:
        """POST the voice webhook, follow ``<Connect><Stream>`` if the TwiML has one.

        ``continuous_media`` sends silence whenever no caller audio is queued, as real Twilio
        streams do (a frame every 20 ms for the whole call); by default only queued audio is sent.
        """
        call = TwilioStreamCall(
            call_sid=call_sid or new_sid("CA"),
            account_sid=self.account_sid,
            from_=from_,
            to=to,
            pace=pace,
            continuous_media=continuous_media,
        )
        form = voice_webhook_form(call.call_sid, self.account_sid, from_, to, extra_params)
        headers = {"User-Agent": "TwilioProxy/1.1"}
        if self.auth_token is not None:
            signed_url = self.public_url + "/twilio/voice"
            headers["X-Twilio-Signature"] = twilio_signature(self.auth_token, signed_url, form)
        async with httpx.AsyncClient(trust_env=False, timeout=self.webhook_timeout_s) as client:
            response = await client.post(
                self.gateway_base_url + "/twilio/voice", data=form, headers=headers
            )
        call.webhook_status = response.status_code
        call.webhook_content_type = response.headers.get("content-type", "")
        call._apply_twiml(response.content)
        self.calls.append(call)
        self._answered(call)
        if response.status_code == 200 and call.stream_url:
            await call._open_stream(self.dial_url_for(call.stream_url), self.auth_token)
        else:
            call.status = "completed"
            call.ended_wall = time.time()
        return call

    def _answered(self, call: TwilioStreamCall) -> None:
        """Called once the webhook has answered, before the stream opens; a subclass (the
        tests' fake REST API) registers the call here."""

    async def aclose(self) -> None:
        """Hang up every call still live."""
        await asyncio.gather(*(call.aclose() for call in self.calls), return_exceptions=True)
