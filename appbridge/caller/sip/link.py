"""The caller's signalling flow: one connected UDP socket or one TCP or TLS connection around a
:class:`~appbridge.carriers.sip.transaction.TransactionLayer` (RFC 3261 §17, §18, §26).

Over TLS (``;transport=tls``) the gateway's certificate is checked against
the system roots, which OpenSSL reads from ``SSL_CERT_FILE`` when set (a private CA), and
against the target's host (docs/caller.md).

The gateway's ``transport.SipTransport`` serves listeners and cannot open outbound TCP
connections, so the caller has this small shell of its own; it carries out the layer's effects
(``Send``, ``Deliver``, ``Timeout``/``TransportError``) and keeps one timer, as the package
docstring of :mod:`appbridge.carriers.sip` describes.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Protocol

from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.headers import SipParseError, SipUri
from appbridge.carriers.sip.message import (
    Request,
    Response,
    apply_received,
    make_response,
    parse_message,
)
from appbridge.carriers.sip.transaction import (
    Deliver,
    Effect,
    Send,
    Timeout,
    TransactionLayer,
    TransportError,
)
from appbridge.carriers.sip.transport import SDP_TYPE
from appbridge.clock import Clock

__all__ = ["LinkUser", "SipLink", "SipTarget", "parse_sip_target"]


class LinkUser(Protocol):
    """Who gets the link's messages (the caller)."""

    def on_message(self, message: Request | Response) -> None: ...

    def on_timeout(self, request: Request, *, unreachable: bool = False) -> None:
        """No final response in time (Timer B/F), or, with ``unreachable``, the flow failed
        (ICMP unreachable on UDP, a closed TCP connection)."""
        ...


@dataclass(frozen=True, slots=True)
class SipTarget:
    """Where the INVITE goes: the URI, its host and port (5060 by default), the transport."""

    uri: SipUri
    host: str
    port: int
    transport: str  # "udp", "tcp" or "tls"


def parse_sip_target(text: str) -> SipTarget:
    """``sip:user@host[:port][;transport=udp|tcp|tls]`` (RFC 3261 §19.1; port 5061 by default
    over TLS); raises ValueError. ``sips:`` is refused: the caller keeps no TLS end to end
    promise beyond its own hop (RFC 5630 §3)."""
    try:
        uri = SipUri.parse(text.strip())
    except SipParseError as exc:
        raise ValueError(f"not a SIP URI: {text!r} ({exc})") from None
    if uri.scheme != "sip":
        raise ValueError(f"only sip: URIs are supported (use ;transport=tls), got {text!r}")
    if not uri.host:
        raise ValueError(f"the SIP URI has no host: {text!r}")
    transport = (uri.param("transport") or "udp").lower()
    if transport not in ("udp", "tcp", "tls"):
        raise ValueError(f"transport={transport} is not supported; use udp, tcp or tls")
    port = uri.port or (5061 if transport == "tls" else 5060)
    return SipTarget(uri, uri.host.strip("[]"), port, transport)


class SipLink:
    """Signalling over one connected UDP socket or one TCP or TLS connection, around a
    :class:`TransactionLayer` with one timer (as ``transport.SipTransport`` does for the
    gateway's listeners, which cannot open outbound TCP connections)."""

    def __init__(self, target: SipTarget, clock: Clock, owner: LinkUser) -> None:
        self.target = target
        self.clock = clock
        self.owner = owner
        self.layer = TransactionLayer()
        self.reliable = target.transport in ("tcp", "tls")
        self.peer = (target.transport, target.host, target.port)
        self.local: tuple[str, int] = ("127.0.0.1", 0)
        self._udp: asyncio.DatagramTransport | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        t = self.target
        if t.transport == "tls":
            context = ssl.create_default_context()  # system roots, or SSL_CERT_FILE
            reader, self._writer = await asyncio.open_connection(
                t.host, t.port, ssl=context, server_hostname=t.host
            )
            self._reader_task = loop.create_task(self._read_tcp(reader))
            sock = self._writer.get_extra_info("sockname")
        elif self.reliable:
            reader, self._writer = await asyncio.open_connection(t.host, t.port)
            self._reader_task = loop.create_task(self._read_tcp(reader))
            sock = self._writer.get_extra_info("sockname")
        else:
            link = self

            class _Proto(asyncio.DatagramProtocol):
                def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
                    link.on_data(data, (str(addr[0]), int(addr[1])))

                def error_received(self, exc: Exception) -> None:
                    link.on_error()

            transport, _ = await loop.create_datagram_endpoint(
                _Proto, remote_addr=(t.host, t.port), family=socket.AF_INET
            )
            self._udp = transport
            sock = transport.get_extra_info("sockname")
        self.local = (str(sock[0]), int(sock[1]))

    async def _read_tcp(self, reader: asyncio.StreamReader) -> None:
        framer = SipStreamFramer()
        try:
            while data := await reader.read(65536):
                for item in framer.feed(data):
                    if not isinstance(item, SipParseError):
                        self.on_data(item, (self.target.host, self.target.port), datagram=False)
                if framer.broken:
                    break
        except (ConnectionError, OSError):
            pass
        if not self.closed:
            self.on_error()

    def on_data(self, data: bytes, source: tuple[str, int], *, datagram: bool = True) -> None:
        if not data.strip(b"\r\n"):
            return  # keepalive
        try:
            message = parse_message(data, datagram=datagram)
            if isinstance(message, Request):
                apply_received(message, *source)
        except SipParseError:
            return
        now = self.clock.now()
        self._effects(self.layer.receive(message, peer=self.peer, reliable=self.reliable, now=now))

    def on_error(self) -> None:
        """ICMP unreachable or a closed connection: every transaction on the flow fails."""
        self._effects(self.layer.transport_error(self.peer, self.clock.now()))

    def _effects(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._write(effect.data)
            elif isinstance(effect, Deliver):
                self.owner.on_message(effect.message)
            elif isinstance(effect, Timeout):
                self.owner.on_timeout(effect.request)
            elif isinstance(effect, TransportError):
                self.owner.on_timeout(effect.request, unreachable=True)
        self._rearm()

    def _write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)
        elif self._udp is not None and not self._udp.is_closing():
            self._udp.sendto(data)

    def send_request(self, request: Request) -> None:
        now = self.clock.now()
        self._effects(
            self.layer.send_request(request, peer=self.peer, reliable=self.reliable, now=now)
        )

    def respond(
        self,
        request: Request,
        status: int,
        *,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> None:
        """Answer through the server transaction (§17.2), else statelessly."""
        response = make_response(
            request, status, headers=headers or [], body=body, content_type=SDP_TYPE
        )
        try:
            effects = self.layer.send_response(response, self.clock.now())
        except LookupError:
            self._write(response.serialize())
            return
        self._effects(effects)

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self.layer.next_deadline()
        if due is not None and not self.closed:
            delay_s = max(0.0, due - self.clock.now())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._effects(self.layer.on_timer(self.clock.now()))

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
