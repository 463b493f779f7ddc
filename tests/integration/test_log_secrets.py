"""No secret reaches a log line, at any level, from any logger (docs/operations.md, "Logs"): a
real ``appbridge serve`` at debug level dials an app whose URL carries userinfo and a token
query (websockets logs the request line and its headers at debug level)."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from pathlib import Path

from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio
from appbridge.testing.harness import bind_loopback
from tests.integration.test_serve import wait_healthy

SIGNING = "sign-7f3a9c"
TOKEN = "qtok-51d2e8"
PASSWORD = "pw-b64e19"
API_TOKEN = "api-0c77d1"
HTTP_TOKEN = "http-9d41aa"

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
drain_timeout_s = 5

[http]
account_sid = "AC{sid}"
auth_token = "{http_token}"

[api]
tokens = ["{api_token}"]

[carriers.twilio]
account_sid = "AC{sid}"

[[apps]]
ref = "a"
url = "{url}"
signing_secret = "${{APP_SECRET}}"

[[numbers]]
number = "+15550000002"
app = "a"
"""


async def test_debug_logs_carry_no_secret(tmp_path: Path) -> None:
    app = FakeApp(secret=SIGNING)
    await app.start()
    host_port = app.url.split("://", 1)[1].split("/", 1)[0]
    url = f"ws://alice:{PASSWORD}@{host_port}/?token={TOKEN}"
    sock = bind_loopback()
    port = sock.getsockname()[1]
    sock.close()
    cfg = tmp_path / "appbridge.toml"
    cfg.write_text(
        CONFIG.format(port=port, sid="3" * 32, url=url, http_token=HTTP_TOKEN, api_token=API_TOKEN)
    )
    env = {**os.environ, "APPBRIDGE_LOG_LEVEL": "DEBUG", "APP_SECRET": SIGNING}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "appbridge", "serve", "--config", str(cfg)),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    twilio = FakeTwilio(base, account_sid="AC" + "3" * 32, auth_token=None)
    try:
        await wait_healthy(base, proc)
        call = await twilio.place_call("+15550000001", "+15550000002")
        await call.hangup()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
        stderr = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await twilio.aclose()
        await app.stop()

    assert "> GET /" in stderr, "websockets logged no request line: the test saw nothing"
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for secret in (SIGNING, TOKEN, PASSWORD, API_TOKEN, HTTP_TOKEN, basic):
        assert secret not in stderr, f"{secret!r} was logged"
    assert "[redacted]" in stderr
