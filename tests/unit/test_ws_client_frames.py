"""The app link's own client framing (appbridge/net/ws_client.py): every frame it writes must be
what websockets' server protocol parses back, masked (RFC 6455 §5.3) with a fresh key."""

from __future__ import annotations

import os

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from appbridge.net import ws_client
from appbridge.net.ws_client import masked_frame


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

    monkeypatch.setattr(ws_client.os, "urandom", fake_urandom)
    keys = ws_client._MaskKeys()
    taken = [keys.take() for _ in range(1025)]
    assert taken[0] == b"\x00\x01\x02\x03" and taken[1] == b"\x04\x05\x06\x07"
    assert calls == [4096, 4096]  # one read per 1024 keys
