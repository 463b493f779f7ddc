"""The asyncio shell of the SIP stack: UDP, TCP and TLS listeners, and one timer (RFC 3261 §18).

It does what the package docstring (``carriers/sip/__init__.py``) lists, and nothing more:

1. Frames and parses: UDP datagrams with ``parse_message``, TCP streams with
   :class:`~.framing.SipStreamFramer`. Malformed input gets 400 (505, 513) when
   ``SipParseError.can_respond``; a message over 64 KiB is dropped on UDP and answered 513 on
   TCP (docs/sip.md); everything else that cannot be answered is dropped and counted. A TCP
   connection whose framing broke is closed. A TLS connection is a TCP stream once its
   handshake is done (RFC 3261 §26.3.1): the same framing, answers and timers apply to it.
2. Stamps ``received``/``rport`` on requests (RFC 3581), feeds the
   :class:`~.transaction.TransactionLayer` and carries out its effects: ``Send`` on the peer's
   transport, ``Deliver`` to the transaction user (``SipInbound``), ``Timeout`` to it as well.
3. Keeps ONE timer at the earliest of the layer's and the user's deadlines.
4. Sends responses over UDP to ``response_address(top Via)`` and over a stream on the
   request's connection: a *peer* is ``("udp", host, port)``, ``("tcp", connection id)`` or
   ``("tls", connection id)``.
5. Opens outbound TCP and TLS connections to trunks on demand (:meth:`SipTransport.connect_tcp`,
   :meth:`SipTransport.connect_tls`), one per trunk address, reused while open; their responses
   and requests come back on the same connection (RFC 3261 §18.1.1, §18.2.2; RFC 5923). A
   connection that closes fails its transactions. A TCP client whose Via carries ``alias``
   (RFC 5923 §5) has its connection reused for our new requests to its sent-by address.
6. A TLS handshake that fails (garbage, plain-text SIP, a client that stalls past
   :data:`~.tls.HANDSHAKE_TIMEOUT_S`) ends that connection only, with an info line.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.headers import SipParseError
from appbridge.carriers.sip.message import (
    Request,
    Response,
    apply_received,
    make_response,
    parse_message,
    response_address,
)
from appbridge.carriers.sip.tls import (
    HANDSHAKE_TIMEOUT_S,
    TlsServerStream,
    client_context,
    describe_tls_error,
    server_context,
)
from appbridge.carriers.sip.transaction import (
    Deliver,
    Effect,
    Send,
    Timeout,
    TransactionLayer,
    TransportError,
)
from appbridge.clock import Clock
from appbridge.config.model import TlsFiles
from appbridge.net.listen import ListenError

log = logging.getLogger(__name__)

SDP_TYPE = "application/sdp"
Peer = tuple[Any, ...]  # ("udp", host, port), ("tcp", connection id) or ("tls", connection id)
TCP_IDLE_PENDING_S = 30.0  # RFC 4475 §3.1.2.2: a partial message may not wait forever
STREAM_KINDS = frozenset({"tcp", "tls"})
_ConnKey = tuple[str, str, int, str]


def is_stream(peer: Peer) -> bool:
    """A TCP or TLS connection: reliable, framed by Content-Length (RFC 3261 §18.3)."""
    return peer[0] in STREAM_KINDS


def via_transport(peer: Peer) -> str:
    """The Via transport token for a peer's kind (RFC 3261 §20.42): UDP, TCP or TLS."""
    return str(peer[0]).upper()


class TransactionUser(Protocol):
    """What the transport hands messages to (``inbound.SipInbound``)."""

    def on_message(self, message: Request | Response, peer: Peer, now: float) -> None: ...

    def on_timeout(self, request: Request, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def on_timer(self, now: float) -> None: ...


@dataclass
class TransportStats:
    received: int = 0
    sent: int = 0
    malformed: int = 0  # answered 400/505/513
    dropped: int = 0  # could not be answered


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is no subclass

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.owner.on_udp(self, data, (str(addr[0]), int(addr[1])))


class _Reader(Protocol):
    async def read(self, n: int) -> bytes: ...


class _Writer(Protocol):
    """What the stream path uses of ``asyncio.StreamWriter`` (and of ``TlsServerStream``)."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class _StreamConn:
    """One TCP or TLS connection: its peer is ``(kind, conn_id)``."""

    def __init__(self, kind: str, conn_id: int, writer: _Writer) -> None:
        self.kind = kind
        self.conn_id = conn_id
        self.writer = writer
        self.framer = SipStreamFramer()

    @property
    def peer(self) -> Peer:
        return (self.kind, self.conn_id)


class SipTransport:
    """Listeners from ``[sip] listen`` around one transaction layer (module doc)."""

    def __init__(
        self,
        listen: tuple[str, ...],
        clock: Clock,
        layer: TransactionLayer,
        tls: TlsFiles | None = None,
    ) -> None:
        self.listen = listen
        self.tls = tls
        self.clock = clock
        self.layer = layer
        self.user: TransactionUser | None = None
        self.stats = TransportStats()
        self._udp: list[_Udp] = []
        self._servers: list[asyncio.Server] = []
        self._conns: dict[int, _StreamConn] = {}
        self._conn_ids = itertools.count(1)
        # (kind, host, port, TLS name) → connection id: a TLS connection is reused only for the
        # name its certificate was checked against.
        self._outbound: dict[_ConnKey, int] = {}
        self._connecting: dict[_ConnKey, asyncio.Lock] = {}
        self._server_tls: ssl.SSLContext | None = None
        self._client_tls: ssl.SSLContext | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.udp_addresses: list[tuple[str, int]] = []
        self.tcp_addresses: list[tuple[str, int]] = []
        self.tls_addresses: list[tuple[str, int]] = []

    # -- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open every ``[sip] listen`` entry; one that cannot be opened raises
        :class:`~appbridge.net.listen.ListenError` naming it."""
        for entry in self.listen:
            proto, host, port_text = _split_listen(entry)
            try:
                await self._open(proto, host, int(port_text))
            except OSError as exc:
                raise ListenError("sip.listen", entry, exc) from None
        kinds = (
            ("udp", self.udp_addresses),
            ("tcp", self.tcp_addresses),
            ("tls", self.tls_addresses),
        )
        listening = "; ".join(
            f"{kind} {', '.join(f'{h}:{p}' for h, p, *_ in addresses)}"
            for kind, addresses in kinds
            if addresses
        )
        log.info("sip: listening on %s", listening)

    async def _open(self, proto: str, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        if proto == "udp":
            udp = _Udp(self)
            transport, _ = await loop.create_datagram_endpoint(
                lambda u=udp: u,  # type: ignore[misc]
                local_addr=(host, port),
            )
            udp.transport = transport  # uvloop calls connection_made a little later
            sock = transport.get_extra_info("sockname")
            self.udp_addresses.append((str(sock[0]), int(sock[1])))
            self._udp.append(udp)
        elif proto == "tls":
            if self.tls is None:
                raise OSError('a "tls:" listener needs [sip] tls')
            if self._server_tls is None:
                self._server_tls = server_context(self.tls)
            server = await asyncio.start_server(self._on_tls, host, port)
            sock = server.sockets[0].getsockname()
            self.tls_addresses.append((str(sock[0]), int(sock[1])))
            self._servers.append(server)
        else:
            server = await asyncio.start_server(self._on_tcp, host, port)
            sock = server.sockets[0].getsockname()
            self.tcp_addresses.append((str(sock[0]), int(sock[1])))
            self._servers.append(server)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for udp in self._udp:
            if udp.transport is not None:
                udp.transport.close()
        for conn in list(self._conns.values()):
            conn.writer.close()
        for task in list(self._readers):
            task.cancel()
        self._outbound.clear()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._udp.clear()
        self._servers.clear()

    @property
    def local_host(self) -> str:
        addrs = self.udp_addresses or self.tcp_addresses or self.tls_addresses
        return addrs[0][0] if addrs else "127.0.0.1"

    def local_port(self, transport: str) -> int:
        """Our listening port for ``transport`` ("udp", "tcp", "tls"), else any listener's."""
        addrs = self._addresses(transport)
        addrs = addrs or self.udp_addresses or self.tcp_addresses or self.tls_addresses
        return addrs[0][1] if addrs else 5060

    def _addresses(self, transport: str) -> list[tuple[str, int]]:
        if transport == "tcp":
            return self.tcp_addresses
        if transport == "tls":
            return self.tls_addresses
        return self.udp_addresses

    # -- input -------------------------------------------------------------------------------
    def on_udp(self, udp: _Udp, data: bytes, source: tuple[str, int]) -> None:
        self.stats.received += 1
        if not data.strip(b"\r\n"):
            return  # a keepalive (RFC 5626 §4.4.1)
        try:
            message = parse_message(data)
        except SipParseError as err:
            if err.kind != "too_large" and err.can_respond:
                self._answer_error(err, ("udp", *source), reliable=False)
            else:
                self.stats.dropped += 1
            return
        self._dispatch(message, source, reliable=False, conn=None)

    async def _on_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _StreamConn("tcp", next(self._conn_ids), writer)
        self._conns[conn.conn_id] = conn
        await self._read_loop(reader, conn)

    async def _on_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection to a ``tls:`` listener: the handshake first, bounded in time, then the
        TCP path unchanged. A failed handshake ends this connection only (module doc, 6)."""
        assert self._server_tls is not None
        stream = TlsServerStream(self._server_tls, reader, writer)
        try:
            await stream.handshake(HANDSHAKE_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            where = _where(writer.get_extra_info("peername"))
            log.info("sip: TLS handshake from %s failed: %s", where, describe_tls_error(exc))
            writer.transport.abort()
            return
        conn = _StreamConn("tls", next(self._conn_ids), stream)
        self._conns[conn.conn_id] = conn
        await self._read_loop(stream, conn)

    async def connect_tcp(self, host: str, port: int, timeout_s: float = 5.0) -> Peer:
        """An outbound TCP connection to ``host:port`` (RFC 3261 §18.1.1), opened on demand and
        reused for every later request to that address while it stays open. Responses come
        back on it and are framed by Content-Length as on inbound connections. Raises
        ``OSError`` (or ``TimeoutError``) when the connection cannot be made."""
        return await self._connect("tcp", host, port, None, timeout_s)

    async def connect_tls(
        self, host: str, port: int, server_hostname: str, timeout_s: float = 5.0
    ) -> Peer:
        """As :meth:`connect_tcp`, over TLS: the far end's certificate must chain to the system
        roots or ``[sip] tls.ca_file`` and name ``server_hostname`` (the trunk's ``host``,
        RFC 5922 §7). Raises ``ssl.SSLError`` when the handshake or the check fails (see
        :func:`~.tls.describe_tls_error`), ``OSError``/``TimeoutError`` as TCP does."""
        return await self._connect("tls", host, port, server_hostname, timeout_s)

    async def _connect(
        self, kind: str, host: str, port: int, server_hostname: str | None, timeout_s: float
    ) -> Peer:
        key = (kind, host, port, server_hostname or "")
        found = self._open_outbound(key)
        if found is not None:
            return found
        lock = self._connecting.setdefault(key, asyncio.Lock())
        async with lock:
            found = self._open_outbound(key)
            if found is not None:
                return found
            if kind == "tls":
                if self._client_tls is None:
                    self._client_tls = client_context(self.tls)
                opening = asyncio.open_connection(
                    host,
                    port,
                    ssl=self._client_tls,
                    server_hostname=server_hostname,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
                )
            else:
                opening = asyncio.open_connection(host, port)
            reader, writer = await asyncio.wait_for(opening, timeout_s)
            conn = _StreamConn(kind, next(self._conn_ids), writer)
            self._conns[conn.conn_id] = conn
            self._outbound[key] = conn.conn_id
            task = asyncio.get_running_loop().create_task(self._read_loop(reader, conn))
            self._readers.add(task)
            task.add_done_callback(self._readers.discard)
            log.info("sip: %s connection %s to %s:%s", kind, conn.conn_id, host, port)
            return conn.peer

    def _open_outbound(self, key: _ConnKey) -> Peer | None:
        conn_id = self._outbound.get(key)
        conn = self._conns.get(conn_id) if conn_id is not None else None
        if conn is not None and not conn.writer.is_closing():
            return conn.peer
        return None

    def tcp_sent_by_port(self, peer: Peer) -> int:
        """The port for the Via sent-by of a request on TCP or TLS connection ``peer``: our
        listener of that kind when there is one (RFC 3261 §18.1.1), else the connection's own
        local port."""
        addrs = self._addresses(str(peer[0]))
        if addrs:
            return addrs[0][1]
        conn = self._conns.get(peer[1])
        if conn is not None:
            sock = conn.writer.get_extra_info("sockname")
            if sock:
                return int(sock[1])
        return self.local_port("udp")

    async def _read_loop(
        self,
        reader: _Reader,
        conn: _StreamConn,
    ) -> None:
        writer = conn.writer
        peername = writer.get_extra_info("peername")
        source = (str(peername[0]), int(peername[1]))
        try:
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(65536), TCP_IDLE_PENDING_S)
                except TimeoutError:
                    if conn.framer.pending:
                        break
                    continue
                if not data:
                    break
                self.stats.received += 1
                untrusted = False
                for item in conn.framer.feed(data):
                    if isinstance(item, SipParseError):
                        untrusted |= self._stream_error(item, conn)
                        continue
                    try:
                        message = parse_message(item, datagram=False)
                    except SipParseError as err:
                        untrusted |= self._stream_error(err, conn)
                        continue
                    self._dispatch(message, source, reliable=True, conn=conn)
                if conn.framer.broken or untrusted:
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.pop(conn.conn_id, None)
            for key in [k for k, v in self._outbound.items() if v == conn.conn_id]:
                del self._outbound[key]  # its own address and any alias (RFC 5923)
            writer.close()
            self._effects(self.layer.transport_error(conn.peer, self.clock.now()))

    def _stream_error(self, err: SipParseError, conn: _StreamConn) -> bool:
        """Answer a bad message on a stream; True when the connection must close. A request
        without Via or CSeq is still answered on its connection, but no transaction of that
        peer can be told apart from the next, so the stream is not trusted further."""
        if err.can_respond:
            self._answer_error(err, conn.peer, reliable=True)
            return False
        if err.can_respond_on_stream:
            self._answer_error(err, conn.peer, reliable=True)
            return True
        self.stats.dropped += 1
        return False

    def _answer_error(self, err: SipParseError, peer: Peer, *, reliable: bool) -> None:
        request = err.message
        assert isinstance(request, Request)
        self.stats.malformed += 1
        if not reliable and peer[0] == "udp":
            # RFC 3581 §4 / RFC 3261 §18.2.2: stamp received/rport from the packet's source and
            # answer there, as for any well-formed request (a NAT'd client still hears its 400).
            try:
                apply_received(request, str(peer[1]), int(peer[2]))
                peer = ("udp", *response_address(request.top_via))
            except SipParseError:
                pass  # the Via could not be read: answer the source
        response = make_response(request, err.status, err.reason)
        self.send_to(response.serialize(), peer)

    def _dispatch(
        self,
        message: Request | Response,
        source: tuple[str, int],
        *,
        reliable: bool,
        conn: _StreamConn | None,
    ) -> None:
        now = self.clock.now()
        peer: Peer
        if isinstance(message, Request):
            apply_received(message, source[0], source[1])
            if conn is not None:
                peer = conn.peer
                self._note_alias(message, source, conn)
            else:
                peer = ("udp", *response_address(message.top_via))
        else:
            peer = conn.peer if conn is not None else ("udp", *source)
        self._effects(self.layer.receive(message, peer=peer, reliable=reliable, now=now))

    def _note_alias(self, request: Request, source: tuple[str, int], conn: _StreamConn) -> None:
        """RFC 5923 §5: a TCP client that puts ``alias`` in its Via may be reached at its
        sent-by address through this connection, so our next request there reuses it. Over
        TLS the alias needs the client's certificate to name that address (§5.3), and the
        gateway asks for none: it opens its own verified connection instead."""
        if conn.kind != "tcp":
            return
        try:
            via = request.top_via
        except SipParseError:
            return
        if via.has_param("alias") and via.host.strip("[]") == source[0]:
            self._outbound.setdefault(("tcp", source[0], via.port or 5060, ""), conn.conn_id)

    # -- effects and output ------------------------------------------------------------------
    def _effects(self, effects: list[Effect]) -> None:
        now = self.clock.now()
        for effect in effects:
            if isinstance(effect, Send):
                self.send_to(effect.data, effect.peer)
            elif isinstance(effect, Deliver) and self.user is not None:
                peer = effect.peer
                assert isinstance(peer, tuple)
                self.user.on_message(effect.message, peer, now)
            elif isinstance(effect, (Timeout, TransportError)) and self.user is not None:
                self.user.on_timeout(effect.request, now)
        self.rearm()

    def send_to(self, data: bytes, peer: Hashable) -> None:
        assert isinstance(peer, tuple)
        self.stats.sent += 1
        if peer[0] in STREAM_KINDS:
            conn = self._conns.get(peer[1])
            if conn is None or conn.writer.is_closing():
                log.debug("sip: %s connection %s is gone; message dropped", peer[0], peer[1])
                return
            conn.writer.write(data)
            return
        if self._udp and self._udp[0].transport is not None:
            self._udp[0].transport.sendto(data, (peer[1], peer[2]))

    def respond(
        self,
        request: Request,
        peer: Peer,
        status: int,
        reason: str | None = None,
        *,
        to_tag: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> None:
        """Answer ``request`` (§8.2.6): a body is always SDP here."""
        response = make_response(
            request,
            status,
            reason,
            to_tag=to_tag,
            headers=headers or [],
            body=body,
            content_type=SDP_TYPE if body else None,
        )
        self.send_response(response, peer)

    def send_response(self, response: Response, peer: Peer) -> None:
        """Through the server transaction when there is one, else statelessly."""
        try:
            effects = self.layer.send_response(response, self.clock.now())
        except LookupError:
            self.send_to(response.serialize(), peer)
            return
        self._effects(effects)

    def send_request(self, request: Request, peer: Peer) -> None:
        reliable = is_stream(peer)
        self._effects(
            self.layer.send_request(request, peer=peer, reliable=reliable, now=self.clock.now())
        )

    # -- the one timer -----------------------------------------------------------------------
    def rearm(self) -> None:
        deadlines = [self.layer.next_deadline()]
        if self.user is not None:
            deadlines.append(self.user.next_deadline())
        due = min((d for d in deadlines if d is not None), default=None)
        if due == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = due
        if due is None:
            return
        delay_s = max(0.0, due - self.clock.now())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        now = self.clock.now()
        effects = self.layer.on_timer(now)
        if self.user is not None:
            self.user.on_timer(now)
        self._effects(effects)


def _where(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return "an unknown address"


def _split_listen(entry: str) -> tuple[str, str, str]:
    """``"udp:HOST:PORT"`` (an IPv6 host in brackets) into its three parts."""
    proto, rest = entry.split(":", 1)
    host, port = rest.rsplit(":", 1)
    return proto.lower(), host.strip("[]"), port
