"""``[server] tls``: ``appbridge serve`` as a real process serving HTTPS and wss itself, with
certificates from a private CA (tests/tls_support.py); docs/configuration.md, ``[server]``.

Every route keeps working over TLS: ``/healthz``, ``/v1/calls`` with a token, the Twilio voice
webhook and ``WS /twilio/stream`` over wss (on the WebSocket fast path, the default), and the
pages. A pair that cannot be served stops start-up with one line naming its key, and exit 1.
The page folder is pointed at tests/web_pages so that the test does not depend on the real pages.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.caller import twilio_carrier, twilio_stream
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio
from appbridge.testing.harness import bind_loopback
from tests import tls_support
from tests.tls_support import Leaf, make_ca

PAGES = Path(__file__).resolve().parent.parent / "web_pages"
TOKEN = "tls-api-token"
SID = "AC" + "3" * 32
# The gateway's own entry point, with the page folder pointed at the test pages first.
LAUNCH = (
    "import sys, pathlib; import appbridge.http.routes_web as w; "
    "w.WEB_DIR = pathlib.Path(sys.argv[1]); from appbridge.cli import main; "
    "sys.exit(main(sys.argv[2:]))"
)


def _config(port: int, app_url: str, cert: Path, key: Path) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = {port}
tls = {{ cert_file = "{cert}", key_file = "{key}" }}

[api]
tokens = ["{TOKEN}"]

[carriers.twilio]
account_sid = "{SID}"

[[apps]]
ref = "a"
url = "{app_url}"
signing_secret = "tls-test-secret"

[[numbers]]
number = "*"
app = "a"
"""


def _free_port() -> int:
    sock = bind_loopback()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


async def _serve(cfg: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-c", LAUNCH, str(PAGES), "serve", "--config", str(cfg)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _wait_healthy(base: str, proc: asyncio.subprocess.Process, ctx: ssl.SSLContext) -> None:
    async with httpx.AsyncClient(verify=ctx, trust_env=False) as client:
        for _ in range(400):
            if proc.returncode is not None:
                raise AssertionError(f"serve exited with {proc.returncode}")
            try:
                if (await client.get(base + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway never became healthy over https")


@asynccontextmanager
async def tls_gateway(tmp: Path) -> AsyncIterator[tuple[str, FakeApp, ssl.SSLContext]]:
    ca = make_ca(tmp / "pki")
    leaf = ca.leaf("gw", dns=("localhost",), ips=("127.0.0.1",))
    app = FakeApp(secret="tls-test-secret")
    await app.start()
    port = _free_port()
    cfg = tmp / "tls.toml"
    cfg.write_text(_config(port, app.url, leaf.cert_file, leaf.key_file))
    proc = await _serve(cfg)
    ctx = ssl.create_default_context(cafile=str(ca.cert_file))
    base = f"https://127.0.0.1:{port}"
    try:
        await _wait_healthy(base, proc, ctx)
        yield base, app, ctx
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await app.stop()


async def test_every_route_over_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with tls_gateway(tmp_path) as (base, app, ctx):
        async with httpx.AsyncClient(base_url=base, verify=ctx, trust_env=False) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            listed = await http.get("/v1/calls", headers={"Authorization": f"Bearer {TOKEN}"})
            assert listed.status_code == 200 and listed.json() == {"calls": []}
            assert (await http.get("/v1/calls")).status_code == 401
            page = await http.get("/phone")
            assert page.status_code == 200 and 'id="status"' in page.text
            assert "default-src 'self'" in page.headers["content-security-policy"]
            script = await http.get("/web/test.js")
            assert script.headers["content-type"].startswith("text/javascript")
        # The test caller trusts the private CA for the webhook and the wss stream.
        client = functools.partial(httpx.AsyncClient, verify=ctx)
        monkeypatch.setattr(twilio_carrier.httpx, "AsyncClient", client)
        monkeypatch.setattr(
            twilio_stream, "connect", functools.partial(twilio_stream.connect, ssl=ctx)
        )
        twilio = FakeTwilio(base, account_sid=SID, auth_token=None)
        try:
            call = await twilio.place_call("+15550001111", "+15550002222", continuous_media=True)
            assert call.webhook_status == 200, call.twiml
            assert call.stream_url is not None and call.stream_url.startswith("wss://")
            assert call.stream_error is None
            session = await app.next_session(timeout=10)
            start = await session.wait_for("session.start", timeout=10)
            assert start["from"] == "+15550001111"
            await session.send({"type": "speak", "id": "s1", "text": "Hello over TLS."})
            await session.wait_for("output.done", timeout=15)
            assert len(call.heard_ulaw()) > 8000
            await session.send({"type": "hangup", "id": "h1"})
            await session.wait_for("session.end", timeout=10)
            await call.wait_closed(timeout=10)
        finally:
            await twilio.aclose()


def _bad_pair(ca: tls_support.TestCa, leaf: Leaf, case: str) -> tuple[Path, Path, str]:
    if case == "missing-cert":
        return leaf.cert_file.with_name("nope.crt"), leaf.key_file, "server.tls.cert_file: "
    if case == "missing-key":
        return leaf.cert_file, leaf.key_file.with_name("nope.key"), "server.tls.key_file: "
    return leaf.cert_file, ca.key_file, "server.tls: "


@pytest.mark.parametrize("case", ["missing-cert", "missing-key", "mismatched-key"])
async def test_an_unusable_pair_is_one_line_and_exit_1(tmp_path: Path, case: str) -> None:
    ca = make_ca(tmp_path / "pki")
    leaf = ca.leaf("gw", dns=("localhost",), ips=("127.0.0.1",))
    cert, key, prefix = _bad_pair(ca, leaf, case)
    cfg = tmp_path / "bad.toml"
    cfg.write_text(_config(_free_port(), "ws://127.0.0.1:9/x", cert, key))
    proc = await _serve(cfg)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 1
    stderr = err.decode()
    assert "Traceback" not in stderr
    errors: list[Any] = [
        line.split(" ERROR ", 1)[1] for line in stderr.splitlines() if " ERROR " in line
    ]
    assert len(errors) == 1 and errors[0].startswith(f"appbridge: {prefix}"), stderr
