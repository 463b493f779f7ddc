"""The reader of ``[logging]``: the log format (``text`` or ``json``) and the level.

Kept in its own module so the section's rules sit in one place (docs/configuration.md,
``[logging]``); appbridge/logs.py applies them when ``appbridge serve`` starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appbridge.config.model import LOG_LEVELS, LoggingConfig
from appbridge.config.schema import Reader, describe

LOG_FORMATS = ("text", "json")


def parse_logging(reader: Reader, data: Mapping[str, Any]) -> LoggingConfig:
    table = reader.table(data, "logging", "logging")
    if table is None:
        return LoggingConfig()
    reader.check_keys("logging", table, ("format", "level"))
    defaults = LoggingConfig()
    log_format = reader.choice(table, "format", "logging.format", LOG_FORMATS, defaults.format)
    return LoggingConfig(
        format="json" if log_format == "json" else "text",
        level=_level(reader, table, defaults.level),
    )


def _level(reader: Reader, table: Mapping[str, Any], default: str) -> str:
    """A level name in any case (``"INFO"`` and ``"info"`` alike, as APPBRIDGE_LOG_LEVEL takes)."""
    value = reader.string(table, "level", "logging.level")
    if value is None:
        return default
    if value.lower() not in LOG_LEVELS:
        listed = ", ".join(f'"{level}"' for level in LOG_LEVELS)
        reader.problem("logging.level", f"expected one of {listed}, got {describe(value)}")
        return default
    return value.lower()
