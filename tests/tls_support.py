"""Certificates for the TLS tests, made with the openssl command line.

Each test gets a private CA and leaf certificates signed by it, for the host names and
addresses it asks for, so certificate checks run against real chains (RFC 5280 path checks
and RFC 6125 name checks, done by OpenSSL through Python's ``ssl``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Leaf:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class TestCa:
    folder: Path
    cert_file: Path
    key_file: Path

    def leaf(self, name: str, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> Leaf:
        """A server/client certificate for ``dns`` names and ``ips``, signed by this CA."""
        key = self.folder / f"{name}.key"
        csr = self.folder / f"{name}.csr"
        cert = self.folder / f"{name}.crt"
        ext = self.folder / f"{name}.ext"
        alt = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        ext.write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={','.join(alt)}\n"
        )
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={(dns or ips)[0]}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert_file, "-CAkey", self.key_file,
            "-CAcreateserial", "-out", cert, "-days", "2", "-sha256", "-extfile", ext,
        )  # fmt: skip
        return Leaf(cert, key)


def make_ca(folder: Path, name: str = "ca") -> TestCa:
    """A self-signed CA valid for two days."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / f"{name}.key"
    cert = folder / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=AppBridge test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign,cRLSign",
    )  # fmt: skip
    return TestCa(folder, cert, key)


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)
