"""appbridge/env_knobs.py: one rule for the numeric APPBRIDGE_* tuning knobs."""

from __future__ import annotations

import logging

import pytest

from appbridge.env_knobs import positive_from_env


def test_unset_empty_positive_and_off() -> None:
    assert positive_from_env("K", 10.0, float, {}) == 10.0
    assert positive_from_env("K", 10.0, float, {"K": "  "}) == 10.0
    assert positive_from_env("K", 10.0, float, {"K": "2.5"}) == 2.5
    assert positive_from_env("K", 10.0, float, {"K": "0"}) is None
    assert positive_from_env("K", 32, int, {"K": "-1"}) is None
    assert positive_from_env("K", None, float, {}) is None


def test_a_value_that_is_no_number_keeps_the_default_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="appbridge.env_knobs"):
        assert (
            positive_from_env("APPBRIDGE_TICK_SLICE", 32, int, {"APPBRIDGE_TICK_SLICE": "1.5"})
            == 32
        )
    assert "APPBRIDGE_TICK_SLICE='1.5' is not a number; using 32" in caplog.text
