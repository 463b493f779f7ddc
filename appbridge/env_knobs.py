"""Numeric tuning knobs read from the environment (``APPBRIDGE_*``), one rule for all of them.

Unset or empty: the knob's default. Zero or negative: None, the knob's "off". Anything that is
not a number: the default, and a warning that names the variable, so a typo never goes
unnoticed and never stops the gateway.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["positive_from_env"]

log = logging.getLogger(__name__)

N = TypeVar("N", int, float)


def positive_from_env(
    name: str,
    default: N | None,
    parse: Callable[[str], N],
    environ: Mapping[str, str] | None = None,
) -> N | None:
    """The positive number in ``name`` (module doc for the other cases)."""
    text = (environ if environ is not None else os.environ).get(name, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, text, default)
        return default
    return value if value > 0 else None
