"""The lean load-generator peers (bench/ws_lean.py, bench/lean_app.py, bench/lean_twilio.py).

Framing and handshakes are checked against RFC 6455's own example and against the websockets
library over loopback (a real, independent implementation on the other end); the Twilio
caller's playout, marks and clear, and the figures read off lean recordings, on fixed data.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from typing import Any, cast
from urllib.parse import parse_qsl

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidStatus

from appbridge.testing.fake_app import fonoster_headers
from appbridge.testing.fake_twilio import twilio_signature
from bench.analysis import analyse_calls
from bench.lean_app import LeanApp, LeanSession, frame_is_loud, verify_signature
from bench.lean_twilio import LeanTwilio, LeanTwilioCall, MediaPayloads, parse_twiml
from bench.measure import is_loud, onset_latencies_flags_ms, onset_latencies_ms
from bench.talker import AppScript, Burst
from bench.ws_lean import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameParser,
    HandshakeError,
    MaskPool,
    WsProtocolError,
    accept_key,
    check_request,
    check_response,
    client_request,
    encode_frame,
    parse_close,
    server_response,
    split_head,
)


# ---------------------------------------------------------------------- framing
def test_accept_key_matches_the_rfc_example() -> None:
    # RFC 6455 §1.3.
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("size", [0, 1, 125, 126, 641, 65535, 65536])
@pytest.mark.parametrize("masked", [False, True])
def test_frames_round_trip_at_every_length_form(size: int, masked: bool) -> None:
    payload = bytes(random.Random(size).getrandbits(8) for _ in range(size))
    mask = b"\x01\x02\x03\x04" if masked else None
    frame = encode_frame(OP_BINARY, payload, mask)
    header = 2 + (2 if 126 <= size < 65536 else 8 if size >= 65536 else 0) + (4 if masked else 0)
    assert len(frame) == header + size
    if masked and size:
        assert frame[header:] != payload  # the payload is masked on the wire
    assert FrameParser(expect_masked=masked).feed(frame) == [(OP_BINARY, payload)]


def test_parser_reassembles_bytes_fed_one_at_a_time_and_fragments() -> None:
    mask = MaskPool()
    first = (
        bytes((0x01, 0x80 | 3))
        + (k1 := mask.next())
        + bytes(b ^ k1[i % 4] for i, b in enumerate(b"abc"))
    )
    ping = encode_frame(OP_PING, b"hi", mask.next())
    last_key = mask.next()
    last = (
        bytes((0x80, 0x80 | 3))
        + last_key
        + bytes(b ^ last_key[i % 4] for i, b in enumerate(b"def"))
    )
    wire = first + ping + last + encode_frame(OP_TEXT, b"{}", mask.next())
    parser = FrameParser(expect_masked=True)
    out: list[tuple[int, bytes]] = []
    for k in range(len(wire)):
        out += parser.feed(wire[k : k + 1])
    # The ping comes out at once, between the fragments; the message once it is whole.
    assert out == [(OP_PING, b"hi"), (OP_TEXT, b"abcdef"), (OP_TEXT, b"{}")]


def test_parser_refuses_what_rfc_6455_forbids() -> None:
    with pytest.raises(WsProtocolError):  # a client must mask
        FrameParser(expect_masked=True).feed(encode_frame(OP_TEXT, b"x"))
    with pytest.raises(WsProtocolError):  # a server must not
        FrameParser(expect_masked=False).feed(encode_frame(OP_TEXT, b"x", b"abcd"))
    with pytest.raises(WsProtocolError):  # reserved bits without an extension
        FrameParser(expect_masked=False).feed(bytes((0xC1, 0)))
    with pytest.raises(WsProtocolError):  # a control frame may not be fragmented
        FrameParser(expect_masked=False).feed(bytes((0x09, 0)))
    with pytest.raises(WsProtocolError):  # continuation of nothing
        FrameParser(expect_masked=False).feed(bytes((0x80, 0)))
    with pytest.raises(WsProtocolError) as too_big:
        FrameParser(expect_masked=False, max_message_bytes=10).feed(bytes((0x82, 11)))
    assert too_big.value.code == 1009


def test_mask_keys_are_fresh_per_frame() -> None:
    pool = MaskPool(pool_bytes=16)
    keys = [pool.next() for _ in range(12)]  # past a refill
    assert all(len(k) == 4 for k in keys)
    assert len(set(keys)) > 8


def test_close_payload_reads_back_and_defaults_to_1005() -> None:
    frame = encode_frame(OP_CLOSE, (1001).to_bytes(2, "big") + b"bye")
    ((_, payload),) = FrameParser(expect_masked=False).feed(frame)
    assert parse_close(payload) == (1001, "bye")
    assert parse_close(b"") == (1005, "")


def test_handshake_both_sides() -> None:
    request, key = client_request("127.0.0.1", 8080, "/twilio/stream", {"x-twilio-signature": "s"})
    head, rest = cast(tuple[bytes, bytes], split_head(request + b"\x81\x00"))
    assert rest == b"\x81\x00"
    target, headers = check_request(head)
    assert target == "/twilio/stream" and headers["x-twilio-signature"] == "s"
    answer = server_response(headers["sec-websocket-key"])
    assert check_response(answer[:-4], key)["sec-websocket-accept"] == accept_key(key)
    with pytest.raises(HandshakeError):
        check_response(answer[:-4], base64.b64encode(b"another key 16 b").decode())
    with pytest.raises(HandshakeError):
        check_response(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0", key)
    assert split_head(b"GET / HTTP/1.1\r\nHost: x\r\n") is None


# ---------------------------------------------------------------------- the lean app
def test_signature_is_checked_as_seed_004_says() -> None:
    url = "ws://127.0.0.1:9/session"
    now = time.time()
    good = {k.lower(): v for k, v in fonoster_headers("s3cret", url, int(now)).items()}
    assert verify_signature("s3cret", url, good, now) is None
    assert verify_signature("other", url, good, now) == (401, "signature mismatch")
    assert verify_signature("s3cret", url + "?x=1", good, now) == (401, "signature mismatch")
    assert verify_signature("s3cret", url, good, now + 301) == (401, "timestamp outside 300 s")
    assert verify_signature("s3cret", url, {}, now) == (401, "missing signing headers")


def test_loudness_is_decided_as_the_classic_analysis_does() -> None:
    rng = random.Random(4)
    for size in (0, 1, 2, 3, 640, 641, 642):
        for _ in range(50):
            frame = bytes([1]) + bytes(
                rng.choice([0, 3, 4, 252, 255, rng.getrandbits(8)]) for _ in range(size)
            )
            assert frame_is_loud(frame) == is_loud(frame[1:])


def test_onset_latency_from_flags_equals_the_one_from_payloads() -> None:
    quiet, loud = bytes(640), (3000).to_bytes(2, "little") * 320
    received = [(1.0 + 0.02 * k, loud if 10 <= k < 40 or k >= 110 else quiet) for k in range(150)]
    onsets = [1.19, 2.15, 2.7, 9.0]  # 2.15: nothing loud within 1 s
    flags = [(t, is_loud(p)) for t, p in received]
    expected = onset_latencies_ms(onsets, received)
    assert expected == pytest.approx([10.0, 500.0])
    assert onset_latencies_flags_ms(onsets, flags) == expected


async def test_lean_app_serves_a_signed_session_to_a_real_websockets_client() -> None:
    app = LeanApp(secret="s3cret")
    app.loudness_if = lambda start: start.get("from") == "+1555300"
    started: list[dict[str, Any]] = []

    async def handler(session: LeanSession) -> None:
        started.append(await session.wait_for("session.start", timeout=5.0))
        await session.send({"type": "speak", "id": "s0", "text": "hi"})
        await session.send_binary(b"\x00\x01" * 100)

    app.handler = handler
    await app.start()
    try:
        with pytest.raises(InvalidStatus) as refused:
            await connect(app.url, additional_headers=fonoster_headers("wrong", app.url))
        assert refused.value.response.status_code == 401
        ws = await connect(app.url, additional_headers=fonoster_headers("s3cret", app.url))
        start = {"type": "session.start", "from": "+1555300", "callRef": "c1"}
        await ws.send(json.dumps(start))
        assert json.loads(await ws.recv()) == {"type": "speak", "id": "s0", "text": "hi"}
        assert await ws.recv() == b"\x00\x01" * 100
        await ws.send(b"\x01" + (3000).to_bytes(2, "little") * 320)  # loud, inbound track
        await ws.send(b"\x02" + bytes(640))  # quiet, another track
        pong = await ws.ping(b"k")
        await asyncio.wait_for(pong, 5.0)  # answered by the lean session
        await ws.close()
        session = app.sessions[0]
        await asyncio.wait_for(_until(lambda: session.closed), 5.0)
        assert started == [start]
        assert list(session.audio_tracks) == [1, 2] and list(session.audio_loud) == [1, 0]
        assert len(session.audio_times) == 2 and session.protocol_errors == []
        # Kernel receive stamps (bench/stamped.py), each no later than the loop's read.
        pairs = zip(session.audio_times, session.audio_loop_times, strict=True)
        assert len(session.audio_loop_times) == 2 and all(k <= t for k, t in pairs)
        assert session.close_code == 1000
        assert app.rejected == [(401, "signature mismatch")]
    finally:
        await app.stop()


async def _until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - a test helper bounded by wait_for
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------------- the lean caller
class _Wire:
    """A transport that keeps what the caller writes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def messages(self) -> list[dict[str, Any]]:
        frames = FrameParser(expect_masked=True).feed(bytes(self.data))
        self.data.clear()
        return [json.loads(p) for op, p in frames if op == OP_TEXT]


def new_call() -> LeanTwilioCall:
    """A lean caller whose LeanTwilio places nothing (no HTTP client) and ticks only when told
    (also used by test_bench_stamped)."""
    twilio = LeanTwilio(
        "http://127.0.0.1:1",
        account_sid="AC1",
        auth_token="t",
        client=cast(httpx.AsyncClient, None),
    )
    twilio.ticker.autostart = False
    return LeanTwilioCall(twilio, "CA1", "+1", "+2")


def open_call() -> tuple[LeanTwilioCall, _Wire]:
    """:func:`new_call` with its media stream open on a :class:`_Wire`, playout from t=100 s."""
    call = new_call()
    wire = _Wire()
    call.connection_made(cast(asyncio.Transport, wire))
    call.has_stream = True
    call._t_start = 100.0
    call._suffix = '"},"streamSid":"' + call.stream_sid + '"}'
    return call, wire


def from_gateway(call: LeanTwilioCall, msg: dict[str, Any]) -> None:
    """``msg`` as the gateway's WebSocket text frame, fed to the caller."""
    call.data_received(encode_frame(OP_TEXT, json.dumps(msg).encode()))


async def test_caller_media_messages_are_twilio_shaped() -> None:
    call, wire = open_call()
    tone = bytes(range(160)) * 2 + bytes(range(80))  # 2.5 frames
    call.talk(tone)
    for k in range(4):
        call.tick(100.0 + 0.02 * k)
    sent = wire.messages()
    assert list(sent[0]) == ["event", "sequenceNumber", "media", "streamSid"]  # Twilio's order
    assert list(sent[0]["media"]) == ["track", "chunk", "timestamp", "payload"]
    assert [m["event"] for m in sent] == ["media"] * 4
    assert [m["sequenceNumber"] for m in sent] == ["1", "2", "3", "4"]
    assert [m["media"]["chunk"] for m in sent] == ["1", "2", "3", "4"]
    assert [m["media"]["timestamp"] for m in sent] == ["0", "20", "40", "60"]
    assert all(m["streamSid"] == call.stream_sid and m["media"]["track"] == "inbound" for m in sent)
    payloads = [base64.b64decode(m["media"]["payload"]) for m in sent]
    assert payloads[:2] == [bytes(range(160))] * 2
    assert payloads[2] == bytes(range(80)) + b"\xff" * 80 and payloads[3] == b"\xff" * 160
    assert len(call.sent_times) == 4


async def test_caller_plays_out_echoes_marks_and_obeys_clear() -> None:
    call, wire = open_call()
    sid = call.stream_sid
    audio = base64.b64encode(b"\x10" * 200).decode()  # 1.25 frames
    from_gateway(call, {"event": "media", "streamSid": sid, "media": {"payload": audio}})
    from_gateway(call, {"event": "mark", "streamSid": sid, "mark": {"name": "m1"}})
    call.tick(100.0)
    call.tick(100.02)
    assert [m["event"] for m in wire.messages()] == ["media", "media"]  # m1 still playing
    call.tick(100.04)
    echoed = [m for m in wire.messages() if m["event"] == "mark"]
    assert [m["mark"]["name"] for m in echoed] == ["m1"]
    assert list(call.heard_bytes) == [160, 40, 0]
    assert call.media_arrivals()[0][1] == 200
    # A clear cuts the frame playing now and echoes the pending marks at once.
    from_gateway(call, {"event": "media", "streamSid": sid, "media": {"payload": audio}})
    from_gateway(call, {"event": "mark", "streamSid": sid, "mark": {"name": "m2"}})
    call.tick(100.06)
    started = call.heard_times[-1]
    call._on_clear(started + 0.005)  # 40 bytes of that tick played
    assert call.heard_bytes[-1] == 40 and call.clear_times == [started + 0.005]
    assert [m["mark"]["name"] for m in wire.messages() if m["event"] == "mark"] == ["m2"]
    assert call.silence_after(started + 0.001) == pytest.approx(started + 0.005)
    from_gateway(call, {"event": "media", "streamSid": "MZother", "media": {"payload": audio}})
    from_gateway(call, {"event": "dance", "streamSid": sid})
    assert len(call.protocol_errors) == 2


async def test_analysis_reads_lean_recordings_like_the_classic_ones() -> None:
    call, _ = open_call()
    for _ in range(3):
        call.recv_times.append(10.0)
        call.recv_bytes.append(160)
    for k in range(1, 98):
        call.recv_times.append(10.0 + 0.02 * k)
        call.recv_bytes.append(160)
    for k in range(1000):
        call.sent_times.append(5.0 + 0.02 * k)
    for t, n in [(10.0 + 0.02 * k, 160) for k in range(200)] + [(14.0, 40), (14.02, 0)]:
        call.heard_times.append(t)
        call.heard_bytes.append(n)
    call.clear_times = [14.004]
    session = LeanSession(LeanApp(secret=None))
    session.messages = [
        {"type": "mark", "name": "b0", "cleared": False},
        {"type": "mark", "name": "b1", "cleared": True},
    ]
    session.message_times = [12.1, 14.01]
    for k in range(1000):
        session.audio_times.append(5.0 + 0.02 * k + 0.003)
        session.audio_tracks.append(1)
        session.audio_loud.append(0)
    script = AppScript("CA1", session, 5.0)
    script.bursts = [
        Burst(0, "audio", 9.99, "b0", None, 2000),
        Burst(1, "audio", 13.70, "b1", None, 2000, clear_at=14.0),
    ]
    figures = analyse_calls([(call, script)], (9.0, 20.0))
    assert figures.frames_expected == 100 and figures.frames_lost == 0
    assert (figures.clears_sent, figures.clears_at_caller, figures.marks_missing) == (1, 1, 0)
    assert figures.clear_to_silence_ms == pytest.approx([5.0])
    assert figures.jitter_ms and max(figures.jitter_ms) < 1e-6
    assert figures.inbound_latency_ms and all(
        v == pytest.approx(3.0) for v in figures.inbound_latency_ms
    )


def test_twiml_and_payload_cache() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url="ws://h/twilio/'
        b'stream"><Parameter name="from" value="+1"/></Stream></Connect></Response>'
    )
    assert parse_twiml(body) == (["Connect"], "ws://h/twilio/stream", {"from": "+1"}, None)
    assert parse_twiml(b"<Response><Reject/></Response>") == (["Reject"], None, {}, None)
    assert parse_twiml(b"nope")[3] is not None
    payloads = MediaPayloads()
    frames = payloads.frames(b"\x01" * 200)
    assert len(frames) == 2 and frames[0] is payloads.frames(b"\x01" * 160)[0]
    assert base64.b64decode(frames[1]) == b"\x01" * 40 + b"\xff" * 120


async def test_lean_caller_talks_to_a_real_websockets_server() -> None:
    """Webhook, signed upgrade, connected/start/media, stop and close, against websockets."""
    got: list[dict[str, Any]] = []
    signatures: list[str] = []
    done = asyncio.Event()

    async def stream(ws: ServerConnection) -> None:
        assert ws.request is not None
        signatures.append(ws.request.headers.get("x-twilio-signature", ""))
        async for raw in ws:
            msg = json.loads(raw)
            got.append(msg)
            if msg["event"] == "start":
                sid = msg["streamSid"]
                payload = base64.b64encode(b"\x00" * 160).decode()
                await ws.send(
                    json.dumps({"event": "media", "streamSid": sid, "media": {"payload": payload}})
                )
                await ws.send(
                    json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": "x"}})
                )
        done.set()

    async with serve(stream, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        stream_url = f"ws://127.0.0.1:{port}/twilio/stream"
        twiml = (
            f'<Response><Connect><Stream url="{stream_url}"><Parameter name="from" '
            f'value="+1"/></Stream></Connect></Response>'
        )
        forms: list[tuple[str, str]] = []

        def webhook(request: httpx.Request) -> httpx.Response:
            forms.append((request.headers["x-twilio-signature"], request.content.decode()))
            return httpx.Response(200, text=twiml, headers={"content-type": "text/xml"})

        async with httpx.AsyncClient(transport=httpx.MockTransport(webhook)) as client:
            twilio = LeanTwilio(
                f"http://127.0.0.1:{port}", account_sid="AC1", auth_token="tok", client=client
            )
            twilio.ticker.autostart = False
            call = await twilio.place_call("+1555", "+1666")
            assert call.has_stream, call.stream_error
            assert signatures == [twilio_signature("tok", stream_url)]
            ((signature, body),) = forms
            form = dict(parse_qsl(body))
            webhook_url = f"http://127.0.0.1:{port}/twilio/voice"
            assert signature == twilio_signature("tok", webhook_url, form)
            assert (form["From"], form["To"], form["CallStatus"]) == ("+1555", "+1666", "ringing")
            twilio.ticker.tick_group(0, time.monotonic())
            await asyncio.wait_for(_until(lambda: len(call.recv_times) == 1), 5.0)
            assert call.recv_times[0] <= call.recv_loop_times[0]  # the kernel's stamp first
            for _ in range(2):
                twilio.ticker.tick_group(0, time.monotonic())
            await asyncio.wait_for(_until(lambda: any(m["event"] == "mark" for m in got)), 5.0)
            await call.hangup()
            await asyncio.wait_for(done.wait(), 5.0)
    events = [m["event"] for m in got]
    assert events[:2] == ["connected", "start"] and events[-1] == "stop"
    assert "media" in events and "mark" in events
    assert got[1]["start"]["customParameters"] == {"from": "+1"}
    assert [m["sequenceNumber"] for m in got[1:]] == [str(k) for k in range(1, len(got))]
    assert call.closed and call.protocol_errors == [] and call.close_code == 1000


# ---------------------------------------------------------------------- choosing the peers
def test_the_worker_plays_lean_peers() -> None:
    from bench.soak_worker import SoakWorker
    from bench.worker import Worker, is_sip_session

    keys = {"app_secret": "s", "twilio_token": "t", "account_sid": "AC1"}
    assert isinstance(Worker(0, **keys).app, LeanApp)
    assert isinstance(SoakWorker(0, **keys).app, LeanApp)  # the soak too
    assert is_sip_session({"from": "+155530000000001"})
    assert not is_sip_session({"from": "+15550001111"})
