"""``[server] tls`` as read from the file, and the start-up check of its pair
(docs/configuration.md, ``[server]``; http/uvicorn_server.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from appbridge.config.model import ServerConfig, TlsFiles
from appbridge.http.uvicorn_server import server_ssl_context, tls_problem
from tests.tls_support import make_ca
from tests.unit.test_config import APP, ROUTE, parse, problems


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("server-tls")
    ca = make_ca(folder)
    leaf = ca.leaf("gw", dns=("localhost",), ips=("127.0.0.1",))
    return {"cert": leaf.cert_file, "key": leaf.key_file, "ca_key": ca.key_file, "dir": folder}


def test_the_pair_is_read_and_relative_paths_are_the_config_folders(
    pair: dict[str, Path],
) -> None:
    text = '[server]\ntls = { cert_file = "gw.crt", key_file = "gw.key" }\n' + APP + ROUTE
    config = parse(text, base_dir=pair["dir"])
    assert config.server.tls == TlsFiles(str(pair["cert"]), str(pair["key"]))
    assert config.server.base_url() == "https://127.0.0.1:8080"
    assert parse(APP + ROUTE).server.tls is None


def test_keys_of_the_tls_table() -> None:
    found = problems('[server]\ntls = { cert_file = "a.crt", ca_file = "x" }\n' + APP + ROUTE)
    assert any(p.startswith("server.tls") and "ca_file" in p for p in found)
    assert any(p.startswith("server.tls.key_file:") for p in found)
    assert problems('[server]\ntls = "yes"\n' + APP + ROUTE)[0].startswith("server.tls:")


def test_base_url_is_https_with_tls() -> None:
    tls = TlsFiles("c", "k")
    assert ServerConfig(host="0.0.0.0", port=443, tls=tls).base_url() == "https://127.0.0.1:443"
    assert ServerConfig(host="::1", port=8443, tls=tls).base_url() == "https://[::1]:8443"
    with_public = ServerConfig(public_url="https://voice.example.com", tls=tls)
    assert with_public.base_url() == "https://voice.example.com"


def test_the_start_up_check_names_the_key(pair: dict[str, Path]) -> None:
    cert, key = str(pair["cert"]), str(pair["key"])
    assert tls_problem(TlsFiles(cert, key)) is None
    missing = tls_problem(TlsFiles(cert + ".nope", key))
    assert missing is not None and missing.startswith("server.tls.cert_file: cannot read ")
    missing = tls_problem(TlsFiles(cert, key + ".nope"))
    assert missing is not None and missing.startswith("server.tls.key_file: cannot read ")
    mismatch = tls_problem(TlsFiles(cert, str(pair["ca_key"])))
    assert mismatch is not None and mismatch.startswith("server.tls: ")
    assert "not a usable certificate and key" in mismatch


def test_the_context_speaks_tls_1_2_at_least(pair: dict[str, Path]) -> None:
    context = server_ssl_context(TlsFiles(str(pair["cert"]), str(pair["key"])))
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
