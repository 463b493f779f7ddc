"""WebSocket routes served straight off the socket, on the HTTP port, beside uvicorn's ASGI ones.

Why: a Twilio Media Stream carries 50 small text frames a second each way. Through uvicorn's ASGI
WebSocket layer every one of them costs a message dict, an ``asyncio.Queue`` put/get, a
``pause_reading``/``resume_reading`` pair, Starlette's middleware frames, a ``str`` decode, and on
the way out a writer task's wake-up and a ``str`` that uvicorn encodes back to bytes, a large share
of the gateway's CPU under load (docs/PERFORMANCE.md has the figures). Here a route's frames go from
the socket to its handler in one synchronous call, and its output goes out with one
``transport.write``.

How it plugs into uvicorn (0.54; what this module relies on):

* ``uvicorn.Config(ws=...)`` accepts an :class:`asyncio.Protocol` class. On an upgrade request
  the HTTP protocol (``HttpToolsProtocol.handle_websocket_upgrade``, ``H11Protocol`` alike)
  builds it with the keyword arguments ``config``, ``server_state`` and ``app_state``, calls
  ``connection_made(transport)``, then ``data_received(request)`` with the request line and
  headers re-serialised, then ``transport.set_protocol(it)``; the gateway's HTTP protocol
  (``uvicorn_server.UpgradingHttpProtocol``) then calls :meth:`RoutingWsProtocol.hand_over`.
* ``server_state.connections``: at exit uvicorn calls ``shutdown()`` on each member and waits
  (``timeout_graceful_shutdown``) until the set is empty.

:class:`~appbridge.http.ws_router.RoutingWsProtocol` reads the request line. A path in its
routes gets a :class:`FastWebSocket`; every other path goes, callback by callback, to uvicorn's
own ``WebSocketsSansIOProtocol``, so the other WebSocket routes stay ASGI.

:class:`FastWebSocket` runs websockets' sans-I/O ``ServerProtocol`` (RFC 6455) for the opening
handshake, frame parsing (masking, fragments, the size limit, ping and the close handshake).
Outgoing text frames are framed here (RFC 6455 §5.2: a server frame is unmasked, and no
extension is negotiated): a header of 2 or 4 bytes. Sends never wait on the peer, so a slow
one cannot stall the event loop: a droppable frame is skipped while the transport's write buffer is
above :data:`DROP_ABOVE_BYTES`, and a peer that lets the buffer pass :data:`GIVE_UP_ABOVE_BYTES`
is disconnected; no other connection notices either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast
from urllib.parse import unquote

from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from appbridge.net.ws_frames import FrameCutter, release_protocol, text_frame

log = logging.getLogger(__name__)
# websockets logs "connection open/closed" at INFO for every connection; only its warnings and
# errors are worth an operator's terminal.
_wire_log = logging.getLogger(__name__ + ".wire")
_wire_log.setLevel(logging.WARNING)

#: Droppable frames (audio) are skipped while this much is waiting in user space: about 50
#: Twilio ``media`` messages, one second of audio, the bound the ASGI writer kept.
DROP_ABOVE_BYTES: Final = 16 * 1024
#: A peer that leaves this much unread is given up: its connection is aborted.
GIVE_UP_ABOVE_BYTES: Final = 1024 * 1024
#: After our close frame, how long the peer has to answer before the TCP connection is aborted.
CLOSE_TIMEOUT_S: Final = 5.0
#: Largest message accepted, unless the route's server says otherwise (``ws_max_size``).
DEFAULT_MAX_MESSAGE_BYTES: Final = 1024 * 1024

#: An opening handshake longer than this is handed to websockets as it is, which refuses it.
_MAX_REQUEST_BYTES: Final = 16 * 1024


@dataclass(frozen=True, slots=True)
class UpgradeRequest:
    """What a route sees of the opening handshake (RFC 6455 §4.2.1)."""

    path: str  # percent-decoded, as ASGI's scope["path"]
    query: str  # raw, without "?"
    headers: Headers  # case-insensitive
    client: tuple[str, int] | None


class FastHandler(Protocol):
    """One accepted connection's consumer. Called on the event loop, synchronously; an exception
    closes this connection (1011) and nothing else."""

    def on_text(self, data: bytes) -> None:
        """A whole text message. Its UTF-8 is the handler's decoder's to check (msgspec does,
        in the same pass): websockets' sans-I/O parser leaves text undecoded."""
        ...

    def on_binary(self, data: bytes) -> None: ...

    def on_close(self, code: int | None) -> None:
        """Called once: the closing handshake began (either side) or the connection was lost."""
        ...


#: Decides an upgrade: a handler accepts it (101), None refuses it (HTTP 403).
Acceptor = Callable[[UpgradeRequest, "FastWebSocket"], FastHandler | None]


class FastWebSocket(asyncio.Protocol):
    """The server side of one WebSocket connection of a fast route."""

    def __init__(
        self,
        acceptor: Acceptor,
        *,
        loop: asyncio.AbstractEventLoop,
        max_message_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
        connections: set[Any] | None = None,
    ) -> None:
        self._acceptor = acceptor
        self._loop = loop
        self._proto = ServerProtocol(max_size=max_message_bytes, logger=_wire_log)
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._handler: FastHandler | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._close_reported = False
        # Whole masked data frames are cut here (net/ws_frames.py), everything else is
        # websockets'; the route gets each message in one synchronous call.
        self._cutter = FrameCutter(
            masked=True,
            max_size=max_message_bytes,
            deliver=self._deliver,
            to_protocol=self._feed_protocol,
            idle=self._proto_idle,
            is_open=lambda: self.is_open,
            connecting=lambda: self._proto.state is State.CONNECTING,
            head_limit_bytes=_MAX_REQUEST_BYTES,
        )
        #: True from the 101 until either side starts the closing handshake.
        self.is_open = False
        self.client: tuple[str, int] | None = None
        self.dropped_frames = 0

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client = (str(peer[0]), int(peer[1]))
        if self._connections is not None:
            self._connections.add(self)

    def data_received(self, data: bytes) -> None:
        self._cutter.receive(data)

    def _proto_idle(self) -> bool:
        """No fragmented message is open in websockets' parser (a whole frame must not cut in,
        RFC 6455 §5.4: the parser reports that as a protocol error)."""
        return self._proto.current_size is None and self._fragment_opcode is None

    def _deliver(self, text: bool, payload: bytes) -> None:
        """One whole message to the route (the same boundary as :meth:`_feed_protocol`)."""
        handler = self._handler
        if handler is None or not self.is_open:
            return
        try:
            if text:
                handler.on_text(payload)
            else:
                handler.on_binary(payload)
        except Exception:
            log.exception("websocket %s: handler failed; closing this connection", self.client)
            self._fail_internal()
            self._flush()

    def _feed_protocol(self, data: bytes) -> None:
        proto = self._proto
        proto.receive_data(data)
        try:
            for event in proto.events_received():
                if type(event) is Frame:
                    self._on_frame(event)
                elif isinstance(event, Request):
                    self._on_request(event)
        except Exception:
            # The one failure boundary per connection: a handler's bug closes its own socket only.
            log.exception("websocket %s: handler failed; closing this connection", self.client)
            self._fail_internal()
        self._flush()

    def eof_received(self) -> bool | None:
        self._proto.receive_eof()
        self._flush()
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.is_open = False
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        if self._connections is not None:
            self._connections.discard(self)
        self._report_close()
        # Nothing more can happen on this connection: let go of the route's handler (which
        # holds this socket to send), the cutter's callbacks and the reader, so that no
        # reference cycle outlives the connection (media/gc_pacer.py).
        self._handler = None
        self._cutter.release()
        release_protocol(self._proto)

    def pause_writing(self) -> None:
        """Sends read the buffer size themselves (:meth:`send_droppable_text`)."""

    def resume_writing(self) -> None:
        pass

    # -- uvicorn's server_state protocol ----------------------------------------------------
    def shutdown(self) -> None:
        """uvicorn is exiting: say so (1001, RFC 6455 §7.4.1) and let the TCP connection go."""
        self.close(1001, "server shutting down")
        if self._transport is not None:
            self._transport.close()

    # -- sending -----------------------------------------------------------------------------
    @property
    def write_buffer_bytes(self) -> int:
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def send_text(self, data: bytes) -> None:
        """A frame that must not be dropped (control); written unless the connection is closing.
        A peer that has left :data:`GIVE_UP_ABOVE_BYTES` unread is disconnected instead."""
        transport = self._transport
        if not self.is_open or transport is None:
            return
        if transport.get_write_buffer_size() > GIVE_UP_ABOVE_BYTES:
            self._give_up(transport)
            return
        transport.write(text_frame(data))

    def send_droppable_text(self, data: bytes) -> bool:
        """A frame that may be lost (audio): False when skipped for the peer's backlog or because
        the connection is closing."""
        transport = self._transport
        if not self.is_open or transport is None:
            return False
        if transport.get_write_buffer_size() > DROP_ABOVE_BYTES:
            self.dropped_frames += 1
            if self.dropped_frames == 1:
                log.warning("websocket %s: peer reads too slowly; dropping frames", self.client)
            return False
        transport.write(text_frame(data))
        return True

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (RFC 6455 §7.1.2); the peer has :data:`CLOSE_TIMEOUT_S`."""
        proto = self._proto
        if proto.state is State.OPEN:
            proto.send_close(code, reason)
            self._flush()
        elif proto.state is State.CONNECTING and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- internals ---------------------------------------------------------------------------
    def _on_request(self, request: Request) -> None:
        proto = self._proto
        response = proto.accept(request)
        if response.status_code != 101:  # not a valid WebSocket upgrade: 400 or 426
            proto.send_response(response)
            return
        raw_path, _, query = request.path.partition("?")
        upgrade = UpgradeRequest(unquote(raw_path), query, request.headers, self.client)
        handler = self._acceptor(upgrade, self)
        if handler is None:
            proto.send_response(proto.reject(403, "Forbidden\n"))
            return
        self._handler = handler
        proto.send_response(response)
        self.is_open = True

    def _on_frame(self, frame: Frame) -> None:
        handler = self._handler
        if handler is None or not self.is_open:
            return  # nothing is delivered once the closing handshake began (either side)
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            data = cast(bytes, frame.data)
            if not frame.fin:
                self._fragment_opcode = opcode
                self._fragments = [data]
            elif opcode is Opcode.TEXT:
                handler.on_text(data)
            else:
                handler.on_binary(data)
        elif opcode is Opcode.CONT:
            if self._fragment_opcode is None:
                return
            self._fragments.append(cast(bytes, frame.data))
            if frame.fin:
                whole = b"".join(self._fragments)
                kind = self._fragment_opcode
                self._fragments, self._fragment_opcode = [], None
                if kind is Opcode.TEXT:
                    handler.on_text(whole)
                else:
                    handler.on_binary(whole)
        # PING is answered by ServerProtocol; CLOSE shows in its state (see _flush).

    def _flush(self) -> None:
        proto = self._proto
        transport = self._transport
        if transport is not None:
            for chunk in proto.data_to_send():
                if chunk:
                    transport.write(chunk)
                else:
                    # websockets' "end of stream": the server closes the TCP connection first
                    # (RFC 6455 §7.1.1); close() flushes what is buffered before.
                    transport.close()
                    break
        if proto.state is State.OPEN:
            return  # the hot path: a data frame in, nothing else to do
        if (
            transport is not None
            and self._close_timer is None
            and not transport.is_closing()
            and proto.close_expected()
        ):
            self._close_timer = self._loop.call_later(CLOSE_TIMEOUT_S, self.abort)
        if self.is_open:
            self.is_open = False
            self._report_close()

    def _report_close(self) -> None:
        if self._close_reported or self._handler is None:
            return
        self._close_reported = True
        proto = self._proto
        code = proto.close_rcvd.code if proto.close_rcvd is not None else None
        if code is None and proto.close_sent is not None:
            code = proto.close_sent.code
        try:
            self._handler.on_close(code if code is not None else 1006)
        except Exception:
            log.exception("websocket %s: close handler failed", self.client)

    def _fail_internal(self) -> None:
        proto = self._proto
        if proto.state is State.CONNECTING:
            if self._transport is not None:
                proto.send_response(proto.reject(500, "Internal Server Error\n"))
        elif proto.state is State.OPEN:
            proto.fail(1011)  # no details to the peer (RFC 6455 §7.4.1)

    def _give_up(self, transport: asyncio.Transport) -> None:
        log.warning(
            "websocket %s: %d bytes unread by the peer; disconnecting it",
            self.client,
            transport.get_write_buffer_size(),
        )
        self.is_open = False
        transport.abort()
