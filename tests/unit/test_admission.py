"""Admission control (docs/configuration.md): the CPU meter in virtual time, and the refusal
rules."""

from __future__ import annotations

import pytest

from appbridge.admission import CpuLoad, refusal
from appbridge.config import ConfigError, parse_config


def test_cpu_load_over_a_sliding_window() -> None:
    load = CpuLoad(window_s=5.0)
    assert load.percent() is None
    load.sample(0.0, 10.0)
    assert load.percent() is None
    for second in range(1, 11):  # half a core busy for 10 s
        load.sample(float(second), 10.0 + 0.5 * second)
    assert load.percent() == pytest.approx(50.0)
    for second in range(11, 17):  # then fully busy: the window forgets the quiet past
        load.sample(float(second), 15.0 + 1.0 * (second - 10))
    assert load.percent() == pytest.approx(100.0)


def test_refusal_reasons_in_order() -> None:
    base = dict(live_calls=1, max_calls=10, cpu_percent=50.0, max_cpu_percent=80.0)
    assert refusal(draining=False, **base) is None  # type: ignore[arg-type]
    assert refusal(draining=True, **base) == "draining"  # type: ignore[arg-type]
    assert "cap of 10" in str(refusal(draining=False, **{**base, "live_calls": 10}))  # type: ignore[arg-type]
    assert "CPU at 90" in str(refusal(draining=False, **{**base, "cpu_percent": 90.0}))  # type: ignore[arg-type]
    no_limit = {**base, "cpu_percent": 99.0, "max_cpu_percent": None}
    assert refusal(draining=False, **no_limit) is None  # type: ignore[arg-type]


def test_max_cpu_percent_config() -> None:
    base = {
        "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x"}],
        "numbers": [{"number": "*", "app": "a"}],
    }
    assert parse_config(base, {}).server.max_cpu_percent is None
    cfg = parse_config({**base, "server": {"max_cpu_percent": 85}}, {})
    assert cfg.server.max_cpu_percent == 85.0
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "server": {"max_cpu_percent": 150}}, {})
    assert any(p.startswith("server.max_cpu_percent:") for p in err.value.problems)


def test_a_recogniser_too_far_behind_refuses_new_calls() -> None:
    base = dict(live_calls=1, max_calls=10, cpu_percent=None, max_cpu_percent=None)
    lagging = {**base, "stt_lag_s": 2.5, "max_stt_lag_s": 2.0}
    assert refusal(draining=False, **lagging) == (  # type: ignore[arg-type]
        "speech recognition 2.5 s behind (limit 2 s)"
    )
    assert refusal(draining=False, **{**lagging, "stt_lag_s": 1.9}) is None  # type: ignore[arg-type]
    assert refusal(draining=False, **{**lagging, "max_stt_lag_s": None}) is None  # type: ignore[arg-type]


def test_max_stt_lag_s_config() -> None:
    base = {
        "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x"}],
        "numbers": [{"number": "*", "app": "a"}],
    }
    assert parse_config(base, {}).server.max_stt_lag_s is None
    assert parse_config({**base, "server": {"max_stt_lag_s": 1.5}}, {}).server.max_stt_lag_s == 1.5
    for bad in (0, 61, "soon"):
        with pytest.raises(ConfigError) as err:
            parse_config({**base, "server": {"max_stt_lag_s": bad}}, {})
        assert any(p.startswith("server.max_stt_lag_s:") for p in err.value.problems)
