"""``--srtp`` and ``--sip-transport tls`` of ``make bench`` (bench/README.md, "SRTP and TLS").

What SRTP and TLS cost the gateway is measured against the same SIP calls as the plain run, so
only the secure parts change:

- :func:`make_pki` makes a private CA and the gateway's certificate (``localhost`` and
  127.0.0.1) with the openssl CLI into the run's output folder, fresh for every run; the
  gateway's ``[sip] tls`` names them (docs/configuration.md) and the callers trust that CA
  alone.
- :class:`TlsSipEndpoint` is the worker's signalling over one TLS connection to the gateway's
  ``tls:`` listener (RFC 3261 §26.3.1), its certificate checked against the CA and the name
  ``localhost``; messages are framed as on TCP (RFC 3261 §18.3), with the gateway's own
  :class:`~appbridge.carriers.sip.framing.SipStreamFramer`. The gateway answers and sends its
  in-dialog requests (BYE) on that connection (docs/sip.md, "TLS and SRTP trunks").
- :func:`open_endpoint` picks the endpoint a worker's calls use; :func:`prepare`,
  :func:`gateway_fields` and :func:`ramp_fields` carry the options from bench/load.py to the
  gateway's configuration (bench/gateway_proc.py) and to the workers.

SRTP itself lives in :class:`bench.sip_caller.SipCaller` (a few lines around the gateway's own
SDES and libsrtp code), since every packet passes through it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.message import Request, Response
from bench.gateway_proc import GatewaySpec, free_loopback_port
from bench.sip_caller import SipEndpoint

__all__ = [
    "BenchPki",
    "TlsSipEndpoint",
    "gateway_fields",
    "make_pki",
    "open_endpoint",
    "prepare",
    "ramp_fields",
    "secure_line",
]

#: The name the gateway's certificate carries and the callers check (RFC 6125).
SERVER_NAME = "localhost"
_READ_BYTES = 65536


@dataclass(frozen=True)
class BenchPki:
    """The files of one run: the CA the callers trust, the gateway's certificate and key."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    except FileNotFoundError:
        raise SystemExit("bench: --sip-transport tls needs the openssl command") from None
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"bench: openssl {args[0]} failed: {exc.stderr.decode()}") from None


def make_pki(folder: Path) -> BenchPki:
    """A CA and a gateway certificate for ``localhost`` and 127.0.0.1, valid for a day."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = folder / "bench-ca.key", folder / "bench-ca.pem"
    key, csr, cert = folder / "bench-gw.key", folder / "bench-gw.csr", folder / "bench-gw.pem"
    ext = folder / "bench-gw.ext"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "1",
        "-subj", "/CN=AppBridge bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=keyCertSign,cRLSign",
    )  # fmt: skip
    _openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=bench-gw")
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName=DNS:{SERVER_NAME},IP:127.0.0.1\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "1", "-sha256", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return BenchPki(ca_cert, cert, key)


class TlsSipEndpoint(SipEndpoint):
    """The worker's SIP signalling over TLS (module doc); calls and routing as on UDP."""

    via = "SIP/2.0/TLS"
    contact_params = ";transport=tls"

    def __init__(
        self, gateway: tuple[str, int], ca_file: str, *, ticking: bool = True, srtp: bool = False
    ) -> None:
        super().__init__(gateway, ticking=ticking, srtp=srtp)
        self.ca_file = ca_file
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        context = ssl.create_default_context(cafile=self.ca_file)
        host, port = self.gateway
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, server_hostname=SERVER_NAME
        )
        self._writer = writer
        self.local_port = writer.get_extra_info("sockname")[1]
        self._reading = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        framer = SipStreamFramer()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while data := await reader.read(_READ_BYTES):
                for item in framer.feed(data):
                    if isinstance(item, bytes):
                        self.datagram_received(item, self.gateway)
                    else:
                        self.bad_messages += 1

    async def stop(self) -> None:
        await super().stop()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await self._writer.wait_closed()

    def send(self, message: Request | Response) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(message.serialize())


def open_endpoint(gateway: tuple[str, int], secure: dict[str, Any] | None) -> SipEndpoint:
    """The endpoint of a worker's SIP calls: ``secure`` is the ramp's ``sip_secure``
    (``{"srtp": bool, "tls_ca": path or None}``, from bench/load.py), None for plain UDP."""
    secure = secure or {}
    srtp = bool(secure.get("srtp"))
    ca_file = secure.get("tls_ca")
    if ca_file:
        return TlsSipEndpoint(gateway, str(ca_file), srtp=srtp)
    return SipEndpoint(gateway, srtp=srtp)


# ---------------------------------------------------------------------- bench/load.py's side
def prepare(args: argparse.Namespace) -> str | None:
    """Checks the options and, for TLS, makes the run's certificates into ``--out``: an error
    for the command line, or None. Sets ``args.sip_pki``."""
    args.sip_pki = None
    secure = args.srtp or args.sip_transport == "tls"
    if secure and (args.sip_share <= 0 or args.soak is not None):
        return "--srtp and --sip-transport tls need SIP calls (--sip-share > 0), no --soak"
    if args.sip_transport == "tls":
        args.sip_pki = make_pki(Path(args.out) / "pki")
    return None


def gateway_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~bench.gateway_proc.GatewaySpec` fields of ``--srtp`` and TLS."""
    pki: BenchPki | None = getattr(args, "sip_pki", None)
    if pki is None:
        return {"srtp": bool(getattr(args, "srtp", False))}
    files = (str(pki.cert_file), str(pki.key_file), str(pki.ca_file))
    return {"srtp": bool(args.srtp), "sip_tls_port": free_loopback_port(), "tls_files": files}


def ramp_fields(args: argparse.Namespace, spec: GatewaySpec) -> dict[str, Any]:
    """The ramp command's ``sip`` address and ``sip_secure`` (bench/worker.py) for ``spec``."""
    if spec.sip_port is None:
        return {"sip": None}
    pki: BenchPki | None = getattr(args, "sip_pki", None)
    port = spec.sip_tls_port if pki is not None else spec.sip_port
    secure = {"srtp": bool(args.srtp), "tls_ca": str(pki.ca_file) if pki is not None else None}
    return {"sip": ["127.0.0.1", port], "sip_secure": secure}


def secure_line(args: argparse.Namespace) -> str:
    """The SIP calls' media and signalling, for the lines above the table."""
    media = "SRTP (SDES, AES_CM_128_HMAC_SHA1_80)" if args.srtp else "plain RTP"
    return f"SIP calls: {media}, signalling over {args.sip_transport.upper()}"
