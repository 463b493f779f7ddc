"""JSON log lines and the call they belong to (appbridge/logs.py), and ``[logging]``
(appbridge/config/logging.py; docs/configuration.md, ``[logging]``; docs/operations.md, "Logs")."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import sys
from typing import Any

import pytest

from appbridge import logs, server
from appbridge.config import ConfigError, default_config, parse_config
from appbridge.logs import CallFilter, JsonFormatter, call_context
from appbridge.weakable import Anchor


class FakeCall:
    def __init__(self, call_ref: str, session_ref: str | None = None) -> None:
        self.call_ref = call_ref
        self.session_ref = session_ref
        self.anchor = Anchor(self)


def record(msg: str = "hello %s", *args: object, **kw: Any) -> logging.LogRecord:
    args = args or ("you",)
    rec = logging.LogRecord("appbridge.x", logging.WARNING, __file__, 1, msg, args, None)
    rec.created = 1796592784.25
    for key, value in kw.items():
        setattr(rec, key, value)
    return rec


def test_a_record_is_one_json_object_on_one_line() -> None:
    line = JsonFormatter().format(record("two\nlines %s"))
    assert "\n" not in line
    assert json.loads(line) == {
        "ts": "2026-12-06T21:33:04.250Z",
        "level": "WARNING",
        "logger": "appbridge.x",
        "msg": "two\nlines you",
    }


def test_exception_call_refs_and_node_are_added_when_they_exist() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    rec = record(callRef="CA1", sessionRef="s-1")
    rec.exc_info = exc_info
    out = json.loads(JsonFormatter(node="gw-a").format(rec))
    assert out["callRef"] == "CA1" and out["sessionRef"] == "s-1" and out["node"] == "gw-a"
    assert out["exc"].startswith("Traceback") and "ValueError: boom" in out["exc"]
    assert "exc" not in json.loads(JsonFormatter().format(record()))


def test_the_filter_tags_records_made_in_a_call_context() -> None:
    call = FakeCall("CA7")
    rec = record()
    call_context(call.anchor).run(CallFilter().filter, rec)
    assert rec.callRef == "CA7" and not hasattr(rec, "sessionRef")
    call.session_ref = "s-2"  # read when the record is made: a handoff's new session shows
    rec = record()
    call_context(call.anchor).run(CallFilter().filter, rec)
    assert (rec.callRef, rec.sessionRef) == ("CA7", "s-2")
    outside = record()
    assert CallFilter().filter(outside) and not hasattr(outside, "callRef")
    own = record(callRef="CA-own")
    call_context(call.anchor).run(CallFilter().filter, own)
    assert own.callRef == "CA-own"


def test_the_context_holds_the_call_weakly() -> None:
    call = FakeCall("CA8")
    context = call_context(call.anchor)
    del call
    gc.collect()
    rec = record()
    context.run(CallFilter().filter, rec)
    assert not hasattr(rec, "callRef")


async def test_tasks_created_in_the_context_log_with_the_call_ref() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(CallFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("appbridge.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    call = FakeCall("CA9", "s-9")

    async def work() -> None:
        logger.info("in the call")
        await asyncio.sleep(0)
        await asyncio.create_task(asyncio.sleep(0))  # a task it starts inherits the context
        logger.info("still in the call")

    try:
        await asyncio.get_running_loop().create_task(work(), context=call_context(call.anchor))
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["msg"], x.get("callRef"), x.get("sessionRef")) for x in lines] == [
        ("in the call", "CA9", "s-9"),
        ("still in the call", "CA9", "s-9"),
        ("outside", None, None),
    ]


# ---------------------------------------------------------------------- [logging]
APPS = [{"ref": "a", "url": "wss://app.example.com/s"}]


def with_logging(table: dict[str, Any]) -> dict[str, Any]:
    return {"apps": APPS, "logging": table}


def test_logging_section_defaults_to_text_at_info() -> None:
    config = default_config()
    assert (config.logging.format, config.logging.level) == ("text", "info")
    parsed = parse_config(with_logging({"format": "json", "level": "WARNING"}))
    assert (parsed.logging.format, parsed.logging.level) == ("json", "warning")


def test_logging_section_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(with_logging({"format": "xml", "level": "loud", "colour": True}))
    problems = caught.value.problems
    assert any(p.startswith("logging.format: expected one of") for p in problems)
    assert any(p.startswith("logging.level: expected one of") for p in problems)
    assert "logging.colour: unknown key" in problems


def test_logging_values_may_come_from_the_environment() -> None:
    parsed = parse_config(with_logging({"format": "${LOG_FORMAT}"}), {"LOG_FORMAT": "json"})
    assert parsed.logging.format == "json"


def test_serve_applies_the_section_and_the_env_level_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake_configure(fmt: str, level: str, *, node: str | None, stream: Any) -> None:
        calls.append((fmt, level, node, stream))

    monkeypatch.setattr(logs, "configure", fake_configure)
    config = parse_config(with_logging({"format": "json", "level": "debug"}))
    monkeypatch.delenv("APPBRIDGE_LOG_LEVEL", raising=False)
    server._setup_logging(config)
    monkeypatch.setenv("APPBRIDGE_LOG_LEVEL", "ERROR")
    server._setup_logging(config)
    assert calls == [("json", "debug", None, sys.stderr), ("json", "ERROR", None, sys.stderr)]


def test_the_node_id_of_a_cluster_section_goes_on_the_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes: list[str | None] = []
    monkeypatch.setattr(logs, "configure", lambda *a, node, stream: nodes.append(node))

    class WithCluster:
        logging = default_config().logging
        cluster = type("Cluster", (), {"node_id": "gw-b"})()

    server._setup_logging(WithCluster())  # type: ignore[arg-type]
    assert nodes == ["gw-b"]


# -- secrets never logged (appbridge/logs.py, redact) -----------------------------------------
def test_redact_removes_credentials_userinfo_queries_and_known_secrets() -> None:
    logs.add_secrets(["hunter2-secret"])
    cases = {
        "> Authorization: Basic YWxpY2U6cHc=": "> Authorization: Basic [redacted]",
        "authorization=Bearer abc.def": "authorization=Bearer [redacted]",
        "Proxy-Authorization: Digest username=x": "Proxy-Authorization: Digest [redacted]",
        "> GET /session?token=abc&x=1 HTTP/1.1": "> GET /session?[redacted] HTTP/1.1",
        "dial wss://bob:pw@app.example/s?k=v": "dial wss://[redacted]@app.example/s?[redacted]",
        "the secret is hunter2-secret.": "the secret is [redacted].",
        "did it work? yes": "did it work? yes",
    }
    for text, want in cases.items():
        assert logs.redact(text) == want, text


def test_config_secrets_finds_every_secret_field_at_any_depth() -> None:
    config = parse_config(
        {
            "http": {"account_sid": "AC" + "0" * 32, "auth_token": "tok-http-1"},
            "api": {"tokens": ["tok-api-1", "tok-api-2"]},
            "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x", "signing_secret": "sig-app-1"}],
            "numbers": [{"number": "*", "app": "a"}],
        },
        {},
    )
    found = logs.config_secrets(config)
    assert {"tok-http-1", "tok-api-1", "tok-api-2", "sig-app-1"} <= found
    assert "AC00000000000000000000000000000000" not in found and "a" not in found


def test_every_record_is_redacted_as_it_is_made() -> None:
    base = logging.getLogRecordFactory()
    logs.install_redaction()
    try:
        _check_a_library_record()
    finally:
        logging.setLogRecordFactory(base)


def _check_a_library_record() -> None:
    record = logging.getLogger("websockets.client").makeRecord(
        "websockets.client",
        logging.DEBUG,
        __file__,
        1,
        "> %s: %s",
        ("Authorization", "Basic xyz"),
        None,
    )
    assert record.getMessage() == "> Authorization: Basic [redacted]"


def test_only_the_json_form_touches_uvicorns_formatters(monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    from uvicorn.config import LOGGING_CONFIG

    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)  # leave pytest's handlers
    base = logging.getLogRecordFactory()
    saved = copy.deepcopy(LOGGING_CONFIG["formatters"])
    try:
        logs.configure("text", "info", stream=io.StringIO())
        assert LOGGING_CONFIG["formatters"] == saved
        logs.configure("json", "info", stream=io.StringIO())
        assert LOGGING_CONFIG["formatters"]["default"]["()"] is JsonFormatter
    finally:
        LOGGING_CONFIG["formatters"] = saved
        logging.setLogRecordFactory(base)
        logging.captureWarnings(False)
