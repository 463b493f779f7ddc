"""The bench's kernel-stamped transports (bench/stamped.py) and what the peers make of stamps.

Real loopback sockets: the stream transport's writes, partial-write buffering, close after
flushing, abort and EOF; the datagram transport's stamped receive; the realtime → monotonic
conversion on injected clocks. Stamps are only checked for order and sanity (not after the
read, not before the send), never for a duration.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import struct
import time
from typing import Any, cast

import pytest

from bench.analysis import analyse_calls
from bench.lean_app import LeanApp, LeanSession
from bench.report import receive_stamps_line
from bench.stamped import (
    REFRESH_TRIES,
    SCM_TIMESTAMPNS,
    StampClock,
    StampedDatagramTransport,
    StampedServer,
    StampedTransport,
    open_connection,
    open_datagram,
    realtime_to_monotonic_s,
    start_server,
)
from bench.talker import AppScript, Burst
from tests.unit.test_bench_lean import from_gateway, new_call, open_call

WAIT_S = 5.0
#: Slack for "not before the send": the realtime/monotonic offset is good to about a µs.
SLACK_S = 0.001


class Recorder(asyncio.Protocol):
    """Keeps everything a stream transport hands over, with the transport's stamps."""

    def __init__(self, keep_open_on_eof: bool = False) -> None:
        self.transport: StampedTransport | None = None
        self.data = bytearray()
        self.stamps: list[tuple[float, float]] = []
        self.eof = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost_exc: Exception | None = None
        self.pauses = 0
        self.resumes = 0
        self.keep_open_on_eof = keep_open_on_eof

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, StampedTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.data += data
        self.stamps.append((self.transport.rx_time, self.transport.rx_loop_time))

    def eof_received(self) -> bool:
        self.eof.set()
        return self.keep_open_on_eof

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_exc = exc
        self.lost.set()

    def pause_writing(self) -> None:
        self.pauses += 1

    def resume_writing(self) -> None:
        self.resumes += 1


async def _until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - a test helper bounded by wait_for
        await asyncio.sleep(0.001)


async def _pair(
    server_protocol: Recorder | None = None, client_protocol: Recorder | None = None
) -> tuple[StampedServer, Recorder, Recorder]:
    accepted: list[Recorder] = []

    def factory() -> Recorder:
        protocol = server_protocol or Recorder()
        accepted.append(protocol)
        return protocol

    server = await start_server(factory, "127.0.0.1", 0)
    _, client = await open_connection(
        lambda: client_protocol or Recorder(), "127.0.0.1", server.port
    )
    await asyncio.wait_for(_until(lambda: accepted and accepted[0].transport), WAIT_S)
    return server, accepted[0], cast(Recorder, client)


async def _unpair(server: StampedServer, at_server: Recorder, at_client: Recorder) -> None:
    """Stop listening, abort both ends, and wait until each has seen ``connection_lost``."""
    server.close()
    for side in (at_client, at_server):
        if side.transport is not None:
            side.transport.abort()
    for side in (at_client, at_server):
        await asyncio.wait_for(side.lost.wait(), WAIT_S)


# ---------------------------------------------------------------------- the clock
def test_realtime_stamps_become_monotonic_with_the_offset() -> None:
    assert realtime_to_monotonic_s(1_796_000_000, 250_000_000, 1_795_990_000.0) == pytest.approx(
        10_000.25, abs=1e-6
    )
    mono = iter([100.0, 100.0, 100.00001, 100.4, 101.5, 101.5, 101.50001])
    real = iter([1_000_100.1, 1_000_101.7])
    clock = StampClock(monotonic=lambda: next(mono), realtime=lambda: next(real))
    assert clock.now() == 100.0  # first read: refreshes
    assert clock.offset_s == pytest.approx(1_000_100.1 - 100.000005)  # realtime - midpoint
    assert clock.bracket_s == pytest.approx(10e-6)
    assert clock.now() == 100.4  # within the second: no refresh
    assert clock.refreshes == 1
    assert clock.now() == 101.5  # a second later: refreshed once more
    assert clock.refreshes == 2 and clock.offset_s == pytest.approx(1_000_101.7 - 101.500005)


def test_an_interrupted_offset_read_is_tried_again_and_the_narrowest_kept() -> None:
    # The first pair of monotonic reads is 8 ms apart (preempted between them): its midpoint
    # could be 4 ms off. The second pair is tight and ends the search.
    mono = iter([10.0, 10.0, 10.008, 10.009, 10.00901])
    real = iter([1_000_010.001, 1_000_010.009])
    clock = StampClock(monotonic=lambda: next(mono), realtime=lambda: next(real))
    clock.now()
    assert clock.offset_s == pytest.approx(1_000_010.009 - 10.009005)
    assert clock.bracket_s == pytest.approx(10e-6)
    # When no try is tight, the narrowest of REFRESH_TRIES is kept.
    widths = [0.005, 0.002, 0.004, 0.003, 0.006]
    reads: list[float] = [20.0]
    for i, width in enumerate(widths):
        reads += [20.0 + i, 20.0 + i + width]
    mono = iter(reads)
    real = iter([1_000_020.0 + i for i in range(REFRESH_TRIES)])
    clock = StampClock(monotonic=lambda: next(mono), realtime=lambda: next(real))
    clock.now()
    assert clock.bracket_s == pytest.approx(0.002)
    assert clock.offset_s == pytest.approx(1_000_021.0 - 21.001)


def test_stamp_reads_the_control_message_and_never_postdates_the_read() -> None:
    clock = StampClock(monotonic=lambda: 50.0, realtime=lambda: 1_000_050.0)
    clock.now()  # offset 1_000_000
    cmsg = (socket.SOL_SOCKET, SCM_TIMESTAMPNS, struct.pack("qq", 1_000_049, 995_000_000))
    assert clock.stamp([cmsg], read_at=50.0) == pytest.approx(49.995)
    assert clock.stamp([cmsg], read_at=49.9) == 49.9  # cannot have arrived after its read
    assert clock.stamp([], read_at=50.0) == 50.0  # no stamp: the read's instant
    other = (socket.SOL_SOCKET, 29, struct.pack("qq", 1, 2))  # SO_TIMESTAMP, not ours
    assert clock.stamp([other], read_at=50.0) == 50.0


# ---------------------------------------------------------------------- the stream transport
#: How many sends :func:`_stamps_on` tries before it gives up waiting for a stamped read.
WARM_SENDS = 100


async def _stamps_on(send: Any, reads: Any, unstamped: Any) -> None:
    """Sends until a read comes stamped. The kernel turns receive timestamps on for the whole
    machine through deferred work the first time a socket asks for them
    (``net_enable_timestamp``), and what arrives before that work has run comes unstamped (seen
    once in a CI run: the first three reads of a fresh machine)."""
    for _ in range(WARM_SENDS):
        before_reads, before_unstamped = reads(), unstamped()
        send()
        await asyncio.wait_for(_until(lambda: reads() > before_reads), WAIT_S)  # noqa: B023
        if unstamped() == before_unstamped:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no stamped read after {WARM_SENDS} sends")


async def test_a_write_arrives_stamped_between_its_send_and_its_read() -> None:
    server, at_server, at_client = await _pair()
    try:
        assert at_client.transport is not None and at_server.transport is not None
        client_transport, server_transport = at_client.transport, at_server.transport
        await _stamps_on(
            lambda: client_transport.write(b"warm;"),
            lambda: len(at_server.stamps),
            lambda: server_transport.unstamped_reads,
        )
        at_server.data.clear()
        at_server.stamps.clear()
        unstamped_before = server_transport.unstamped_reads
        sock = at_client.transport.get_extra_info("socket")
        assert isinstance(sock, socket.socket)
        assert at_client.transport.get_extra_info("peername")[1] == server.port
        for k in range(3):
            sent_at = time.monotonic()
            at_client.transport.write(b"frame %d;" % k)
            tail = b"%d;" % k
            await asyncio.wait_for(_until(lambda: at_server.data.endswith(tail)), WAIT_S)  # noqa: B023
            kernel, loop = at_server.stamps[-1]
            assert sent_at - SLACK_S <= kernel <= loop
        assert bytes(at_server.data) == b"frame 0;frame 1;frame 2;"
        assert at_server.transport.unstamped_reads == unstamped_before
        assert at_client.transport.get_write_buffer_size() == 0
    finally:
        await _unpair(server, at_server, at_client)


async def test_what_the_kernel_does_not_take_is_buffered_then_flushed() -> None:
    server, at_server, at_client = await _pair()
    try:
        assert at_client.transport is not None and at_server.transport is not None
        at_server.transport.pause_reading()
        assert not at_server.transport.is_reading()
        blob = bytes(range(256)) * 65536  # 16 MiB: more than both socket buffers hold
        at_client.transport.write(blob)
        at_client.transport.write(b"tail")  # appended behind the buffered rest, in order
        assert at_client.transport.get_write_buffer_size() > 0
        assert at_client.pauses == 1  # above the high-water mark
        at_server.transport.resume_reading()
        await asyncio.wait_for(_until(lambda: len(at_server.data) == len(blob) + 4), WAIT_S)
        assert bytes(at_server.data) == blob + b"tail"
        await asyncio.wait_for(
            _until(lambda: at_client.transport.get_write_buffer_size() == 0), WAIT_S
        )
        assert at_client.resumes == 1
    finally:
        await _unpair(server, at_server, at_client)


async def test_close_flushes_first_and_the_peer_sees_eof() -> None:
    server, at_server, at_client = await _pair()
    assert at_client.transport is not None and at_server.transport is not None
    at_server.transport.pause_reading()
    blob = b"x" * (16 * 1024 * 1024)  # more than the socket buffers take
    at_client.transport.write(blob)
    assert at_client.transport.get_write_buffer_size() > 0
    at_client.transport.close()
    assert at_client.transport.is_closing()
    at_client.transport.write(b"ignored")  # nothing is written once closing
    await asyncio.sleep(0.01)
    assert not at_client.lost.is_set()  # still flushing
    at_server.transport.resume_reading()
    await asyncio.wait_for(at_server.eof.wait(), WAIT_S)
    assert bytes(at_server.data) == blob
    await asyncio.wait_for(at_client.lost.wait(), WAIT_S)
    assert at_client.lost_exc is None
    # eof_received returned False: the server side closed itself.
    await asyncio.wait_for(at_server.lost.wait(), WAIT_S)
    assert at_server.transport.is_closing()
    server.close()


async def test_abort_drops_the_buffer_at_once() -> None:
    server, at_server, at_client = await _pair()
    assert at_client.transport is not None and at_server.transport is not None
    at_server.transport.pause_reading()
    blob = b"y" * (16 * 1024 * 1024)
    at_client.transport.write(blob)
    assert at_client.transport.get_write_buffer_size() > 0
    at_client.transport.abort()
    assert at_client.transport.get_write_buffer_size() == 0 and at_client.transport.is_closing()
    await asyncio.wait_for(at_client.lost.wait(), WAIT_S)
    at_server.transport.resume_reading()
    await asyncio.wait_for(at_server.lost.wait(), WAIT_S)
    assert 0 < len(at_server.data) < len(blob)  # what the kernel had taken, not the rest
    server.close()


async def test_an_eof_kept_open_leaves_the_write_side_usable() -> None:
    client = Recorder(keep_open_on_eof=True)
    server, at_server, at_client = await _pair(client_protocol=client)
    assert at_client.transport is not None and at_server.transport is not None
    sock = at_server.transport.get_extra_info("socket")
    sock.shutdown(socket.SHUT_WR)  # the server half-closes
    await asyncio.wait_for(at_client.eof.wait(), WAIT_S)
    assert not at_client.transport.is_closing() and not at_client.transport.is_reading()
    at_client.transport.write(b"after eof")
    await asyncio.wait_for(_until(lambda: bytes(at_server.data) == b"after eof"), WAIT_S)
    at_client.transport.close()
    await asyncio.wait_for(at_client.lost.wait(), WAIT_S)
    await asyncio.wait_for(at_server.lost.wait(), WAIT_S)
    server.close()


async def test_a_protocol_error_is_reported_and_closes_the_connection() -> None:
    class Broken(Recorder):
        def data_received(self, data: bytes) -> None:
            raise ValueError("bad frame")

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        server, at_server, at_client = await _pair(server_protocol=Broken())
        assert at_client.transport is not None
        at_client.transport.write(b"boom")
        await asyncio.wait_for(at_server.lost.wait(), WAIT_S)
        assert isinstance(at_server.lost_exc, ValueError)
        assert [type(c["exception"]) for c in reported] == [ValueError]
        await asyncio.wait_for(at_client.eof.wait(), WAIT_S)
        await asyncio.wait_for(at_client.lost.wait(), WAIT_S)
        server.close()
    finally:
        loop.set_exception_handler(None)


async def test_a_refused_connection_raises_and_leaks_no_socket() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with pytest.raises(OSError):
        await open_connection(Recorder, "127.0.0.1", port)


# ---------------------------------------------------------------------- the datagram transport
class DatagramRecorder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: StampedDatagramTransport | None = None
        self.got: list[tuple[bytes, Any, float, float]] = []
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, StampedDatagramTransport)
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        self.got.append((data, addr, self.transport.rx_time, self.transport.rx_loop_time))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


async def test_datagrams_arrive_stamped_and_can_be_answered() -> None:
    transport, protocol = await open_datagram(DatagramRecorder, ("127.0.0.1", 0))
    receiver = cast(DatagramRecorder, protocol)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    try:
        port = transport.get_extra_info("sockname")[1]
        await _stamps_on(
            lambda: peer.sendto(b"warm", ("127.0.0.1", port)),
            lambda: len(receiver.got),
            lambda: transport.unstamped_reads,
        )
        receiver.got.clear()
        unstamped_before = transport.unstamped_reads
        sent_at = time.monotonic()
        for k in range(3):
            peer.sendto(b"rtp %d" % k, ("127.0.0.1", port))
        await asyncio.wait_for(_until(lambda: len(receiver.got) == 3), WAIT_S)
        assert [g[0] for g in receiver.got] == [b"rtp 0", b"rtp 1", b"rtp 2"]
        assert receiver.got[0][1] == peer.getsockname()
        kernels = [g[2] for g in receiver.got]
        assert kernels == sorted(kernels)  # one stamp per packet, in order
        for _, _, kernel, loop in receiver.got:
            assert sent_at - SLACK_S <= kernel <= loop
        assert transport.unstamped_reads == unstamped_before
        transport.sendto(b"answer", peer.getsockname())
        await asyncio.wait_for(_until(lambda: _readable(peer)), WAIT_S)
        assert peer.recv(100) == b"answer"
        assert transport.get_write_buffer_size() == 0
    finally:
        peer.close()
        transport.close()
        assert transport.is_closing()
        await asyncio.wait_for(receiver.lost.wait(), WAIT_S)


def _readable(sock: socket.socket) -> bool:
    try:
        sock.recv(100, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    return True


# ---------------------------------------------------------------------- the peers' use of stamps
async def test_a_clear_stamped_before_the_last_playout_tick_silences_that_tick() -> None:
    """The kernel's stamp of a ``clear`` can precede playout ticks the loop ran before reading
    it: those ticks would have been silent, and silence starts at the clear's arrival."""
    call, _ = open_call()  # playout from t=100 s
    audio = base64.b64encode(b"\x10" * 800).decode()  # 5 frames
    from_gateway(
        call, {"event": "media", "streamSid": call.stream_sid, "media": {"payload": audio}}
    )
    for k in range(3):
        call.tick(100.0 + 0.02 * k)
        call.heard_times[k] = 100.0 + 0.02 * k  # (playout stamps the real instant)
    clear_at = 100.02501  # arrived in the second tick, read after the third
    call._on_clear(clear_at)
    assert list(call.heard_bytes) == [160, 40, 0]
    assert call.silence_after(clear_at) == pytest.approx(clear_at)
    assert call.clear_times == [clear_at]


async def test_the_analysis_gives_loop_stamped_figures_beside_the_kernel_ones() -> None:
    call = new_call()
    for k in range(100):  # one run of gateway audio: kernel-exact, the loop 0-6 ms late
        call.recv_times.append(10.0 + 0.02 * k)
        call.recv_loop_times.append(10.0 + 0.02 * k + (0.006 if k % 10 == 5 else 0.0))
        call.recv_bytes.append(160)
    session = LeanSession(LeanApp(secret=None))
    for k in range(500):
        call.sent_times.append(5.0 + 0.02 * k)
        session.audio_times.append(5.0 + 0.02 * k + 0.002)
        session.audio_loop_times.append(5.0 + 0.02 * k + 0.009)
        session.audio_tracks.append(1)
        session.audio_loud.append(0)
    script = AppScript("CA1", session, 5.0)
    script.bursts = [Burst(0, "audio", 30.0, "b0", None, 2000)]  # outside the window
    figures = analyse_calls([(call, script)], (9.0, 14.0))
    assert figures.inbound_latency_ms == pytest.approx([2.0] * 250)
    assert figures.inbound_latency_loop_ms == pytest.approx([9.0] * 250)
    assert max(figures.jitter_ms) == pytest.approx(0.0, abs=1e-6)
    assert max(figures.jitter_loop_ms) == pytest.approx(6.0)
    step = figures.as_dict()
    assert step["inbound_latency_loop_ms"]["p99"] == pytest.approx(9.0)
    line = receive_stamps_line(step)
    assert "inbound 2.0/2.0/2.0 vs 9.0/9.0/9.0" in line
    assert "caller jitter 0.0/0.0/0.0 vs 0.0/6.0/6.0" in line
