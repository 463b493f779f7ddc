"""Twilio Programmable Voice as a carrier (reference/twilio.md, "Carrier side").

Flow (INTERFACES §6, "When a Twilio call meets its app"): the voice webhook arrives; the gateway
routes the called number, dials the app (Twilio plays ringback meanwhile, through the 2.5 s retry
window) and answers the webhook with TwiML ``<Connect><Stream>`` once the app is connected or the
fallback is chosen. Twilio then opens the Media Stream; its ``start`` message binds the stream to
the call by CallSid, and ``session.start`` goes to the app.

Toward Twilio the gateway plays the app's role: ``media`` paced by the media clock with a lead of
``LEAD_FRAMES`` frames, ``clear`` when the app clears (so nothing buffered at Twilio plays on). It
hangs up through the REST API (``Status=completed``) when credentials are configured, and by
closing the stream in every case.

Calls the gateway places through Twilio (``POST /v1/calls``, transfer parties) are in
``twilio_outbound.py``; their streams arrive here too and are claimed by its token first.

The stream is served on uvicorn's port without its ASGI layer (``http/ws_fastpath.py``, issue 7):
:func:`accept_twilio_stream` checks the upgrade and :class:`TwilioStreamSession` gets each text
frame in one synchronous call; the leg writes to a :class:`StreamSink`, so a frame out is one
``transport.write``. :class:`TwilioStreamEndpoint` is the same session behind ASGI, for a server
run without the fast path (``APPBRIDGE_WS_FASTPATH=off``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import quote, urlsplit
from xml.sax.saxutils import escape, quoteattr

import httpx

from appbridge.carriers.base import CarrierEvents, CarrierLeg, TransferError
from appbridge.config import TwilioCarrierConfig
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.media.pacing import LeadPacer
from appbridge.protocol.signing import verify_twilio
from appbridge.protocol.twilio_streams import (
    TwilioAppSideWriter,
    TwilioBadMessage,
    TwilioDtmf,
    TwilioIgnored,
    TwilioMedia,
    TwilioStart,
    TwilioStop,
    decode_twilio,
)

if TYPE_CHECKING:
    from appbridge.carriers.twilio_outbound import TwilioOutbound
    from appbridge.gateway import Gateway
    from appbridge.http.ws_fastpath import FastHandler, FastWebSocket, UpgradeRequest

log = logging.getLogger(__name__)

LEAD_FRAMES: Final = 2
# Audio frames waiting for the socket beyond this are dropped (a stalled Twilio socket must not
# grow memory); control messages always queue.
MAX_PENDING_AUDIO: Final = 50
STREAM_WAIT_S: Final = 15.0
ASGISend = Any
ASGIReceive = Any


class StreamSink(Protocol):
    """Where a leg's frames go when no task stands between it and the socket
    (:class:`~appbridge.http.ws_fastpath.FastWebSocket`). Every method returns at once."""

    is_open: bool

    def send_text(self, data: bytes) -> None:
        """A control frame (``clear``): never dropped while the stream is open."""
        ...

    def send_droppable_text(self, data: bytes) -> bool:
        """An audio frame: False when dropped because the peer reads too slowly."""
        ...

    def close(self, code: int = 1000, reason: str = "") -> None: ...


class TwilioRestClient:
    """Twilio's REST API, as far as the gateway uses it: creating a call (outbound calls and
    transfer parties, carriers/twilio_outbound.py) and updating a live one."""

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
        # a full collection frees (issue 7, media/gc_pacer.py).
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


class TwilioLeg:
    """One Media Stream, seen from the call. Sends never wait (DESIGN.md).

    ``send`` is a :class:`StreamSink` (the fast path: each frame is written as it is made) or an
    ASGI ``send`` (a writer task drains a bounded outbox).
    """

    carrier = "twilio"
    audio_format: AudioFormat = PCMU_8K
    #: Cold transfers stay with Twilio: the call's TwiML becomes ``<Dial>`` (:meth:`transfer`).
    native_cold_transfer = True
    #: Twilio plays what it receives in order: the leg keeps this lead over its playout.
    lead_frames = LEAD_FRAMES

    def __init__(
        self,
        send: StreamSink | ASGISend,
        stream_sid: str,
        call_sid: str,
        rest: TwilioRestClient | None,
        *,
        outbound: TwilioOutbound | None = None,
    ) -> None:
        self._send: ASGISend = send
        self._sink: StreamSink | None = send if hasattr(send, "send_droppable_text") else None
        self.stream_sid = stream_sid
        self.call_sid = call_sid
        self._rest = rest
        self._outbound = outbound  # places transfer parties (dial_party)
        self.events: CarrierEvents | None = None
        self._outbox: deque[tuple[bool, bytes]] = deque()  # (is_audio, text)
        self._pending_audio = 0
        self._wake: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self.pacer = LeadPacer(LEAD_FRAMES)
        self.closed = False
        self._hung_up = False
        self.audio_dropped = 0
        self.frames_sent = 0

    def attach(self, events: CarrierEvents) -> None:
        self.events = events
        loop = asyncio.get_running_loop()
        if self.closed:
            # A party's stream can end before the engine attaches to it: say so at once.
            loop.call_soon(events.on_carrier_hangup)
            return
        if self._sink is not None:
            return  # nothing to drain: sends write at once
        self._writer = loop.create_task(self._write_loop(), name=f"twilio-writer:{self.call_sid}")

    # -- output --------------------------------------------------------------------------------
    def frames_wanted(self, playing: bool) -> int:
        return self.pacer.frames_wanted(playing)

    def unplayed_frames(self) -> int:
        return self.pacer.buffered

    def send_frame(self, frame: bytes) -> None:
        self.pacer.on_sent()
        self.frames_sent += 1
        sink = self._sink
        if sink is not None:
            if not self.closed and not sink.send_droppable_text(
                TwilioAppSideWriter.media(self.stream_sid, frame)
            ):
                self.audio_dropped += 1
            return
        self._enqueue(True, TwilioAppSideWriter.media(self.stream_sid, frame))

    def clear_output(self) -> None:
        self.pacer.on_cleared()
        if self._sink is not None:
            # What the socket already took is Twilio's to drop: that is what ``clear`` asks.
            if not self.closed:
                self._sink.send_text(TwilioAppSideWriter.clear(self.stream_sid))
            return
        # Audio not yet written is as good as cleared: drop it before it reaches Twilio.
        if self._pending_audio:
            # In place: the writer task holds this very deque.
            kept = [item for item in self._outbox if not item[0]]
            self._outbox.clear()
            self._outbox.extend(kept)
            self._pending_audio = 0
        self._enqueue(False, TwilioAppSideWriter.clear(self.stream_sid))

    def _enqueue(self, is_audio: bool, text: bytes) -> None:
        if self.closed:
            return
        if is_audio:
            if self._pending_audio >= MAX_PENDING_AUDIO:
                self.audio_dropped += 1
                return
            self._pending_audio += 1
        self._outbox.append((is_audio, text))
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        outbox = self._outbox
        try:
            while not self.closed:
                while outbox:
                    is_audio, text = outbox.popleft()
                    if is_audio:
                        self._pending_audio -= 1
                    await self._send({"type": "websocket.send", "text": text.decode()})
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket went away under us
            log.debug("twilio stream %s: write failed: %s", self.stream_sid, exc)
            self.closed = True

    # -- control ---------------------------------------------------------------------------------
    def send_dtmf(self, digits: str) -> bool:
        return False  # a Media Stream carries audio only: the engine plays in-band tones

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        """Cold transfer through Twilio's REST API: the call's TwiML becomes ``<Dial>``.

        Twilio then sends ``stop`` on this stream and bridges the caller to the target. ``warm``
        and ``refer`` need a second leg or SIP signalling, which a Media Stream has not.
        """
        if mode != "cold":
            raise TransferError(
                "feature_not_supported", f"{mode} transfers are not available on Twilio calls"
            )
        if self._rest is None or not self._rest.usable:
            raise TransferError(
                "transfer_failed", "carriers.twilio.auth_token is needed to transfer Twilio calls"
            )
        twiml = twiml_dial(target, headers)
        try:
            resp = await self._rest.update_call(self.call_sid, {"Twiml": twiml})
        except httpx.HTTPError as exc:
            raise TransferError("transfer_failed", f"Twilio's API failed: {exc}") from None
        if resp.status_code >= 400:
            detail = ""
            try:
                body = resp.json()
                detail = f": {body.get('code')} {body.get('message')}"
            except ValueError:
                pass
            raise TransferError(
                "transfer_failed", f"Twilio refused the transfer (HTTP {resp.status_code}{detail})"
            )
        self._hung_up = True  # the call goes on, bridged by Twilio: never complete it now

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> CarrierLeg:
        """A transfer's new party (carriers/base.py). An E.164 ``target`` is a new Twilio call
        whose stream comes back here (carriers/twilio_outbound.py), ``caller_id`` its From; a
        ``sip:`` target goes out through the gateway's SIP carrier when it has one."""
        if target.startswith("sip:"):
            sip = self._outbound.gw.sip if self._outbound is not None else None
            if sip is None:
                raise TransferError(
                    "transfer_failed", "sip: targets on Twilio calls need the SIP carrier ([sip])"
                )
            from appbridge.carriers.sip.party import dial_party as sip_dial_party
            from appbridge.carriers.sip.party import route_target

            # The target's trunk (INTERFACES §6); a Twilio call has no trunk of its own.
            trunk, user = route_target(sip.outbound.cfg.trunks, None, target)
            return await sip_dial_party(
                sip.outbound,
                trunk,
                user,
                caller_id=caller_id,
                headers=headers,
                timeout_s=timeout_s,
                label=f"party of call {self.call_sid}",
            )
        if self._outbound is None:
            raise TransferError("transfer_failed", "this Twilio call cannot place new calls")
        return await self._outbound.dial_party(target, caller_id=caller_id, timeout_s=timeout_s)

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        """A Media Stream has no SIP signalling to carry a REFER (RFC 3515)."""
        raise TransferError(
            "feature_not_supported",
            "REFER is a SIP transfer; Twilio calls transfer with mode cold or warm",
        )

    async def hangup(self) -> None:
        if self._hung_up:
            return
        self._hung_up = True
        if self._rest is not None and self._rest.usable:
            await self._rest.hangup(self.call_sid)
        await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        if self._sink is not None:
            self.closed = True
            self._sink.close(1000)  # what was written goes out before the close frame
            return
        # Let what is queued go out, then close the stream.
        for _ in range(50):
            if not self._outbox:
                break
            await asyncio.sleep(0.005)
        self.closed = True
        if self._writer is not None:
            self._writer.cancel()
        try:
            await self._send({"type": "websocket.close", "code": 1000})
        except Exception:
            pass


# -- TwiML -------------------------------------------------------------------------------------


def twiml_stream(stream_url: str, params: dict[str, str]) -> str:
    inner = "".join(
        f"<Parameter name={quoteattr(name)} value={quoteattr(value)}/>"
        for name, value in params.items()
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Connect><Stream url={quoteattr(stream_url)}>{inner}</Stream>"
        "</Connect></Response>"
    )


def twiml_dial(target: str, headers: dict[str, str] | None) -> str:
    """``<Dial>`` to an E.164 number, or to a SIP URI with custom headers as URI parameters
    (Twilio's ``<Sip>`` takes ``X-`` headers in the URI's query)."""
    if target.startswith("sip:"):
        uri = target
        if headers:
            query = "&".join(f"{name}={quote(value, safe='')}" for name, value in headers.items())
            uri = f"{uri}{'&' if '?' in uri else '?'}{query}"
        inner = f"<Sip>{escape(uri)}</Sip>"
    else:
        inner = f"<Number>{escape(target)}</Number>"
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Dial>{inner}</Dial></Response>'


def twiml_say_hangup(text: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Say>{escape(text)}</Say><Hangup/></Response>"
    )


def twiml_hangup() -> str:
    return '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'


def twiml_reject(reason: str = "busy") -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Reject reason={quoteattr(reason)}/></Response>"
    )


def stream_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}/twilio/stream"


# -- the Media Stream endpoint -------------------------------------------------------------------


def stream_signature_ok(gw: Gateway, query: str, signature: str) -> bool:
    """INTERFACES §5: the upgrade is signed over the public stream URL, with empty params."""
    cfg = gw.config.twilio
    if cfg is None:
        return False
    if not cfg.auth_token:
        return True
    url = stream_url(gw.config.server.base_url())
    if query:
        url = f"{url}?{query}"
    if verify_twilio(cfg.auth_token, url, None, signature):
        return True
    log.warning("twilio stream: bad or missing X-Twilio-Signature; refused")
    gw.metrics.bad_signatures += 1
    return False


class TwilioStreamSession:
    """The carrier side of one Media Stream, fed whole text frames by whichever server carries
    it. :meth:`on_text` answers None to go on, or the close code to end the stream with: 1008
    for a ``start`` of no call of this gateway, 1000 after Twilio's ``stop``."""

    def __init__(self, gw: Gateway, sink: StreamSink | ASGISend) -> None:
        self.gw = gw
        self.sink = sink
        self.leg: TwilioLeg | None = None
        self._ended = False

    def on_text(self, data: bytes | str) -> int | None:
        msg = decode_twilio(data)
        leg = self.leg
        if isinstance(msg, TwilioMedia):
            if leg is not None and leg.events is not None:
                leg.events.on_carrier_audio(msg.media.payload)
        elif isinstance(msg, TwilioDtmf):
            if leg is not None and leg.events is not None:
                leg.events.on_carrier_dtmf(msg.dtmf.digit)
        elif isinstance(msg, TwilioStart):
            if leg is not None:
                log.warning("twilio stream: second start ignored")
                return None
            return self._on_start(msg)
        elif isinstance(msg, TwilioStop):
            return 1000
        elif isinstance(msg, TwilioBadMessage):
            self.gw.metrics.carrier_bad_messages += 1
            log.warning("twilio stream: bad message: %s", msg.message)
        elif isinstance(msg, TwilioIgnored):
            log.debug("twilio stream: ignoring %s", msg.event)
        return None

    def on_binary(self) -> None:
        self.gw.metrics.carrier_bad_messages += 1
        log.warning("twilio stream: binary frame ignored (Twilio sends text only)")

    def _on_start(self, msg: TwilioStart) -> int | None:
        from appbridge.carriers.twilio_outbound import claim_outbound_stream, outbound_for

        gw = self.gw
        info = msg.start
        # Streams of calls the gateway placed (outbound calls, transfer parties).
        claimed = claim_outbound_stream(gw, info, self.sink)
        if isinstance(claimed, TwilioLeg):
            self.leg = claimed
            return None
        call = gw.registry.get(info.call_sid)
        if claimed is not None or call is None or call.leg is not None or call.state == "ended":
            log.warning("twilio stream: start for unknown call %s", info.call_sid)
            return 1008
        self.leg = TwilioLeg(
            self.sink, info.stream_sid, info.call_sid, gw.twilio_rest, outbound=outbound_for(gw)
        )
        call.attach_carrier(self.leg)
        return None

    def on_closed(self) -> None:
        """The stream is gone (either side closed it, or the socket died): the caller hung up,
        as far as the call can tell (INTERFACES §6, "Who hung up")."""
        if self._ended:
            return
        self._ended = True
        leg = self.leg
        if leg is None:
            return
        leg.closed = True
        if leg._writer is not None:
            leg._writer.cancel()
        if leg.events is not None:
            leg.events.on_carrier_hangup()


class _FastTwilioStream:
    """:class:`~appbridge.http.ws_fastpath.FastHandler` of one stream."""

    __slots__ = ("session", "ws")

    def __init__(self, session: TwilioStreamSession, ws: FastWebSocket) -> None:
        self.session = session
        self.ws = ws

    def on_text(self, data: bytes) -> None:
        code = self.session.on_text(data)
        if code is not None:
            self.ws.close(code)

    def on_binary(self, data: bytes) -> None:
        self.session.on_binary()

    def on_close(self, code: int | None) -> None:
        self.session.on_closed()


def accept_twilio_stream(
    gw: Gateway,
) -> Callable[[UpgradeRequest, FastWebSocket], FastHandler | None]:
    """The fast route of ``WS /twilio/stream`` (http/ws_fastpath.py): a refused upgrade (no
    ``[carriers.twilio]``, a bad signature) is answered HTTP 403, as the ASGI route does."""

    def accept(request: UpgradeRequest, ws: FastWebSocket) -> FastHandler | None:
        if not stream_signature_ok(
            gw, request.query, request.headers.get("x-twilio-signature", "")
        ):
            return None
        return _FastTwilioStream(TwilioStreamSession(gw, ws), ws)

    return accept


class TwilioStreamEndpoint:
    """ASGI WebSocket endpoint for ``WS /twilio/stream`` (INTERFACES §5), used when the server
    runs without the fast path."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        signature = ""
        for name, value in scope["headers"]:
            if name.lower() == b"x-twilio-signature":
                signature = value.decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        if not stream_signature_ok(self.gw, query, signature):
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            return
        await send({"type": "websocket.accept"})
        session = TwilioStreamSession(self.gw, send)
        try:
            while True:
                message = await receive()
                kind = message["type"]
                if kind == "websocket.disconnect":
                    break
                if kind != "websocket.receive":
                    continue
                text = message.get("text")
                if text is None:
                    session.on_binary()
                    continue
                code = session.on_text(text)
                if code == 1008:
                    await send({"type": "websocket.close", "code": 1008})
                    return
                if code is not None:
                    break
        finally:
            session.on_closed()


# -- the voice webhook ----------------------------------------------------------------------------


async def handle_voice_webhook(
    gw: Gateway, url: str, form: dict[str, str], signature: str | None
) -> tuple[int, str, bytes]:
    """Returns (status, content_type, body) for ``POST /twilio/voice``."""
    from appbridge.calls.call import Call

    cfg = gw.config.twilio
    if cfg is None:
        return 404, "application/json", b'{"error":"not_found","message":"Twilio is not enabled"}'
    if cfg.auth_token and not verify_twilio(cfg.auth_token, url, form, signature or ""):
        gw.metrics.bad_signatures += 1
        return (
            403,
            "application/json",
            b'{"error":"forbidden","message":"X-Twilio-Signature does not match"}',
        )
    call_sid = form.get("CallSid", "")
    if not call_sid:
        return 400, "application/json", b'{"error":"bad_request","message":"CallSid is missing"}'
    from_, to = form.get("From", ""), form.get("To", "")
    refused = gw.admission_refusal()
    if refused is not None:
        gw.registry.total_rejected += 1
        log.warning("twilio: call %s refused: %s", call_sid, refused)
        return 200, "text/xml", twiml_reject("busy").encode()
    existing = gw.registry.get(call_sid)
    if existing is not None:
        return 409, "application/json", b'{"error":"conflict","message":"call already exists"}'
    app = gw.config.route(to)
    if app is None:
        log.info("twilio: no app for %s; rejecting", to)
        return 200, "text/xml", twiml_say_hangup("This number is not in service.").encode()
    call = Call(
        gw, call_ref=call_sid, app=app, direction="inbound", from_=from_, to=to, carrier="twilio"
    )
    gw.registry.add(call)
    answered = await call.connect_app()
    if not answered:
        await call.end("error")
        return 200, "text/xml", twiml_hangup().encode()
    call.spawn(_await_stream(call), "await-stream")
    params = {"from": from_, "to": to, "callRef": call_sid}
    body = twiml_stream(stream_url(gw.config.server.base_url()), params)
    return 200, "text/xml", body.encode()


async def _await_stream(call: Any) -> None:
    await asyncio.sleep(STREAM_WAIT_S)
    if call.leg is None:
        log.warning("call %s: Twilio never opened the media stream", call.call_ref)
        await call.end("error")
