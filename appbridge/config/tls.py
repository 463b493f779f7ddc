"""Reader of a TLS certificate pair: ``[sip] tls`` and ``[server] tls``.

A listener that serves TLS needs a certificate chain and its private key; a wrong path must stop
the gateway at start-up with the key's name, not at the first handshake (docs/configuration.md,
``[sip]``; docs/sip.md, "TLS and SRTP"). The pair is loaded into an OpenSSL context once here, so
a key that does not match its certificate is found at start-up too.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appbridge.config.model import TlsFiles
from appbridge.config.schema import Reader, check_ca_bundle, key_path


def parse_tls_files(
    reader: Reader, table: Mapping[str, Any], path: str, base_dir: Path, *, with_ca: bool
) -> TlsFiles | None:
    """``{cert_file, key_file[, ca_file]}``; relative paths are read from the config's folder."""
    tls = reader.table(table, "tls", path)
    if tls is None:
        return None
    keys = ("cert_file", "key_file", "ca_file") if with_ca else ("cert_file", "key_file")
    reader.check_keys(path, tls, keys)
    cert = _file(reader, tls, "cert_file", path, base_dir, required=True)
    key = _file(reader, tls, "key_file", path, base_dir, required=True)
    ca = _file(reader, tls, "ca_file", path, base_dir, required=False) if with_ca else None
    if ca is not None:
        message = check_ca_bundle(Path(ca))
        if message is not None:
            reader.problem(key_path(path, "ca_file"), message)
    if cert is None or key is None:
        return None
    message = check_key_pair(cert, key)
    if message is not None:
        reader.problem(path, message)
        return None
    return TlsFiles(cert, key, ca)


def check_key_pair(cert_file: str, key_file: str) -> str | None:
    """Load the pair as a server would; a problem message or ``None``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        return f"{cert_file} and {key_file} are not a usable certificate and key ({exc.reason})"
    except OSError as exc:
        return f"cannot read {cert_file} or {key_file}: {exc.strerror or exc}"
    return None


def _file(
    reader: Reader,
    table: Mapping[str, Any],
    key: str,
    path: str,
    base_dir: Path,
    *,
    required: bool,
) -> str | None:
    raw = reader.string(table, key, key_path(path, key), required=required)
    if raw is None:
        return None
    file_path = Path(raw).expanduser()
    if not file_path.is_absolute():
        file_path = base_dir / file_path
    try:
        with file_path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        reader.problem(key_path(path, key), f"cannot read {file_path}: {exc.strerror or exc}")
        return None
    return str(file_path.resolve())
