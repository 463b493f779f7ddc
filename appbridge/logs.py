"""The gateway's log lines: text for a terminal, or one JSON object per line for a log shipper
(docs/operations.md, "Logs"; docs/configuration.md, ``[logging]``).

A call's records carry its ``callRef`` and ``sessionRef`` without any message naming them in a
fixed way: :func:`call_context` gives each task a call spawns a context that points at the call,
and :class:`CallFilter` copies the call's references into every record logged from such a task.
The context holds the call weakly, so a task that outlives its call never keeps it alive, and the
references are read when a record is made, so a handoff's new ``sessionRef`` shows at once.

Secrets never reach a log line, at any level, from any logger (docs/operations.md, "Logs"):
libraries log too (websockets writes its request line and headers at debug level, httpx its
URLs), so :func:`redact` runs on every record as it is made, whichever logger and handler it
goes to. It removes the configured secrets themselves, the credentials of an
``Authorization`` header, a URL's userinfo and every query string.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from appbridge.weakable import Anchor, WeakTo

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CALL: contextvars.ContextVar[WeakTo[Any] | None] = contextvars.ContextVar(
    "appbridge_log_call", default=None
)


REDACTED: Final = "[redacted]"
_AUTH_RE: Final = re.compile(r"(?i)(\b(?:proxy-)?authorization\s*[:=]\s*)([A-Za-z][\w-]*\s+)?\S+")
_USERINFO_RE: Final = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
_QUERY_RE: Final = re.compile(r"(?<=[\w/.\-])\?[^\s\"'<>]+")
#: Configuration fields whose values are secrets, by the ending of their names.
_SECRET_FIELDS: Final = ("secret", "token", "tokens", "password", "api_key", "auth_token")
_MIN_SECRET_CHARS: Final = 4
_secrets: tuple[str, ...] = ()


def redact(text: str) -> str:
    """``text`` without the configured secrets, Authorization credentials, userinfo or query."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _AUTH_RE.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}", text)
    text = _USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _QUERY_RE.sub("?" + REDACTED, text)


def config_secrets(config: object) -> set[str]:
    """Every secret value in a configuration: the fields named like ``secret``, ``token``,
    ``password`` or ``api_key``, at any depth (a new section's secrets are found too)."""
    found: set[str] = set()
    _collect(config, found, secret=False, seen=set())
    return {value for value in found if len(value) >= _MIN_SECRET_CHARS}


def _collect(value: object, found: set[str], *, secret: bool, seen: set[int]) -> None:
    if isinstance(value, str):
        if secret:
            found.add(value)
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            named = f.name.lower().endswith(_SECRET_FIELDS)
            _collect(getattr(value, f.name), found, secret=secret or named, seen=seen)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            named = isinstance(key, str) and key.lower().endswith(_SECRET_FIELDS)
            _collect(item, found, secret=secret or named, seen=seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _collect(item, found, secret=secret, seen=seen)


def add_secrets(secrets: Iterable[str]) -> None:
    """More secrets for :func:`redact` to remove: the configuration's at start-up, a reloaded
    one's on SIGHUP (the old ones stay: a live call may still use them). Longest first, so a
    secret containing another is removed whole."""
    global _secrets
    _secrets = tuple(sorted({*_secrets, *secrets}, key=len, reverse=True))


def _redacting_factory(base: Any) -> Any:
    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it formats
            return record
        record.msg, record.args = redact(message), None
        return record

    make.appbridge_redacts = True  # type: ignore[attr-defined]
    return make


def install_redaction() -> None:
    """Redact every record as it is made (module doc); once per process."""
    base = logging.getLogRecordFactory()
    if not getattr(base, "appbridge_redacts", False):
        logging.setLogRecordFactory(_redacting_factory(base))


def call_context(anchor: Anchor[Any]) -> contextvars.Context:
    """A copy of the current context in which log records belong to the call of ``anchor`` (an
    object with ``call_ref`` and ``session_ref``, held weakly through its anchor: see
    appbridge/weakable.py); the call's tasks are created in it (calls/call.py)."""
    context = contextvars.copy_context()
    context.run(_CALL.set, WeakTo(anchor))
    return context


class CallFilter(logging.Filter):
    """Adds ``callRef`` and ``sessionRef`` to a record logged from one of a call's tasks; lets
    every record through. A record that already has them (``extra=``) keeps its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = _CALL.get()
        call = ref() if ref is not None else None
        if call is not None:
            if not hasattr(record, "callRef"):
                record.callRef = call.call_ref
            session_ref = getattr(call, "session_ref", None)
            if session_ref is not None and not hasattr(record, "sessionRef"):
                record.sessionRef = session_ref
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``,
    ``msg``, then ``exc`` when the record carries an exception, ``callRef`` / ``sessionRef`` when
    it belongs to a call, and ``node`` when the configuration names the node."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exc"] = redact(record.exc_text)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        for key in ("callRef", "sessionRef"):
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if self.node is not None:
            line["node"] = self.node
        return json.dumps(line, ensure_ascii=False, default=str)


class _RedactingFormatter(logging.Formatter):
    """The text format, with tracebacks redacted like messages (module doc)."""

    def formatException(self, ei: Any) -> str:
        return redact(super().formatException(ei))


def _iso_utc(created: float) -> str:
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def configure(
    log_format: str, level: str, *, node: str | None = None, stream: TextIO | None = None
) -> None:
    """Install the root handler once (``logging.basicConfig`` leaves one already there alone).

    In ``json`` form uvicorn's own loggers, which it configures with handlers of its own when a
    server is created, are given the same formatter, and ``warnings`` go through logging, so
    every line on stderr is one JSON object.
    """
    install_redaction()
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(CallFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
        _uvicorn_as_json(node)
        logging.captureWarnings(True)
    else:
        handler.setFormatter(_RedactingFormatter(TEXT_FORMAT))
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=TEXT_FORMAT,
        handlers=[handler],
    )


def _uvicorn_as_json(node: str | None) -> None:
    """uvicorn applies ``uvicorn.config.LOGGING_CONFIG`` when a server's config is made; its
    formatters are swapped for :class:`JsonFormatter` so its warnings are JSON lines too."""
    try:
        from uvicorn.config import LOGGING_CONFIG
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        return
    formatters = LOGGING_CONFIG.setdefault("formatters", {})
    for name in ("default", "access"):
        formatters[name] = {"()": JsonFormatter, "node": node}
