"""``WS /twilio/stream``: the carrier side of one Twilio Media Stream (docs/protocol-twilio.md).

The stream is served on uvicorn's port without its ASGI layer (net/ws_fastpath.py):
:func:`accept_twilio_stream` checks the upgrade and :class:`TwilioStreamSession` gets each text
frame in one synchronous call, so caller audio reaches the call without a task in between; the
leg it makes writes to the same socket (carriers/twilio/leg.py). :class:`TwilioStreamEndpoint`
is the same session behind ASGI, for a server run without the fast path
(``APPBRIDGE_WS_FASTPATH=off``). Every ``media`` frame passes through here, so this module is
compiled (appbridge/compiled.py; docs/ARCHITECTURE.md, "The compiled media path").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appbridge.calls.state import CallState
from appbridge.carriers.twilio.leg import ASGISend, StreamSink, TwilioLeg
from appbridge.carriers.twilio.twiml import stream_url
from appbridge.carriers.twilio_outbound import claim_outbound_stream, dial_owner, outbound_for
from appbridge.cluster import cluster_of
from appbridge.cluster.auth import AUTH_HEADER, AuthResult
from appbridge.protocol.signing import verify_twilio
from appbridge.protocol.twilio_streams import (
    TwilioBadMessage,
    TwilioDtmf,
    TwilioIgnored,
    TwilioMedia,
    TwilioStart,
    TwilioStop,
    decode_twilio,
)

if TYPE_CHECKING:
    from appbridge.carriers.services import CarrierServices
    from appbridge.cluster.stream_relay import StreamRelay
    from appbridge.net.ws_fastpath import FastHandler, FastWebSocket, UpgradeRequest

log = logging.getLogger(__name__)

ASGIReceive = Any


def stream_signature_ok(gw: CarrierServices, query: str, signature: str) -> bool:
    """Twilio signs the upgrade over the public stream URL (and its query), with empty params
    (protocol/signing.py); without an ``auth_token`` nothing is checked (docs/configuration.md,
    ``[carriers.twilio]``)."""
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


def peer_stream(gw: CarrierServices, path: str, header: str | None) -> bool | None:
    """Whether the upgrade is a stream relayed by another node of the cluster: None when it
    does not claim to be (Twilio's own, checked by its signature), True when signed with the
    cluster secret, False (refused) when the claim does not verify (docs/scaling.md)."""
    if header is None:
        return None
    cluster = cluster_of(gw)
    if cluster is None:
        return False
    if cluster.verify("GET", path, header) is AuthResult.OK:
        return True
    log.warning("twilio stream: a relayed stream with a bad cluster signature; refused")
    return False


class TwilioStreamSession:
    """The carrier side of one Media Stream, fed whole text frames by whichever server carries
    it. :meth:`on_text` answers None to go on, or the close code to end the stream with: 1008
    for a ``start`` of no call of this gateway, 1000 after Twilio's ``stop``."""

    def __init__(
        self, gw: CarrierServices, sink: StreamSink | ASGISend, *, from_peer: bool = False
    ) -> None:
        self.gw = gw
        self.sink = sink
        self.leg: TwilioLeg | None = None
        self._ended = False
        # A stream another node of the cluster relays here: never relayed again.
        self.from_peer = from_peer
        # This node relays the stream to the node holding its call (cluster/stream_relay.py).
        self.relay: StreamRelay | None = None

    def on_text(self, data: bytes | str) -> int | None:
        relay = self.relay
        if relay is not None:
            relay.send(data if isinstance(data, bytes) else data.encode())
            return None
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
            return self._on_start(msg, data)
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

    def _on_start(self, msg: TwilioStart, data: bytes | str) -> int | None:

        gw = self.gw
        info = msg.start
        # A stream of a call another node placed through Twilio goes to that node.
        owner = dial_owner(gw, info)
        if owner is not None and self._relay(info.call_sid, data, owner):
            return None
        # Streams of calls the gateway placed (outbound calls, transfer parties).
        claimed = claim_outbound_stream(gw, info, self.sink)
        if isinstance(claimed, TwilioLeg):
            self.leg = claimed
            return None
        call = gw.registry.get(info.call_sid)
        if call is None and claimed is None and self._relay(info.call_sid, data):
            return None
        if (
            claimed is not None
            or call is None
            or call.leg is not None
            or call.state is CallState.ENDED
        ):
            log.warning("twilio stream: start for unknown call %s", info.call_sid)
            return 1008
        self.leg = TwilioLeg(
            self.sink, info.stream_sid, info.call_sid, gw.twilio_rest, outbound=outbound_for(gw)
        )
        call.attach_carrier(self.leg)
        return None

    def _relay(self, call_sid: str, start: bytes | str, owner: str | None = None) -> bool:
        """Relay a stream of a call this node does not hold to the node that does
        (docs/scaling.md, "Twilio behind a load balancer"): clustered, on the fast path, and
        only a stream that came from Twilio itself. ``owner`` names that node for a call it
        placed; otherwise the directory says."""
        cluster = cluster_of(self.gw)
        if cluster is None or self.from_peer or not hasattr(self.sink, "send_droppable_text"):
            return False
        from appbridge.cluster.stream_relay import StreamRelay

        frame = start if isinstance(start, bytes) else start.encode()
        self.relay = StreamRelay(cluster, self.sink, call_sid, frame, owner)
        return True

    def on_closed(self) -> None:
        """The stream is gone (either side closed it, or the socket died): the caller hung up,
        as far as the call can tell (docs/ARCHITECTURE.md, "A call from Twilio, step by
        step": the stream vanishing ends the call)."""
        if self._ended:
            return
        self._ended = True
        if self.relay is not None:
            self.relay.close()
            return
        leg = self.leg
        if leg is None:
            return
        leg.closed = True
        if leg._writer is not None:
            leg._writer.cancel()
        if leg.events is not None:
            leg.events.on_carrier_hangup()


class _FastTwilioStream:
    """:class:`~appbridge.net.ws_fastpath.FastHandler` of one stream."""

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
    gw: CarrierServices,
) -> Callable[[UpgradeRequest, FastWebSocket], FastHandler | None]:
    """The fast route of ``WS /twilio/stream`` (net/ws_fastpath.py): a refused upgrade (no
    ``[carriers.twilio]``, a bad signature) is answered HTTP 403, as the ASGI route does."""

    def accept(request: UpgradeRequest, ws: FastWebSocket) -> FastHandler | None:
        peer = peer_stream(gw, request.path, request.headers.get(AUTH_HEADER))
        if peer is False:
            return None
        if not peer and not stream_signature_ok(
            gw, request.query, request.headers.get("x-twilio-signature", "")
        ):
            return None
        return _FastTwilioStream(TwilioStreamSession(gw, ws, from_peer=bool(peer)), ws)

    return accept


class TwilioStreamEndpoint:
    """ASGI WebSocket endpoint for ``WS /twilio/stream`` (docs/operations.md, "Connecting a real
    Twilio number"), used when the server runs without the fast path."""

    def __init__(self, gw: CarrierServices) -> None:
        self.gw = gw

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        signature = ""
        cluster_auth: str | None = None
        for name, value in scope["headers"]:
            if name.lower() == b"x-twilio-signature":
                signature = value.decode("latin-1")
            elif name.lower() == AUTH_HEADER.encode():
                cluster_auth = value.decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        peer = peer_stream(self.gw, scope.get("path", ""), cluster_auth)
        if peer is False or (not peer and not stream_signature_ok(self.gw, query, signature)):
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            return
        await send({"type": "websocket.accept"})
        session = TwilioStreamSession(self.gw, send, from_peer=bool(peer))
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
