"""The gateway's log lines: text for a terminal, or one JSON object per line for a log shipper
(docs/operations.md, "Logs"; docs/configuration.md, ``[logging]``).

A call's records carry its ``callRef`` and ``sessionRef`` without any message naming them in a
fixed way: :func:`call_context` gives each task a call spawns a context that points at the call,
and :class:`CallFilter` copies the call's references into every record logged from such a task.
The context holds the call weakly, so a task that outlives its call never keeps it alive, and the
references are read when a record is made, so a handoff's new ``sessionRef`` shows at once.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import weakref
from datetime import UTC, datetime
from typing import Any, Final, TextIO

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CALL: contextvars.ContextVar[weakref.ref[Any] | None] = contextvars.ContextVar(
    "appbridge_log_call", default=None
)


def call_context(call: object) -> contextvars.Context:
    """A copy of the current context in which log records belong to ``call`` (an object with
    ``call_ref`` and ``session_ref``); the call's tasks are created in it (calls/call.py)."""
    context = contextvars.copy_context()
    context.run(_CALL.set, weakref.ref(call))
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
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        for key in ("callRef", "sessionRef"):
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if self.node is not None:
            line["node"] = self.node
        return json.dumps(line, ensure_ascii=False, default=str)


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
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(CallFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
        _uvicorn_as_json(node)
        logging.captureWarnings(True)
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
