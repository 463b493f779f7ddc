"""The WebSocket fast path (appbridge/net/ws_fastpath.py), sans I/O: websockets' own client
protocol talks to a FastWebSocket over a fake transport; no socket, no real time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.streams import StreamReader
from websockets.uri import parse_uri

from appbridge.http.ws_router import fast_ws_protocol
from appbridge.net.ws_fastpath import (
    CLOSE_TIMEOUT_S,
    DROP_ABOVE_BYTES,
    GIVE_UP_ABOVE_BYTES,
    FastHandler,
    FastWebSocket,
    UpgradeRequest,
    text_frame,
)


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.buffered_bytes = 0
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True
        if self.protocol is not None:
            self.protocol.connection_lost(None)

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered_bytes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def take(self) -> bytes:
        out = b"".join(self.written)
        self.written.clear()
        return out


class FakeLoop:
    """Only what FastWebSocket uses: call_later, with time stepped by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any]] = []

    def call_later(self, delay_s: float, callback: Any) -> asyncio.TimerHandle:
        entry = (self.now + delay_s, callback)
        self.timers.append(entry)
        loop = self

        class Handle:
            def cancel(self) -> None:
                if entry in loop.timers:
                    loop.timers.remove(entry)

        return cast(asyncio.TimerHandle, Handle())

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for entry in [t for t in self.timers if t[0] <= self.now]:
            self.timers.remove(entry)
            entry[1]()


@dataclass
class Recorder:
    texts: list[bytes] = field(default_factory=list)
    binaries: list[bytes] = field(default_factory=list)
    closes: list[int | None] = field(default_factory=list)
    fail_on: bytes | None = None

    def on_text(self, data: bytes) -> None:
        if data == self.fail_on:
            raise RuntimeError("handler bug")
        self.texts.append(bytes(data))

    def on_binary(self, data: bytes) -> None:
        self.binaries.append(bytes(data))

    def on_close(self, code: int | None) -> None:
        self.closes.append(code)


@dataclass
class Pair:
    server: FastWebSocket
    transport: FakeTransport
    loop: FakeLoop
    client: ClientProtocol
    handler: Recorder
    requests: list[UpgradeRequest]
    connections: set[Any]

    def to_server(self) -> None:
        for chunk in self.client.data_to_send():
            if chunk:
                self.server.data_received(chunk)
            else:
                self.server.eof_received()

    def to_client(self) -> list[Any]:
        data = self.transport.take()
        if data:
            self.client.receive_data(data)
        if self.transport.closed and not self.client.reader.eof:
            self.client.receive_eof()
        return list(self.client.events_received())


def make_pair(
    *,
    accept: bool = True,
    path: str = "/twilio/stream?x=1",
    headers: dict[str, str] | None = None,
    max_message_bytes: int = 4096,
    handshake: bool = True,
) -> Pair:
    loop = FakeLoop()
    handler = Recorder()
    requests: list[UpgradeRequest] = []
    connections: set[Any] = set()

    def acceptor(request: UpgradeRequest, ws: FastWebSocket) -> FastHandler | None:
        requests.append(request)
        return handler if accept else None

    server = FastWebSocket(
        acceptor,
        loop=cast(asyncio.AbstractEventLoop, loop),
        max_message_bytes=max_message_bytes,
        connections=connections,
    )
    transport = FakeTransport()
    transport.protocol = server
    server.connection_made(cast(asyncio.Transport, transport))
    client = ClientProtocol(parse_uri(f"ws://127.0.0.1:8080{path}"), max_size=None)
    pair = Pair(server, transport, loop, client, handler, requests, connections)
    if handshake:
        request = client.connect()
        for name, value in (headers or {}).items():
            request.headers[name] = value
        client.send_request(request)
        pair.to_server()
    return pair


def response_of(events: list[Any]) -> Response:
    assert isinstance(events[0], Response)
    return events[0]


# -- framing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 125, 126, 300, 65535, 65536, 70000])
def test_text_frame_is_an_unmasked_rfc6455_frame(size: int) -> None:
    data = bytes(range(97, 123)) * (size // 26 + 1)
    data = data[:size]
    reader = StreamReader()
    reader.feed_data(text_frame(data))
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        frame = done.value
    else:  # pragma: no cover - the whole frame was fed
        raise AssertionError("frame incomplete")
    assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == data
    assert reader.at_eof  # nothing left over (header length exact)


# -- the opening handshake -----------------------------------------------------------------------


def test_accepted_upgrade_gets_101_and_the_route_sees_path_query_headers() -> None:
    pair = make_pair(path="/twilio/%73tream?a=b%20c", headers={"X-Twilio-Signature": "sig"})
    response = response_of(pair.to_client())
    assert response.status_code == 101
    assert pair.client.state is State.OPEN and pair.server.is_open
    (request,) = pair.requests
    assert request.path == "/twilio/stream" and request.query == "a=b%20c"
    assert request.headers.get("x-twilio-signature") == "sig"
    assert request.client == ("127.0.0.1", 40000)
    assert pair.server in pair.connections


def test_refused_upgrade_is_http_403_and_the_connection_closes() -> None:
    pair = make_pair(accept=False)
    response = response_of(pair.to_client())
    assert response.status_code == 403
    assert pair.transport.closed and not pair.server.is_open
    assert pair.handler.closes == []  # never accepted: nothing to report


def test_a_request_that_is_not_an_upgrade_is_answered_without_asking_the_route() -> None:
    pair = make_pair(handshake=False)
    pair.server.data_received(b"GET /twilio/stream HTTP/1.1\r\nHost: x\r\n\r\n")
    assert pair.transport.take().startswith(b"HTTP/1.1 426")
    assert pair.requests == [] and pair.transport.closed


def test_an_acceptor_that_raises_is_http_500() -> None:
    def boom(request: UpgradeRequest, ws: FastWebSocket) -> FastHandler | None:
        raise RuntimeError("bug")

    pair = make_pair(handshake=False)
    pair.server._acceptor = boom
    pair.client.send_request(pair.client.connect())
    pair.to_server()
    assert response_of(pair.to_client()).status_code == 500
    assert pair.transport.closed


# -- frames in -----------------------------------------------------------------------------------


def test_text_binary_and_fragmented_messages_reach_the_handler() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_text(b'{"event":"media"}')
    pair.client.send_binary(b"\x00\x01")
    pair.client.send_text(b"hel", fin=False)
    pair.client.send_continuation(b"lo", fin=True)
    pair.client.send_binary(b"ab", fin=False)
    pair.client.send_continuation(b"cd", fin=True)
    pair.to_server()
    assert pair.handler.texts == [b'{"event":"media"}', b"hello"]
    assert pair.handler.binaries == [b"\x00\x01", b"abcd"]


def test_ping_is_answered_with_pong() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_ping(b"p1")
    pair.to_server()
    events = pair.to_client()
    assert [(f.opcode, f.data) for f in events] == [(Opcode.PONG, b"p1")]


def test_oversized_message_closes_1009_and_reports_once() -> None:
    pair = make_pair(max_message_bytes=1000)
    pair.to_client()
    pair.client.send_text(b"x" * 1001)
    pair.to_server()
    assert pair.handler.texts == []
    events = pair.to_client()
    closes = [Close.parse(f.data).code for f in events if f.opcode is Opcode.CLOSE]
    assert closes == [1009]
    assert pair.handler.closes == [1009] and not pair.server.is_open
    pair.server.connection_lost(None)
    assert pair.handler.closes == [1009]  # still once
    assert pair.server not in pair.connections


def test_text_payload_utf8_is_left_to_the_route_decoder() -> None:
    """websockets' sans-I/O parser does not decode text; the route's decoder (msgspec) rejects
    bad UTF-8 as one bad message, so one bad frame does not end a call."""
    pair = make_pair()
    pair.to_client()
    pair.client.send_frame(Frame(Opcode.TEXT, b"\xff\xfe"))
    pair.to_server()
    assert pair.handler.texts == [b"\xff\xfe"] and pair.server.is_open


def test_garbage_bytes_close_the_connection_with_a_protocol_error() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.data_received(b"\x0f\x80garbage-unmasked-reserved-opcode")
    data = pair.transport.take()
    assert data.startswith(b"\x88")  # a close frame
    assert Close.parse(data[2:]).code == 1002
    assert pair.handler.closes == [1002] and pair.handler.texts == []


def test_a_handler_that_raises_closes_1011_only_its_connection() -> None:
    pair = make_pair()
    other = make_pair()
    pair.to_client()
    other.to_client()
    pair.handler.fail_on = b"bad"
    pair.client.send_text(b"bad")
    pair.client.send_text(b"after")
    pair.to_server()
    closes = [Close.parse(f.data).code for f in pair.to_client() if f.opcode is Opcode.CLOSE]
    assert closes == [1011] and pair.handler.texts == []
    other.client.send_text(b"fine")
    other.to_server()
    assert other.handler.texts == [b"fine"] and other.server.is_open


def test_peer_close_is_echoed_then_the_server_closes_tcp() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_close(1000, "bye")
    pair.to_server()
    assert pair.handler.closes == [1000]
    events = pair.to_client()
    assert [f.opcode for f in events] == [Opcode.CLOSE]
    assert pair.transport.closed and pair.client.state is State.CLOSED


def test_vanishing_peer_reports_1006() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.connection_lost(ConnectionResetError())
    assert pair.handler.closes == [1006]
    assert not pair.server.is_open and pair.server not in pair.connections
    pair.server.send_text(b"late")  # harmless after the fact
    assert pair.server.send_droppable_text(b"late") is False


def test_eof_without_close_frame_is_reported() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.eof_received()
    assert pair.handler.closes == [1006] and pair.transport.closed


# -- frames out ----------------------------------------------------------------------------------


def test_sends_arrive_as_text_frames_in_order() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.send_droppable_text(b'{"event":"media"}')
    pair.server.send_text(b'{"event":"clear"}')
    events = pair.to_client()
    assert [(f.opcode, f.data) for f in events] == [
        (Opcode.TEXT, b'{"event":"media"}'),
        (Opcode.TEXT, b'{"event":"clear"}'),
    ]


def test_slow_reader_loses_droppable_frames_keeps_control_then_is_given_up() -> None:
    pair = make_pair()
    pair.to_client()
    pair.transport.buffered_bytes = DROP_ABOVE_BYTES + 1
    assert pair.server.send_droppable_text(b"audio") is False
    assert pair.server.dropped_frames == 1
    pair.server.send_text(b"control")  # still written
    assert [f.data for f in pair.to_client()] == [b"control"]
    pair.transport.buffered_bytes = GIVE_UP_ABOVE_BYTES + 1
    pair.server.send_text(b"control")
    assert pair.transport.aborted and pair.handler.closes == [1006]
    assert pair.transport.written == []


def test_our_close_waits_for_the_peer_then_aborts_after_the_timeout() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.send_droppable_text(b"last")
    pair.server.close(1008)
    assert pair.handler.closes == [1008] and not pair.server.is_open
    assert pair.server.send_droppable_text(b"after close") is False
    events = pair.to_client()
    assert events[0].data == b"last" and Close.parse(events[1].data).code == 1008
    assert not pair.transport.closed  # the peer may still answer
    pair.loop.advance(CLOSE_TIMEOUT_S - 0.01)
    assert not pair.transport.aborted
    pair.loop.advance(0.02)
    assert pair.transport.aborted


def test_our_close_answered_closes_tcp_and_cancels_the_timer() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.close(1000)
    pair.to_client()
    pair.to_server()  # the client's echo
    assert pair.transport.closed and not pair.transport.aborted
    pair.server.connection_lost(None)
    assert pair.loop.timers == [] and pair.handler.closes == [1000]


def test_shutdown_says_going_away_and_drops_the_connection() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.shutdown()
    data = pair.transport.take()
    assert data[:1] == b"\x88" and Close.parse(data[2:]).code == 1001
    assert pair.transport.closed


# -- routing beside uvicorn ------------------------------------------------------------------


class FakeFallback:
    made: list[FakeFallback] = []

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any]) -> None:
        self.calls: list[tuple[str, Any]] = []
        FakeFallback.made.append(self)

    def connection_made(self, transport: Any) -> None:
        self.calls.append(("made", transport))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def eof_received(self) -> bool | None:
        self.calls.append(("eof", None))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append(("lost", exc))

    def pause_writing(self) -> None:
        self.calls.append(("pause", None))

    def resume_writing(self) -> None:
        self.calls.append(("resume", None))


@dataclass
class ServerState:
    connections: set[Any] = field(default_factory=set)


@dataclass
class Config:
    ws_max_size: int = 2048


def _upgrade_head(target: str) -> bytes:
    return (
        f"GET {target} HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    ).encode()


async def test_routes_pick_the_fast_path_and_everything_else_goes_to_uvicorn() -> None:
    accepted: list[str] = []

    def acceptor(request: UpgradeRequest, ws: FastWebSocket) -> FastHandler | None:
        accepted.append(request.path)
        return Recorder()

    cls = fast_ws_protocol({"/fast": acceptor}, fallback=FakeFallback)
    state = ServerState()
    fast = cls(config=Config(), server_state=state, app_state={})
    transport = FakeTransport()
    fast.connection_made(cast(asyncio.Transport, transport))
    fast.data_received(_upgrade_head("/f%61st?q=1"))
    assert accepted == ["/fast"] and transport.take().startswith(b"HTTP/1.1 101")
    assert [type(c) for c in state.connections] == [FastWebSocket]

    FakeFallback.made.clear()
    slow = cls(config=Config(), server_state=state, app_state={})
    other = FakeTransport()
    slow.connection_made(cast(asyncio.Transport, other))
    head = _upgrade_head("/demo/session")
    slow.data_received(head)
    slow.data_received(b"frame")
    slow.pause_writing()
    slow.resume_writing()
    slow.eof_received()
    slow.connection_lost(None)
    (inner,) = FakeFallback.made
    assert [name for name, _ in inner.calls] == [
        "made",
        "data",
        "data",
        "pause",
        "resume",
        "eof",
        "lost",
    ]
    assert inner.calls[1][1] == head and accepted == ["/fast"]
    # Closed before any byte: nothing was routed, nothing breaks.
    idle = cls(config=Config(), server_state=state, app_state={})
    idle.connection_made(cast(asyncio.Transport, FakeTransport()))
    idle.connection_lost(None)


class SwitchingTransport(FakeTransport):
    """A transport that can hand its reads to another protocol, as uvloop's and asyncio's can."""

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


async def test_the_transport_then_calls_the_routed_protocol_directly() -> None:
    cls = fast_ws_protocol({"/fast": lambda request, ws: Recorder()}, fallback=FakeFallback)
    state = ServerState()
    router = cls(config=Config(), server_state=state, app_state={})
    transport = SwitchingTransport()
    transport.protocol = router
    router.connection_made(cast(asyncio.Transport, transport))
    router.data_received(_upgrade_head("/fast"))
    assert transport.take().startswith(b"HTTP/1.1 101")
    transport.set_protocol(router)  # what uvicorn does after the request: the router reads
    router.hand_over()  # then the gateway's HTTP protocol hands the reads on
    assert type(transport.protocol) is FastWebSocket and transport.protocol in state.connections

    FakeFallback.made.clear()
    slow = cls(config=Config(), server_state=state, app_state={})
    other = SwitchingTransport()
    slow.connection_made(cast(asyncio.Transport, other))
    slow.data_received(_upgrade_head("/demo/session"))
    slow.hand_over()
    (inner,) = FakeFallback.made
    assert other.protocol is inner


# -- the receive fast path: frames cut here, the rest by websockets ---------------------------


def client_bytes(pair: Pair) -> bytes:
    return b"".join(pair.client.data_to_send())


def test_frames_split_anywhere_across_reads_arrive_whole_and_in_order() -> None:
    pair = make_pair()
    pair.to_client()
    messages = [b'{"event":"media","n":%d}' % i for i in range(5)] + [b"y" * 300, b"z" * 2000]
    for message in messages:
        pair.client.send_text(message)
    pair.client.send_binary(b"\x01\x02\x03")
    wire = client_bytes(pair)
    for i in range(len(wire)):  # one byte per read: every cut of every header and payload
        pair.server.data_received(wire[i : i + 1])
    assert pair.handler.texts == messages
    assert pair.handler.binaries == [b"\x01\x02\x03"]


def test_control_frames_between_messages_go_to_websockets_and_the_stream_stays_in_step() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_text(b"one")
    pair.client.send_ping(b"p")
    pair.client.send_text(b"two")
    pair.client.send_text(b"thr", fin=False)
    pair.client.send_ping(b"q")  # a control frame inside a fragmented message is allowed
    pair.client.send_continuation(b"ee", fin=True)
    pair.client.send_text(b"four")
    pair.server.data_received(client_bytes(pair))  # all in one read
    assert pair.handler.texts == [b"one", b"two", b"three", b"four"]
    pongs = [f.data for f in pair.to_client() if f.opcode is Opcode.PONG]
    assert pongs == [b"p", b"q"]


def test_frames_sent_before_the_101_wait_for_it() -> None:
    pair = make_pair(handshake=False)
    request = pair.client.connect()
    pair.client.send_request(request)
    head = client_bytes(pair)
    frame = b"\x81\x83" + b"\x00\x00\x00\x00" + b"abc"  # masked with a zero key
    pair.server.data_received(head[:10])
    pair.server.data_received(head[10:] + frame)
    assert response_of(pair.to_client()).status_code == 101
    assert pair.handler.texts == [b"abc"]


def test_a_whole_message_inside_a_fragmented_one_is_a_protocol_error() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_text(b"par", fin=False)
    wire = client_bytes(pair)
    wire += b"\x81\x82" + b"\x00\x00\x00\x00" + b"no"  # FIN text where a continuation is due
    pair.server.data_received(wire)
    assert pair.handler.texts == []
    closes = [Close.parse(f.data).code for f in pair.to_client() if f.opcode is Opcode.CLOSE]
    assert closes == [1002]


def test_an_unmasked_client_frame_is_a_protocol_error() -> None:
    pair = make_pair()
    pair.to_client()
    pair.server.data_received(b"\x81\x03abc")
    assert pair.handler.texts == []
    closes = [Close.parse(f.data).code for f in pair.to_client() if f.opcode is Opcode.CLOSE]
    assert closes == [1002]


def test_a_64_bit_length_is_left_to_websockets_size_limit() -> None:
    pair = make_pair(max_message_bytes=100_000)
    pair.to_client()
    pair.client.send_text(b"a")
    pair.client.send_text(b"x" * 70_000)  # 64-bit length form: over the fast path's range
    pair.client.send_text(b"b")
    pair.server.data_received(client_bytes(pair))
    assert pair.handler.texts == [b"a", b"x" * 70_000, b"b"]  # websockets parses from there on


def test_the_peers_close_right_after_a_message_is_answered() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_text(b"last")
    pair.client.send_close(1000, "bye")
    pair.server.data_received(client_bytes(pair))
    assert pair.handler.texts == [b"last"]
    closes = [Close.parse(f.data).code for f in pair.to_client() if f.opcode is Opcode.CLOSE]
    assert closes == [1000] and pair.handler.closes == [1000]
    assert pair.transport.closed


def test_a_handler_that_closes_mid_buffer_gets_nothing_more_and_the_close_handshake_runs() -> None:
    pair = make_pair()
    pair.to_client()
    server = pair.server
    seen: list[bytes] = []

    class Closer(Recorder):
        def on_text(self, data: bytes) -> None:
            seen.append(bytes(data))
            if data == b"stop":
                server.close(1000, "done")

    server._handler = Closer()
    for message in (b"a", b"stop", b"after"):
        pair.client.send_text(message)
    server.data_received(client_bytes(pair))
    assert seen == [b"a", b"stop"]
    closes = [Close.parse(f.data).code for f in pair.to_client() if f.opcode is Opcode.CLOSE]
    assert closes == [1000]
    pair.to_server()  # the client's close reply
    assert pair.transport.closed


def test_a_frame_cut_across_reads_while_we_close_still_reaches_websockets_whole() -> None:
    pair = make_pair()
    pair.to_client()
    pair.client.send_text(b"x" * 200)
    pair.client.send_close(1000, "bye")  # the client's own close follows its last message
    wire = client_bytes(pair)
    pair.server.data_received(wire[:50])  # the message's first 50 bytes wait in the cutter
    pair.server.close(1000, "done")  # meanwhile we start the closing handshake
    pair.server.data_received(wire[50:])
    assert pair.handler.texts == []  # nothing is delivered once the handshake began
    assert pair.transport.closed  # websockets read both frames in step: the close completed
    assert pair.handler.closes == [1000]
