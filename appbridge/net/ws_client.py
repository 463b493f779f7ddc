"""A WebSocket client that never waits on its peer.

The gateway dials every app (docs/protocol-session-v1.md, "Connection and frames"). The stock
asyncio clients make ``send`` a coroutine that waits for the socket to drain, so a slow app would
stall whoever sends to it. Here the framing is websockets' sans-I/O
:class:`~websockets.client.ClientProtocol` and the shell is an :class:`asyncio.Protocol`: every send
is a synchronous ``transport.write``; the caller reads ``write_buffer_bytes`` and decides what to
drop (audio) and when a peer is too slow to keep, so one slow app never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Final, cast

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.uri import parse_uri

from appbridge.net.ws_frames import FrameCutter, drop_bytes, masked_frame, release_protocol

log = logging.getLogger(__name__)

#: A handshake response head longer than this goes to websockets as it is, which refuses it.
_MAX_RESPONSE_HEAD_BYTES: Final = 16 * 1024

# Every connection still open, so a shutting-down gateway can close them all (bounded) before
# its event loop goes away. A plain set: a client joins when connected and leaves when its
# connection is lost, and a compiled object is never weakly referenced (appbridge/weakable.py).
OPEN_CLIENTS: set[WsClient] = set()


class WsConnectError(Exception):
    """The connection or the opening handshake failed. ``status`` is the HTTP status of a
    handshake the server refused (RFC 6455 §4.1: anything but 101), else None."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WsClient(asyncio.Protocol):
    """One client connection. Callbacks run on the event loop, synchronously."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_size: int,
        on_text: Callable[[bytes], None],
        on_binary: Callable[[bytes], None],
        on_pong: Callable[[], None],
        on_closed: Callable[[int | None, str], None],
    ) -> None:
        self._proto = ClientProtocol(parse_uri(url), max_size=max_size)
        request = self._proto.connect()
        for name, value in headers.items():
            request.headers[name] = value
        # Sent once, then let go: a connection lives as long as its call, and every object it
        # keeps is walked by each full collection (media/gc_pacer.py).
        self._request: Request | None = request
        self._on_text = on_text
        self._on_binary = on_binary
        self._on_pong = on_pong
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self._handshake: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self._fragments: list[bytes] = []
        self._fragment_opcode: Opcode | None = None
        self._closed_reported = False
        self._open = False  # the protocol is OPEN, as of the last call into it (_flush)
        # Whole unmasked data frames are cut here (net/ws_frames.py), everything else is
        # websockets'.
        self._cutter = FrameCutter(
            masked=False,
            max_size=max_size,
            deliver=self._deliver,
            to_protocol=self._feed_protocol,
            idle=lambda: self._fragment_opcode is None,
            is_open=lambda: self._open,
            connecting=lambda: self._proto.state is State.CONNECTING,
            head_limit_bytes=_MAX_RESPONSE_HEAD_BYTES,
        )
        self.handshake_status: int | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport; they implement it.
        self._transport = cast(asyncio.Transport, transport)
        OPEN_CLIENTS.add(self)
        if self._request is not None:
            self._proto.send_request(self._request)
            self._request = None
        self._flush()

    def data_received(self, data: bytes) -> None:
        self._cutter.receive(data)

    def _feed_protocol(self, data: bytes) -> None:
        self._proto.receive_data(data)
        self._dispatch()
        self._flush()

    def _deliver(self, text: bool, payload: bytes) -> None:
        if text:
            self._on_text(payload)
        else:
            self._on_binary(payload)

    def eof_received(self) -> bool | None:
        self._proto.receive_eof()
        self._dispatch()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        OPEN_CLIENTS.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)
        if not self._handshake.done():
            self._handshake.set_exception(WsConnectError(str(exc) if exc else "connection closed"))
        self._report_closed()
        # Nothing more can happen on this connection: let go of the owner's callbacks and of
        # the reader, so that no reference cycle outlives it (media/gc_pacer.py).
        self._cutter.release()
        release_protocol(self._proto)
        self._on_text = self._on_binary = drop_bytes
        self._on_pong = _ignore_pong
        self._on_closed = _ignore_closed

    # -- internals -------------------------------------------------------------------------
    def _flush(self) -> None:
        # Every call into the protocol ends here, so this is where its state is read for the
        # hot path (``_send_data``), rather than through its property once per frame.
        self._open = self._proto.state is State.OPEN
        transport = self._transport
        if transport is None:
            return
        data = self._proto.data_to_send()
        if data:
            for chunk in data:
                if chunk:
                    transport.write(chunk)
                else:  # websockets signals "half-close now" with an empty chunk
                    if transport.can_write_eof():
                        transport.write_eof()
        if self._proto.close_expected() and self._proto.state is State.CLOSED:
            transport.close()

    def _dispatch(self) -> None:
        self._open = self._proto.state is State.OPEN  # a handler may send from here on
        for event in self._proto.events_received():
            if isinstance(event, Response):
                self.handshake_status = event.status_code
                if self._proto.handshake_exc is not None:
                    if not self._handshake.done():
                        self._handshake.set_exception(
                            WsConnectError(
                                f"handshake refused: {self._proto.handshake_exc}",
                                status=event.status_code,
                            )
                        )
                elif not self._handshake.done():
                    self._handshake.set_result(None)
                continue
            if isinstance(event, Frame):
                self._on_frame(event)
        if self._proto.state is State.CLOSED:
            self._report_closed()

    def _on_frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if frame.fin:
                if opcode is Opcode.TEXT:
                    self._on_text(bytes(frame.data))
                else:
                    self._on_binary(bytes(frame.data))
            else:
                self._fragment_opcode = opcode
                self._fragments = [bytes(frame.data)]
        elif opcode is Opcode.CONT:
            if self._fragment_opcode is None:
                return
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                data = b"".join(self._fragments)
                kind = self._fragment_opcode
                self._fragments, self._fragment_opcode = [], None
                (self._on_text if kind is Opcode.TEXT else self._on_binary)(data)
        elif opcode is Opcode.PONG:
            self._on_pong()
        # PING is answered by the sans-I/O protocol itself; CLOSE is handled through state.

    def _report_closed(self) -> None:
        if self._closed_reported:
            return
        self._closed_reported = True
        self._on_closed(self._proto.close_code, self._proto.close_reason or "")

    # -- public API ------------------------------------------------------------------------
    async def wait_open(self) -> None:
        await self._handshake

    @property
    def connected(self) -> bool:
        """The TCP connection is still there (open, or closing)."""
        return self._transport is not None

    @property
    def is_open(self) -> bool:
        return self._transport is not None and self._open

    @property
    def write_buffer_bytes(self) -> int:
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def send_text(self, data: bytes) -> None:
        self._send_data(Opcode.TEXT, data)

    def send_binary(self, data: bytes) -> None:
        self._send_data(Opcode.BINARY, data)

    def _send_data(self, opcode: Opcode, data: bytes) -> None:
        """A whole message as one frame, written straight to the transport. The sans-I/O
        protocol is not involved: every call into it is flushed at once (``_flush``), so nothing
        of its own waits to be written, and a data frame changes none of its state. Only while
        it is OPEN: after a close was sent or received no data frame may follow (RFC 6455
        §5.5.1)."""
        transport = self._transport
        if transport is not None and self._open:
            transport.write(masked_frame(opcode, data))

    def ping(self) -> None:
        if self.is_open:
            self._proto.send_ping(b"")
            self._flush()

    def close(self, code: int = 1000, reason: str = "") -> None:
        if self._proto.state is State.OPEN:
            self._proto.send_close(code, reason)
            self._flush()
        elif self._transport is not None and self._proto.state is State.CONNECTING:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


def _ignore_pong() -> None:
    pass


def _ignore_closed(code: int | None, reason: str) -> None:
    pass


async def close_all(timeout_s: float) -> None:
    """Close every open client; those still open after ``timeout_s`` are aborted."""
    clients = list(OPEN_CLIENTS)
    for client in clients:
        client.close(1001, "gateway shutting down")
    waiting = [c.lost for c in clients if c.connected]
    if waiting:
        await asyncio.wait(waiting, timeout=timeout_s)
    for client in clients:
        if client.connected:
            client.abort()
    await asyncio.sleep(0)


async def ws_connect(
    url: str,
    headers: Mapping[str, str],
    *,
    ssl_context: ssl.SSLContext | None,
    timeout_s: float,
    max_size: int,
    on_text: Callable[[bytes], None],
    on_binary: Callable[[bytes], None],
    on_pong: Callable[[], None],
    on_closed: Callable[[int | None, str], None],
) -> WsClient:
    """Open a connection and finish the handshake within ``timeout_s``, or raise WsConnectError."""
    uri = parse_uri(url)
    loop = asyncio.get_running_loop()
    holder: list[WsClient] = []

    def factory() -> WsClient:
        client = WsClient(
            url,
            headers,
            max_size=max_size,
            on_text=on_text,
            on_binary=on_binary,
            on_pong=on_pong,
            on_closed=on_closed,
        )
        holder.append(client)
        return client

    try:
        async with asyncio.timeout(timeout_s):
            await loop.create_connection(
                factory,
                uri.host,
                uri.port,
                ssl=(ssl_context if uri.secure else None),
                server_hostname=(uri.host if uri.secure else None),
            )
            await holder[0].wait_open()
    except TimeoutError as exc:
        if holder:
            holder[0].abort()
        raise WsConnectError(f"timed out after {timeout_s:.2f} s") from exc
    except OSError as exc:
        if holder:
            holder[0].abort()
        raise WsConnectError(exc.strerror or str(exc)) from exc
    except WsConnectError:
        if holder:
            holder[0].abort()
        raise
    return holder[0]
