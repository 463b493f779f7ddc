"""Readers of the gateway's own sections: ``[server]``, ``[http]``, ``[api]`` and ``[media]``.

Each returns its part of the model (:mod:`appbridge.config.model`), or ``None`` for a section
left out, and records every problem on the :class:`Reader` with its key path; the keys are
described in docs/configuration.md under the section's heading.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appbridge.config.model import ApiConfig, HttpConfig, MediaConfig, ServerConfig, TlsFiles
from appbridge.config.schema import (
    Reader,
    check_ca_bundle,
    check_http_base_url,
    describe,
    is_host,
    read_account_sid,
)


def parse_media(reader: Reader, data: Mapping[str, Any]) -> MediaConfig:
    table = reader.table(data, "media", "media")
    if table is None:
        return MediaConfig()
    reader.check_keys("media", table, ("allow_private", "max_bytes", "timeout_s", "max_redirects"))
    d = MediaConfig()
    return MediaConfig(
        allow_private=reader.boolean(
            table, "allow_private", "media.allow_private", default=d.allow_private
        ),
        max_bytes=reader.integer(
            table, "max_bytes", "media.max_bytes", default=d.max_bytes, low=1024, high=1 << 30
        ),
        timeout_s=reader.number(
            table, "timeout_s", "media.timeout_s", default=d.timeout_s, low=0.0, high=300.0
        ),
        max_redirects=reader.integer(
            table, "max_redirects", "media.max_redirects", default=d.max_redirects, low=0, high=10
        ),
    )


def parse_server(reader: Reader, data: Mapping[str, Any], base_dir: Path) -> ServerConfig:
    table = reader.table(data, "server", "server")
    if table is None:
        return ServerConfig()
    reader.check_keys(
        "server",
        table,
        (
            "host",
            "port",
            "public_url",
            "ca_bundle",
            "drain_timeout_s",
            "max_calls",
            "max_cpu_percent",
            "max_stt_lag_s",
            "tls",
        ),
    )
    defaults = ServerConfig()
    host = reader.string(table, "host", "server.host") or defaults.host
    if not is_host(host):
        reader.problem("server.host", f"expected an IP address or host name, got {describe(host)}")
    port = reader.integer(table, "port", "server.port", default=defaults.port, low=1, high=65535)
    public_url = reader.string(table, "public_url", "server.public_url")
    if public_url is not None:
        message = check_http_base_url(public_url)
        if message is not None:
            reader.problem("server.public_url", message)
    ca_bundle = reader.string(table, "ca_bundle", "server.ca_bundle")
    if ca_bundle is not None:
        bundle_path = Path(ca_bundle).expanduser()
        if not bundle_path.is_absolute():
            bundle_path = base_dir / bundle_path
        message = check_ca_bundle(bundle_path)
        if message is not None:
            reader.problem("server.ca_bundle", message)
        ca_bundle = str(bundle_path.resolve())
    drain_timeout_s = reader.number(
        table,
        "drain_timeout_s",
        "server.drain_timeout_s",
        default=defaults.drain_timeout_s,
        low=0.0,
        high=3600.0,
    )
    max_calls = reader.integer(
        table, "max_calls", "server.max_calls", default=defaults.max_calls, low=1, high=1_000_000
    )
    max_cpu_percent = (
        reader.number(
            table, "max_cpu_percent", "server.max_cpu_percent", default=100.0, low=0.0, high=100.0
        )
        if "max_cpu_percent" in table
        else None
    )
    max_stt_lag_s = (
        reader.number(
            table, "max_stt_lag_s", "server.max_stt_lag_s", default=2.0, low=0.1, high=60.0
        )
        if "max_stt_lag_s" in table
        else None
    )
    tls = _server_tls(reader, table, base_dir)
    return ServerConfig(
        host,
        port,
        public_url,
        ca_bundle,
        drain_timeout_s,
        max_calls,
        max_cpu_percent,
        tls,
        max_stt_lag_s=max_stt_lag_s,
    )


def _server_tls(reader: Reader, table: Mapping[str, Any], base_dir: Path) -> TlsFiles | None:
    """``tls = { cert_file, key_file }``, relative paths read from the config's folder. The files
    themselves are checked when the listener opens (a problem there is exit 1, like a port in
    use; docs/operations.md), not here."""
    tls = reader.table(table, "tls", "server.tls")
    if tls is None:
        return None
    reader.check_keys("server.tls", tls, ("cert_file", "key_file"))
    paths: list[str] = []
    for key in ("cert_file", "key_file"):
        raw = reader.string(tls, key, f"server.tls.{key}", required=True)
        if raw is not None:
            file_path = Path(raw).expanduser()
            paths.append(str(file_path if file_path.is_absolute() else base_dir / file_path))
    return TlsFiles(paths[0], paths[1]) if len(paths) == 2 else None


def parse_http(reader: Reader, data: Mapping[str, Any]) -> HttpConfig | None:
    table = reader.table(data, "http", "http")
    if table is None:
        return None
    reader.check_keys("http", table, ("account_sid", "auth_token"))
    account_sid = read_account_sid(reader, table, "http.account_sid")
    token = reader.string(table, "auth_token", "http.auth_token", required=True, secret=True)
    return HttpConfig(account_sid, token or "")


def parse_api(reader: Reader, data: Mapping[str, Any]) -> ApiConfig | None:
    table = reader.table(data, "api", "api")
    if table is None:
        return None
    reader.check_keys("api", table, ("tokens",))
    if "tokens" not in table:
        reader.problem("api.tokens", "missing (required)")
        return ApiConfig(())
    tokens = reader.strings(table, "tokens", "api.tokens", secret=True)
    if tokens is not None and not tokens and not table["tokens"]:
        reader.problem("api.tokens", "must hold at least one token")
    return ApiConfig(tuple(tokens or ()))
