"""``wss://`` app links verify against system roots plus the operator's private CA bundle
(docs/configuration.md, ``ca_bundle``), with a CA and a server certificate made by openssl here."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from tests.integration.conftest import gateway_env


def make_pki(tmp: Path) -> tuple[Path, Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test CA")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=Test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=keyCertSign",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
    )
    (tmp / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "srv.pem",
        "-extfile",
        "ext.cnf",
    )
    return tmp / "ca.pem", tmp / "srv.pem", tmp / "srv.key"


async def test_wss_app_behind_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    starts: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            if isinstance(frame, str):
                msg = json.loads(frame)
                if msg.get("type") == "session.start":
                    await starts.put(msg)

    async with serve(handler, "127.0.0.1", 0, ssl=server_ctx) as server:
        port = server.sockets[0].getsockname()[1]
        url = f"wss://localhost:{port}/s"

        def apps(_: Any) -> list[dict[str, Any]]:
            return [{"ref": "tls", "url": url}]

        # Trusted through the bundle: the call reaches the app.
        async with gateway_env(apps, server_extra={"ca_bundle": str(ca)}) as env:
            call = await env.twilio.place_call("+15550001111", "+15550002222")
            assert call.has_stream
            start = await asyncio.wait_for(starts.get(), 10)
            assert start["appRef"] == "tls"
        # Without the bundle the certificate is not trusted: the dial fails (no fallback).
        async with gateway_env(apps) as env:
            call = await env.twilio.place_call("+15550001111", "+15550002222")
            assert "Hangup" in call.twiml_verbs and not call.has_stream
