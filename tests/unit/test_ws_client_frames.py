"""The app link's own framing (appbridge/net/ws_frames.py, ws_client.py): every frame it writes
must be what websockets' server protocol parses back, masked (RFC 6455 §5.3) with a fresh key;
what it reads must be what the server sent, with websockets handling every frame it does not."""

from __future__ import annotations

import asyncio
import os
from typing import cast

import pytest
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from appbridge.net import ws_frames
from appbridge.net.ws_client import WsClient
from appbridge.net.ws_frames import masked_frame


def parse_as_server(wire: bytes, max_size: int = 1 << 20) -> Frame:
    reader = StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=True, max_size=max_size)
    try:
        next(parser)
    except StopIteration as done:
        frame: Frame = done.value
        return frame
    raise AssertionError("the frame was incomplete")


@pytest.mark.parametrize("length", [0, 1, 125, 126, 642, 65535, 65536, 200_000])
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_every_length_class_parses_back(opcode: Opcode, length: int) -> None:
    payload = os.urandom(length) if opcode is Opcode.BINARY else b"x" * length
    wire = masked_frame(opcode, payload)
    frame = parse_as_server(wire)
    assert frame.opcode is opcode
    assert frame.fin and not (frame.rsv1 or frame.rsv2 or frame.rsv3)
    assert bytes(frame.data) == payload
    # header: 2 bytes, +2 or +8 for the extended length, then the 4-byte key
    extra = 0 if length < 126 else 2 if length < 65536 else 8
    assert len(wire) == 2 + extra + 4 + length
    assert wire[1] & 0x80, "client frames carry the MASK bit"


def test_keys_are_fresh_and_the_payload_is_masked() -> None:
    payload = b"\x00" * 64  # XOR with the key shows the key itself
    wires = [masked_frame(Opcode.BINARY, payload) for _ in range(3000)]  # crosses two refills
    keys = [w[2:6] for w in wires]
    assert len(set(keys)) > 2990  # 32-bit random keys: collisions are rare, never systematic
    for wire, key in zip(wires, keys, strict=True):
        assert wire[6:] == key * 16


def test_keys_come_from_the_os_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_urandom(n: int) -> bytes:
        calls.append(n)
        return bytes(range(256)) * (n // 256)

    monkeypatch.setattr(os, "urandom", fake_urandom)
    keys = ws_frames._MaskKeys()
    taken = [keys.take() for _ in range(1025)]
    assert taken[0] == b"\x00\x01\x02\x03" and taken[1] == b"\x04\x05\x06\x07"
    assert calls == [4096, 4096]  # one read per 1024 keys


# -- the client's receive path, against websockets' own server protocol, sans I/O -------------


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def take(self) -> bytes:
        out = b"".join(self.written)
        self.written.clear()
        return out

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


class Peer:
    """A WsClient wired to websockets' ServerProtocol; what the client delivers is recorded."""

    def __init__(self, max_size: int = 1 << 16) -> None:
        self.texts: list[bytes] = []
        self.binaries: list[bytes] = []
        self.closes: list[tuple[int | None, str]] = []
        self.client = WsClient(
            "ws://127.0.0.1:9/app",
            {},
            max_size=max_size,
            on_text=self.texts.append,
            on_binary=self.binaries.append,
            on_pong=lambda: None,
            on_closed=lambda code, reason: self.closes.append((code, reason)),
        )
        self.transport = Transport()
        self.server = ServerProtocol()
        self.client.connection_made(cast(asyncio.Transport, self.transport))
        self.server.receive_data(self.transport.take())
        request = self.server.events_received()[0]
        assert isinstance(request, Request)
        self.server.send_response(self.server.accept(request))

    def server_bytes(self) -> bytes:
        return b"".join(self.server.data_to_send())

    def client_frames(self) -> list[Frame]:
        self.server.receive_data(self.transport.take())
        return [e for e in self.server.events_received() if isinstance(e, Frame)]


async def test_messages_sent_with_the_101_and_split_anywhere_arrive_whole() -> None:
    peer = Peer()
    messages = [b'{"type":"speak","n":%d}' % i for i in range(4)] + [b"t" * 300]
    for message in messages:
        peer.server.send_text(message)
    peer.server.send_binary(b"\x02" * 6400)  # a 200 ms chunk of pcm16 16 kHz
    wire = peer.server_bytes()  # the 101 response, then every frame
    for i in range(len(wire)):
        peer.client.data_received(wire[i : i + 1])
    assert peer.client.is_open
    assert peer.texts == messages and peer.binaries == [b"\x02" * 6400]


async def test_pings_fragments_and_the_close_go_through_websockets_in_step() -> None:
    peer = Peer()
    peer.client.data_received(peer.server_bytes())
    peer.server.send_text(b"one")
    peer.server.send_ping(b"p")
    peer.server.send_text(b"tw", fin=False)
    peer.server.send_continuation(b"o", fin=True)
    peer.server.send_binary(b"\x01")
    peer.server.send_close(1000, "bye")
    peer.client.data_received(peer.server_bytes())
    assert peer.texts == [b"one", b"two"] and peer.binaries == [b"\x01"]
    frames = peer.client_frames()
    assert (frames[0].opcode, bytes(frames[0].data)) == (Opcode.PONG, b"p")
    assert frames[-1].opcode is Opcode.CLOSE  # the close handshake was answered
    assert not peer.client.is_open
    peer.client.eof_received()  # the server then closes TCP (RFC 6455 §7.1.1)
    peer.client.connection_lost(None)
    assert peer.closes == [(1000, "bye")]


async def test_an_oversized_message_fails_the_link_with_1009() -> None:
    peer = Peer(max_size=1000)
    peer.client.data_received(peer.server_bytes())
    peer.server.send_text(b"ok")
    peer.server.send_text(b"x" * 1001)
    peer.client.data_received(peer.server_bytes())
    assert peer.texts == [b"ok"]
    closes = [f for f in peer.client_frames() if f.opcode is Opcode.CLOSE]
    assert closes and Close.parse(closes[0].data).code == 1009


async def test_a_masked_frame_from_the_server_is_a_protocol_error() -> None:
    peer = Peer()
    peer.client.data_received(peer.server_bytes())
    peer.client.data_received(masked_frame(Opcode.TEXT, b"masked"))  # servers must not mask
    assert peer.texts == []
    closes = [f for f in peer.client_frames() if f.opcode is Opcode.CLOSE]
    assert closes and Close.parse(closes[0].data).code == 1002


async def test_sends_stop_once_the_closing_handshake_began() -> None:
    peer = Peer()
    peer.client.data_received(peer.server_bytes())
    peer.client.send_text(b"before")
    peer.client.close(1000, "done")
    peer.client.send_binary(b"after")
    frames = peer.client_frames()
    assert [f.opcode for f in frames] == [Opcode.TEXT, Opcode.CLOSE]
    assert bytes(frames[0].data) == b"before"
