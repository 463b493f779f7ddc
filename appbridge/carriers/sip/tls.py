"""TLS for SIP signalling (RFC 3261 §26.3.1, RFC 5630): the OpenSSL contexts and failure text.

Everything cryptographic is Python's ``ssl`` module; this module only decides the settings
(docs/sip.md, "TLS and SRTP trunks"):

- the server side of ``tls:`` listeners presents ``[sip] tls`` ``cert_file``/``key_file`` and
  asks for no client certificate: who may call is decided by source address, as on UDP and TCP;
- the client side toward ``transport = "tls"`` trunks verifies the trunk's chain against the
  system roots plus ``ca_file`` and its name against the trunk's ``host`` (RFC 5922 §7), and
  presents ``cert_file`` when one is configured (a trunk may ask for it);
- both refuse anything older than TLS 1.2.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from appbridge.config.model import TlsFiles

__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "TlsServerStream",
    "client_context",
    "describe_tls_error",
    "server_context",
]

#: A peer that stops mid-handshake loses its connection after this long (docs/sip.md).
HANDSHAKE_TIMEOUT_S = 10.0


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """The context of every ``tls:`` listener."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert_file, files.key_file)
    return context


def client_context(files: TlsFiles | None) -> ssl.SSLContext:
    """The context of outbound connections to TLS trunks (module doc)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if files is not None:
        if files.ca_file is not None:
            context.load_verify_locations(cafile=files.ca_file)
        context.load_cert_chain(files.cert_file, files.key_file)
    return context


def describe_tls_error(exc: BaseException) -> str:
    """OpenSSL's reason in words for a log line: ``certificate verify failed: hostname
    mismatch, ...`` for a refused certificate, the library's reason for other failures."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = (exc.verify_message or "").rstrip(".")
        if detail:
            return f"certificate verify failed: {detail[:1].lower()}{detail[1:]}"
        return "certificate verify failed"
    if isinstance(exc, ssl.SSLError):
        return (exc.reason or str(exc)).replace("_", " ").lower()
    if isinstance(exc, TimeoutError):
        return "no TLS handshake in time"
    return str(exc) or type(exc).__name__


class TlsServerStream:
    """The server side of one TLS connection over an accepted TCP stream, through
    ``ssl.MemoryBIO``: OpenSSL does the protocol, this class only moves bytes. Reading the TCP
    stream ourselves means no byte the client sent before the handshake started is lost, on
    any event loop. It offers what the transport's stream path uses of a reader and a writer
    (``read``, ``write``, ``is_closing``, ``close``, ``get_extra_info``), so a TLS connection
    is handled exactly like a TCP one once :meth:`handshake` returned."""

    def __init__(
        self, context: ssl.SSLContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    async def handshake(self, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        """Raises ``ssl.SSLError`` (bad records, plain text, no shared version), ``TimeoutError``
        or ``ConnectionError`` (the client left)."""
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    self._ssl.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._flush()
                    data = await self._reader.read(65536)
                    if not data:
                        raise ConnectionResetError("the client left during the handshake") from None
                    self._incoming.write(data)
        self._flush()

    async def read(self, n: int) -> bytes:
        """Up to ``n`` decrypted octets; ``b""`` when the client closed (close_notify or EOF)."""
        while True:
            try:
                data = self._ssl.read(n)
                self._flush()
                return data
            except ssl.SSLWantReadError:
                self._flush()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            raw = await self._reader.read(65536)
            if raw:
                self._incoming.write(raw)
            else:
                self._incoming.write_eof()

    def write(self, data: bytes) -> None:
        try:
            self._ssl.write(data)
        except ssl.SSLError:
            self._writer.close()
            return
        self._flush()

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        if self._writer.is_closing():
            return
        try:
            self._ssl.unwrap()  # our close_notify (RFC 8446 §6.1)
        except ssl.SSLError:
            pass
        self._flush()
        self._writer.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        return self._writer.get_extra_info(name, default)

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data and not self._writer.is_closing():
            self._writer.write(data)
