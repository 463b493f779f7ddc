"""Transports for the bench's lean peers that stamp each read with the kernel's arrival time.

Why (bench/README.md, "Receive stamps"): the figures measure the *gateway* (inbound
added latency, caller jitter, clear-to-silence), but a peer that stamps a message with
``time.monotonic()`` when its event loop gets round to ``data_received`` adds the generator's
own loop lag to every figure; at 150+ calls the generator is 30-40 % busy and that lag is most
of the jitter tail. The kernel stamps each incoming skb when it is queued for the socket
(``SO_TIMESTAMPNS``, socket(7); on loopback that is the instant the gateway's ``send``/``sendto``
ran), and ``recvmsg`` returns the stamp as ancillary data (``SOL_SOCKET``, ``SCM_TIMESTAMPNS``,
a ``struct timespec`` in CLOCK_REALTIME). uvloop's transports cannot hand over ancillary data,
so these are small transports of our own over non-blocking sockets, driven by
``loop.add_reader``/``add_writer`` (which uvloop supports), with the asyncio protocol callbacks
the lean peers already implement: ``connection_made``, ``data_received``, ``eof_received``,
``connection_lost``; ``datagram_received``/``error_received`` for RTP.

Each transport exposes the last read's stamps: ``rx_time`` (the kernel's, converted to the
bench's clock, CLOCK_MONOTONIC seconds) and ``rx_loop_time`` (``time.monotonic()`` when the
read ran: the old stamp, kept so the bench can show how much of a figure was its own lag).
Send stamps are not touched: the peers take them right before the write.

TCP: the stamp of a read is that of the **last** segment it consumed (the kernel keeps one
stamp per read, and merges queued segments taking the later stamp, tcp(7)). When one read
carries several WebSocket frames they all get it, which is later than the first one's real
arrival: conservative for latency. It only happens when the peer fell a whole message period
behind on that socket, and the loop stamp would then be later still.

CLOCK_REALTIME → CLOCK_MONOTONIC: :class:`StampClock` keeps ``offset_s = time.time() -
time.monotonic()`` (read between two monotonic reads, their midpoint; the narrowest of a few
tries, so that a preemption between the reads cannot skew it), refreshed at most once a second
from the read path, never per packet. Both clocks are slewed alike by NTP, so the
offset only moves on a step; a step is picked up within a second.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "ANCILLARY_BYTES",
    "SCM_TIMESTAMPNS",
    "SO_TIMESTAMPNS",
    "StampClock",
    "StampedDatagramTransport",
    "StampedServer",
    "StampedTransport",
    "enable_stamps",
    "open_connection",
    "open_datagram",
    "read_times",
    "realtime_to_monotonic_s",
    "start_server",
]

#: socket(7) ``SO_TIMESTAMPNS`` (missing from Python's socket module; 35 on Linux), and its
#: control message type ``SCM_TIMESTAMPNS`` (the same number).
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS: int = SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("qq")  # struct timespec on 64-bit Linux: tv_sec, tv_nsec
#: Room for one timestamp control message.
ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
#: Bytes per stream read: a 64 KiB buffer comes from the heap (glibc mmaps 128 KiB and more),
#: and the peers' messages are under 1 KiB, so one read still drains many of them.
RECV_BYTES = 65536
#: Bytes per datagram read: RTP from the gateway is 172 bytes (PCMU, 20 ms); a larger one is
#: truncated (MSG_TRUNC), which no peer of the bench sends.
DATAGRAM_BYTES = 4096
#: Writers are paused above this many buffered bytes and resumed below the low mark (asyncio's
#: defaults for selector transports).
HIGH_WATER_BYTES = 64 * 1024
LOW_WATER_BYTES = 16 * 1024
#: Offset reads per refresh at most (:meth:`StampClock.refresh`), and the bracket width that
#: ends them early: two clock reads take well under a microsecond through the vDSO, so a
#: bracket of 20 µs or more means the reads were interrupted.
REFRESH_TRIES = 5
TIGHT_BRACKET_S = 20e-6

_monotonic = time.monotonic
_unpack_timespec = _TIMESPEC.unpack_from
_SOL_SOCKET = socket.SOL_SOCKET


def realtime_to_monotonic_s(sec: int, nsec: int, offset_s: float) -> float:
    """A CLOCK_REALTIME ``timespec`` as CLOCK_MONOTONIC seconds, ``offset_s`` being
    realtime - monotonic. The integer seconds are reduced first, so the float keeps
    sub-microsecond precision (``offset_s`` itself is exact to about 0.25 µs at 2026 epochs)."""
    return (sec - offset_s) + nsec * 1e-9


class StampClock:
    """The realtime → monotonic offset for kernel stamps (module doc), one per process.

    ``now()`` is ``time.monotonic()`` and refreshes the offset when ``refresh_s`` has passed;
    the read path calls it once per read anyway (it is the loop-time stamp), so no timer is
    needed. The clocks are injectable for tests.
    """

    __slots__ = (
        "_monotonic",
        "_realtime",
        "bracket_s",
        "offset_s",
        "refresh_at",
        "refresh_s",
        "refreshes",
    )

    def __init__(
        self,
        *,
        refresh_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        realtime: Callable[[], float] = time.time,
    ) -> None:
        self.refresh_s = refresh_s
        self._monotonic = monotonic
        self._realtime = realtime
        self.offset_s = 0.0
        self.bracket_s = float("inf")  # the width of the reads the offset came from
        self.refresh_at = -float("inf")
        self.refreshes = 0

    def now(self) -> float:
        now = self._monotonic()
        if now >= self.refresh_at:
            self.refresh(now)
        return now

    def refresh(self, now: float) -> None:
        """Re-read the offset: the realtime read bracketed by two monotonic ones, midpoint.

        The midpoint is only as good as the bracket is narrow: a preemption or a pause of the
        virtual machine between the reads widens it, and half its width becomes an error of
        every stamp until the next refresh (one such error put a burst's first frame a fraction
        of a millisecond before the burst's send, so the analysis counted it as lost). So the
        reads are taken up to :data:`REFRESH_TRIES` times and the narrowest bracket wins; a
        bracket of at most :data:`TIGHT_BRACKET_S` ends the search at once."""
        best_width = float("inf")
        offset = self.offset_s
        for _ in range(REFRESH_TRIES):
            before = self._monotonic()
            real = self._realtime()
            after = self._monotonic()
            width = after - before
            if width < best_width:
                best_width, offset = width, real - (before + after) * 0.5
            if width <= TIGHT_BRACKET_S:
                break
        self.offset_s = offset
        self.bracket_s = best_width
        self.refresh_at = now + self.refresh_s
        self.refreshes += 1

    def stamp(self, ancillary: Sequence[tuple[int, int, bytes]], read_at: float) -> float:
        """The kernel's arrival time in an ``recvmsg`` ancillary list, as monotonic seconds;
        ``read_at`` (the loop-time stamp, ``time.monotonic()``) when there is none. Never later
        than ``read_at``: the data cannot have arrived after it was read (the offset's own error
        is < 1 µs). Refreshes the offset when it is due (``read_at`` is the clock's now)."""
        if read_at >= self.refresh_at:
            self.refresh(read_at)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(data)
                at = (sec - self.offset_s) + nsec * 1e-9
                return at if at < read_at else read_at
        return read_at


#: The process's clock (every transport shares it unless told otherwise).
CLOCK = StampClock()


def read_times(stamps: StampedTransport | None) -> tuple[float, float]:
    """(kernel stamp, loop stamp) of the read a protocol is handling, monotonic seconds; the
    loop's clock twice for a transport without stamps (uvloop's). A TCP read carries the stamp
    of its last segment: when it holds several frames, the earlier ones are stamped late
    (conservative)."""
    if stamps is None:
        now = time.monotonic()
        return now, now
    return stamps.rx_time, stamps.rx_loop_time


def enable_stamps(sock: socket.socket) -> None:
    """Ask the kernel to stamp what arrives on ``sock`` (socket(7) ``SO_TIMESTAMPNS``)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def _report(
    loop: asyncio.AbstractEventLoop, message: str, exc: BaseException, transport: object
) -> None:
    loop.call_exception_handler({"message": message, "exception": exc, "transport": transport})


class _StampedBase(asyncio.BaseTransport):
    """What the stream and the datagram transport share (module doc): the socket, the stamped
    read's bookkeeping, protocol calls, and closing (as :class:`StampedTransport` says)."""

    __slots__ = (
        "_buffer",
        "_clock",
        "_closing",
        "_fd",
        "_loop",
        "_lost",
        "_protocol",
        "_reading",
        "_recvmsg",
        "_sock",
        "rx_loop_time",
        "rx_time",
        "unstamped_reads",
    )

    #: What the kernel has not taken yet (the subclass sets it: bytes or queued datagrams).
    _buffer: bytearray | collections.deque[tuple[bytes, Any]]

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.BaseProtocol,
        clock: StampClock,
        extra: dict[str, Any],
    ) -> None:
        super().__init__(extra)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._recvmsg = sock.recvmsg
        self._protocol: Any = protocol
        self._clock = clock
        self._closing = False
        self._lost = False
        self._reading = False
        self.rx_time = 0.0
        self.rx_loop_time = 0.0
        self.unstamped_reads = 0

    def _start(self) -> None:
        """Hand the transport to the protocol, then read unless it closed it already (the
        subclass calls this last in ``__init__``, once its own state is set)."""
        self._protocol.connection_made(self)
        self._start_reading()

    # -- reading (the subclass gives the read size, and what a failed and a good read do) ---
    _recv_bytes: int
    _read_failed: Callable[[OSError], None]
    _received: Callable[[bytes, Any], None]

    def _read_ready(self) -> None:
        """One ``recvmsg`` per readiness callback, stamped: ``rx_loop_time`` is now, ``rx_time``
        the kernel's arrival time (:meth:`StampClock.stamp`, its common case inlined: our one
        control message, the timestamp), or now when the kernel gave none."""
        try:
            data, ancillary, _flags, addr = self._recvmsg(self._recv_bytes, ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._read_failed(exc)
            return
        self.rx_loop_time = now = _monotonic()
        if not ancillary:
            self.rx_time = now
            self.unstamped_reads += 1
        else:
            clock = self._clock
            if now >= clock.refresh_at:
                clock.refresh(now)
            level, kind, raw = ancillary[0]
            if kind == SCM_TIMESTAMPNS and level == _SOL_SOCKET and len(raw) >= 16:
                sec, nsec = _unpack_timespec(raw)
                at = (sec - clock.offset_s) + nsec * 1e-9
                self.rx_time = at if at < now else now
            else:
                self.rx_time = clock.stamp(ancillary, now)
        self._received(data, addr)

    def _start_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _call_protocol(self, name: str, *args: Any, fatal: bool = False) -> Any:
        """``protocol.<name>(*args)``'s result; a failure is reported to the loop's exception
        handler (as asyncio's transports do), closes the transport when ``fatal``, and gives
        None."""
        try:
            return getattr(self._protocol, name)(*args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            _report(self._loop, f"protocol.{name}() failed", exc, self)
            if fatal:
                self._force_close(exc)
            return None

    # -- closing ----------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; close once what was written has been sent."""
        if self._closing:
            return
        self._closing = True
        self._stop_reading()
        if not self._buffer:
            self._connection_lost_soon(None)

    def abort(self) -> None:
        """Close at once; what is still buffered is dropped."""
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._loop.remove_writer(self._fd)
        self._closing = True
        self._stop_reading()
        self._connection_lost_soon(exc)

    def _flushed(self) -> None:
        """The write buffer has drained: stop watching for writability; finish a close."""
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._connection_lost_soon(None)

    def _connection_lost_soon(self, exc: BaseException | None) -> None:
        if not self._lost:
            self._lost = True
            self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            self._protocol.connection_lost(exc if isinstance(exc, Exception) else None)
        finally:
            self._sock.close()

    def get_protocol(self) -> asyncio.BaseProtocol:
        protocol: asyncio.BaseProtocol = self._protocol
        return protocol


class StampedTransport(_StampedBase, asyncio.Transport):
    """A TCP stream transport over a connected non-blocking socket (module doc).

    Reads: one ``recvmsg`` per readiness callback, stamped (``rx_time``, ``rx_loop_time``),
    then ``protocol.data_received``; an empty read is EOF (``eof_received``; closed unless it
    returns true). Writes: sent at once; what the kernel does not take is buffered and sent
    from ``add_writer``. ``close()`` stops reading and closes after the buffer is flushed;
    ``abort()`` drops the buffer. ``connection_lost`` comes from the loop (``call_soon``) as
    in asyncio, and the socket is closed after it.
    """

    __slots__ = ("_high_water", "_low_water", "_protocol_paused")

    _buffer: bytearray

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.BaseProtocol,
        clock: StampClock = CLOCK,
    ) -> None:
        extra: dict[str, Any] = {"socket": sock}
        with contextlib.suppress(OSError):
            extra["sockname"] = sock.getsockname()
        with contextlib.suppress(OSError):
            extra["peername"] = sock.getpeername()
        super().__init__(loop, sock, protocol, clock, extra)
        self._buffer = bytearray()
        self._protocol_paused = False
        self._high_water = HIGH_WATER_BYTES
        self._low_water = LOW_WATER_BYTES
        self._start()

    # -- reading ----------------------------------------------------------------------------
    _recv_bytes = RECV_BYTES

    def _read_failed(self, exc: OSError) -> None:
        self._force_close(exc)

    def _received(self, data: bytes, addr: Any) -> None:
        """An empty read is EOF; data goes to the protocol (a failure closes the connection)."""
        if not data:
            self._read_eof()
            return
        self._call_protocol("data_received", data, fatal=True)

    def _read_eof(self) -> None:
        self._stop_reading()
        # After a failure the transport is closed already, and close() does nothing.
        if not self._call_protocol("eof_received", fatal=True):
            self.close()

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._stop_reading()

    def resume_reading(self) -> None:
        self._start_reading()

    # -- writing ----------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send now; buffer what the kernel did not take. Ignored once closing or lost."""
        if self._closing or not data:
            return
        buffer = self._buffer
        if not buffer:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        buffer += data
        if not self._protocol_paused and len(buffer) > self._high_water:
            self._protocol_paused = True
            self._call_protocol("pause_writing")

    def _write_ready(self) -> None:
        buffer = self._buffer
        try:
            sent = self._sock.send(buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del buffer[:sent]
        if self._protocol_paused and len(buffer) <= self._low_water:
            self._protocol_paused = False
            self._call_protocol("resume_writing")
        if not buffer:
            self._flushed()

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low_water, self._high_water

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high_water = HIGH_WATER_BYTES if high is None else high
        self._low_water = self._high_water // 4 if low is None else low

    def can_write_eof(self) -> bool:
        return False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol


class StampedDatagramTransport(_StampedBase, asyncio.DatagramTransport):
    """A UDP transport over a bound non-blocking socket (module doc): one stamped ``recvmsg``
    per readiness callback, then ``protocol.datagram_received``; ``sendto`` sends at once and
    queues what would block (sent from ``add_writer``). Closing as in :class:`_StampedBase`;
    ``connection_lost`` is always given None."""

    __slots__ = ()

    _buffer: collections.deque[tuple[bytes, Any]]

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.DatagramProtocol,
        clock: StampClock = CLOCK,
    ) -> None:
        super().__init__(
            loop, sock, protocol, clock, {"socket": sock, "sockname": sock.getsockname()}
        )
        self._buffer = collections.deque()
        self._start()

    _recv_bytes = DATAGRAM_BYTES

    def _read_failed(self, exc: OSError) -> None:
        # e.g. ECONNREFUSED from an ICMP error: the socket lives on.
        self._protocol.error_received(exc)

    def _received(self, data: bytes, addr: Any) -> None:
        self._call_protocol("datagram_received", data, addr)

    def _send(self, data: bytes | bytearray | memoryview, addr: Any) -> None:
        if addr is None:
            self._sock.send(data)
        else:
            self._sock.sendto(data, addr)

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        if not self._buffer:
            try:
                self._send(data, addr)
                return
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._fd, self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        self._buffer.append((bytes(data), addr))

    def _write_ready(self) -> None:
        buffer = self._buffer
        while buffer:
            data, addr = buffer[0]
            try:
                self._send(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            buffer.popleft()
        self._flushed()

    def get_write_buffer_size(self) -> int:
        return sum(len(data) for data, _ in self._buffer)


class StampedServer:
    """A listening TCP socket; each accepted connection gets a :class:`StampedTransport` and a
    protocol from ``protocol_factory`` (what ``loop.create_server`` does, stamped)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        clock: StampClock = CLOCK,
        backlog: int = 1024,
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._factory = protocol_factory
        self._clock = clock
        self._backlog = backlog
        self.sockets = [sock]
        self.accept_errors = 0
        loop.add_reader(sock.fileno(), self._accept_ready)

    @property
    def port(self) -> int:
        port: int = self.sockets[0].getsockname()[1]
        return port

    def _accept_ready(self) -> None:
        listener = self._sock
        if listener is None:
            return
        for _ in range(self._backlog):
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next readiness
                self.accept_errors += 1
                _report(self._loop, "accept() failed", exc, self)
                return
            try:
                _prepare_stream(conn)
                StampedTransport(self._loop, conn, self._factory(), self._clock)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                conn.close()
                _report(self._loop, "setting up an accepted connection failed", exc, self)

    def close(self) -> None:
        """Stop listening (accepted connections live on, as with ``asyncio.Server``)."""
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    async def wait_closed(self) -> None:
        return None


def _prepare_stream(sock: socket.socket) -> None:
    sock.setblocking(False)
    # Each WebSocket frame goes out as written (asyncio and uvloop set it on TCP transports).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    enable_stamps(sock)


async def _new_socket(
    host: str, port: int, kind: socket.SocketKind, flags: int = 0
) -> tuple[asyncio.AbstractEventLoop, socket.socket, Any]:
    """The running loop, a socket for ``host``:``port``'s first address, and that address."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=kind, flags=flags)
    family, sock_kind, proto, _, address = infos[0]
    return loop, socket.socket(family, sock_kind, proto), address


@contextlib.contextmanager
def _closed_on_error(sock: socket.socket) -> Iterator[None]:
    """Close ``sock`` if setting it up fails (cancellation included), so none leaks."""
    try:
        yield
    except BaseException:
        sock.close()
        raise


async def start_server(
    protocol_factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    *,
    clock: StampClock = CLOCK,
    backlog: int = 1024,
) -> StampedServer:
    """Listen on ``host``:``port`` (0: a free port) with stamped transports."""
    loop, sock, address = await _new_socket(host, port, socket.SOCK_STREAM, socket.AI_PASSIVE)
    with _closed_on_error(sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    return StampedServer(loop, sock, protocol_factory, clock, backlog)


async def open_connection(
    protocol_factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    *,
    clock: StampClock = CLOCK,
) -> tuple[StampedTransport, asyncio.Protocol]:
    """Connect to ``host``:``port`` (``loop.sock_connect``) with a stamped transport."""
    loop, sock, address = await _new_socket(host, port, socket.SOCK_STREAM)
    with _closed_on_error(sock):
        _prepare_stream(sock)
        await loop.sock_connect(sock, address)
        protocol = protocol_factory()
        transport = StampedTransport(loop, sock, protocol, clock)
    return transport, protocol


async def open_datagram(
    protocol_factory: Callable[[], asyncio.DatagramProtocol],
    local_addr: tuple[str, int],
    *,
    clock: StampClock = CLOCK,
) -> tuple[StampedDatagramTransport, asyncio.DatagramProtocol]:
    """A UDP socket bound to ``local_addr`` (port 0: a free one) with a stamped transport."""
    loop, sock, address = await _new_socket(*local_addr, socket.SOCK_DGRAM, socket.AI_PASSIVE)
    with _closed_on_error(sock):
        sock.setblocking(False)
        enable_stamps(sock)
        sock.bind(address)
        protocol = protocol_factory()
        transport = StampedDatagramTransport(loop, sock, protocol, clock)
    return transport, protocol
