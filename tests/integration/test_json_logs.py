"""``[logging] format = "json"`` on a real ``appbridge serve`` process (docs/operations.md, "Logs";
docs/configuration.md, ``[logging]``): every stderr line is one JSON object, and the lines of a
call carry its ``callRef``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio import FakeTwilio
from appbridge.testing.harness import bind_loopback
from tests.integration.test_serve import wait_healthy

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
drain_timeout_s = 5

[logging]
format = "json"
level = "debug"

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


async def send_garbage(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"NOT HTTP\x00\x01\r\n\r\n")
    await writer.drain()
    await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()


async def test_serve_writes_one_json_object_per_line_with_the_call_ref(tmp_path: Path) -> None:
    app = FakeApp(secret="s3cret")
    await app.start()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    sock.close()
    cfg = tmp_path / "appbridge.toml"
    cfg.write_text(CONFIG.format(port=port, sid="2" * 32, url=app.url))
    env = {k: v for k, v in os.environ.items() if k != "APPBRIDGE_LOG_LEVEL"}
    env["APP_SECRET"] = "s3cret"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "appbridge",
        "serve",
        "--config",
        str(cfg),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    twilio = FakeTwilio(base, account_sid="AC" + "2" * 32, auth_token=None)
    try:
        await wait_healthy(base, proc)
        await send_garbage(port)  # uvicorn logs a warning of its own: a JSON line too
        call = await twilio.place_call("+15550000001", "+15550000002")
        assert call.has_stream
        session = await app.next_session(timeout=5)
        start = await session.wait_for("session.start", timeout=5)
        await session.send({"type": "speak", "id": "s1", "text": "hello"})
        await session.wait_for("output.started", timeout=10)
        await call.hangup()
        await session.wait_for("session.end", timeout=5)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
        stderr = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await twilio.aclose()
        await app.stop()

    lines = stderr.splitlines()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line parses
    assert records, "no log lines"
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= record.keys(), record
        assert record["ts"].endswith("Z") and "T" in record["ts"]
    call_ref = start["callRef"]
    session_ref = start["sessionRef"]
    tagged = [r for r in records if r.get("callRef") == call_ref]
    assert tagged, f"no line carries callRef {call_ref}: {stderr}"
    assert any(r.get("sessionRef") == session_ref for r in tagged)
    assert any(r["msg"] == f"call {call_ref} ended: caller_hangup" for r in tagged), stderr
    assert not any("callRef" in r for r in records if "listening on" in r["msg"])
    assert any(r["logger"].startswith("uvicorn") for r in records), stderr
    assert "s3cret" not in stderr
