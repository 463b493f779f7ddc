"""A Twilio Media Stream that reached a node other than the one holding its call, relayed to
the owner (docs/scaling.md, "Twilio behind a load balancer").

TwiML's ``<Stream url>`` names the load balancer, so Twilio's stream may land on any node. The
node it lands on reads only the ``start`` message, finds the call's owner (in the directory, or,
for a call a node placed through Twilio, the live node its ``start`` names) and opens a
WebSocket to the owner's ``/twilio/stream``, signed with the cluster secret
(:mod:`appbridge.cluster.auth`). From then on every frame is passed through unchanged both ways,
without being decoded: the owner treats the relayed stream as a direct one. The relay's cost is
one more loopback or LAN hop per frame and a little CPU on the landing node.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from appbridge.cluster.redis_link import RedisUnavailable
from appbridge.net.ws_client import WsClient, WsConnectError, ws_connect

if TYPE_CHECKING:
    from appbridge.carriers.twilio.leg import StreamSink
    from appbridge.cluster.service import ClusterService

log = logging.getLogger(__name__)

STREAM_PATH: Final = "/twilio/stream"
CONNECT_TIMEOUT_S: Final = 3.0
MAX_MESSAGE_BYTES: Final = 1024 * 1024
#: Frames from Twilio held while the owner's stream opens: about 10 s of 20 ms media.
MAX_BUFFERED: Final = 500


def owner_stream_url(internal_url: str) -> str:
    """``/twilio/stream`` at the owner's announced ``internal_url``, in its WebSocket form."""
    parts = urlsplit(internal_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}{STREAM_PATH}"


class StreamRelay:
    """One relayed stream: Twilio's socket here (``sink``), the owner's over a client.

    ``owner`` is the node id a dialed call's ``start`` names (carriers/twilio_outbound.py); it
    is trusted only as far as a live node announced it, and the owner still checks the dial's
    token. Without it the owner is the node whose directory holds ``call_sid``.
    """

    def __init__(
        self,
        cluster: ClusterService,
        sink: StreamSink,
        call_sid: str,
        start_frame: bytes,
        owner: str | None = None,
    ) -> None:
        self._cluster = cluster
        self._sink = sink
        self.call_sid = call_sid
        self.owner = owner
        self._buffer: list[bytes] = [start_frame]
        self._client: WsClient | None = None
        self._closed = False
        cluster.spawn(self._connect(), f"{call_sid}:stream-relay")

    async def _connect(self) -> None:
        cluster = self._cluster
        try:
            if self.owner is not None:
                node = await cluster.node(self.owner)
            else:
                node = await cluster.locate(self.call_sid)
        except RedisUnavailable:
            node = None
        if node is None or node.node_id == cluster.node_id:
            log.warning("twilio stream: start for unknown call %s", self.call_sid)
            self._sink.close(1008)
            return
        try:
            client = await ws_connect(
                owner_stream_url(node.internal_url),
                cluster.signed_headers("GET", STREAM_PATH),
                ssl_context=cluster.gw.ssl_context,
                timeout_s=CONNECT_TIMEOUT_S,
                max_size=MAX_MESSAGE_BYTES,
                on_text=self._from_owner,
                on_binary=_ignore_binary,
                on_pong=_ignore_pong,
                on_closed=self._owner_closed,
            )
        except WsConnectError as exc:
            log.warning(
                "twilio stream %s: owner %s unreachable: %s", self.call_sid, node.node_id, exc
            )
            self._sink.close(1011)
            return
        if self._closed:
            client.close(1000)
            return
        cluster.gw.metrics.cluster_forwarded += 1
        log.info("twilio stream %s: relayed to node %s", self.call_sid, node.node_id)
        self._client = client
        for frame in self._buffer:
            client.send_text(frame)
        self._buffer = []

    def send(self, data: bytes) -> None:
        """A frame from Twilio, on to the owner (held until its stream is open)."""
        client = self._client
        if client is not None:
            client.send_text(data)
        elif len(self._buffer) < MAX_BUFFERED:
            self._buffer.append(data)

    def _from_owner(self, data: bytes) -> None:
        self._sink.send_text(data)

    def _owner_closed(self, code: int | None, reason: str) -> None:
        if not self._closed:
            self._closed = True
            # Codes that mean "no close frame" cannot be sent on (RFC 6455 §7.4.1).
            self._sink.close(code if code and code not in (1005, 1006, 1015) else 1000)

    def close(self) -> None:
        """Twilio's side is gone: so is the owner's."""
        self._closed = True
        self._buffer = []
        if self._client is not None:
            self._client.close(1000)


def _ignore_binary(data: bytes) -> None:
    pass


def _ignore_pong() -> None:
    pass
