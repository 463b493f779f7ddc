"""bench/bars.py: the quality bars on a step's figures, and the table's final line."""

from __future__ import annotations

import math
from typing import Any

from bench.bars import bar_failures, cost_failures, final_line, largest_passing


def step(offered: int, **over: Any) -> dict[str, Any]:
    """A step dictionary as bench.load writes it, meeting every bar unless overridden."""
    base: dict[str, Any] = {
        "offered": offered,
        "held": offered,
        "refused": 0,
        "valid": True,
        "tick_lateness_ms": {"p99_le": 3.0, "max_le": 15.0},
        "clear_to_silence_ms": {"count": 10, "p50": 1.0, "p99": 9.0, "max": 17.0},
        "inbound_latency_ms": {"count": 10, "p50": 0.5, "p99": 4.0, "max": 9.0},
        "frames_lost": 0,
        "tick_resyncs": 0,
        "gateway_cpu_pct_per_call": 0.2,
        "gateway_rss_per_call_kb": 90.0,
    }
    base.update(over)
    return base


def test_a_step_within_every_bar_has_no_failure() -> None:
    assert bar_failures(step(100)) == []


def test_each_bar_is_checked_against_its_limit() -> None:
    cases = {
        "tick_lateness_p99_ms": {"tick_lateness_ms": {"p99_le": 7.5, "max_le": 15.0}},
        "tick_lateness_max_ms": {"tick_lateness_ms": {"p99_le": 3.0, "max_le": math.inf}},
        "clear_to_silence_p99_ms": {"clear_to_silence_ms": {"p99": 21.0, "max": 30.0}},
        "clear_to_silence_max_ms": {"clear_to_silence_ms": {"p99": 9.0, "max": 41.0}},
        "inbound_latency_p99_ms": {"inbound_latency_ms": {"p99": 5.1, "max": 9.0}},
        "frames_lost": {"frames_lost": 1},
        "tick_resyncs": {"tick_resyncs": 2},
    }
    for name, override in cases.items():
        failures = bar_failures(step(50, **override))
        assert len(failures) == 1 and failures[0].startswith(name), (name, failures)


def test_limits_themselves_pass() -> None:
    at_limit = step(
        50,
        tick_lateness_ms={"p99_le": 5.0, "max_le": 20.0},
        clear_to_silence_ms={"p99": 20.0, "max": 40.0},
        inbound_latency_ms={"p99": 5.0, "max": 50.0},
    )
    assert bar_failures(at_limit) == []


def test_nothing_measured_is_not_a_failure() -> None:
    empty = step(10, clear_to_silence_ms={"count": 0, "p50": None, "p99": None, "max": None})
    assert bar_failures(empty) == []


def test_invalid_steps_and_dropped_calls_fail() -> None:
    assert any("INVALID" in f for f in bar_failures(step(200, valid=False)))
    assert bar_failures(step(200, held=199)) == ["held 199 of 200 admitted"]
    # Refused calls are admission control doing its job, not dropped calls.
    assert bar_failures(step(150, held=100, refused=50)) == []
    assert bar_failures(step(10, error="boom")) == ["step failed: boom"]


def test_cost_goals_are_reported_apart() -> None:
    costly = step(50, gateway_cpu_pct_per_call=0.5, gateway_rss_per_call_kb=250.0)
    assert bar_failures(costly) == []
    assert [f.split()[0] for f in cost_failures(costly)] == ["cpu_pct_per_call", "rss_kb_per_call"]


def test_largest_passing_takes_the_most_calls_held_that_met_every_bar() -> None:
    steps = [step(50), step(100), step(200, frames_lost=3), step(150)]
    best = largest_passing(steps)
    assert best is not None and best["offered"] == 150
    assert largest_passing([step(50, valid=False)]) is None


def test_final_line_names_the_count_and_what_broke_above_it() -> None:
    line = final_line([step(50), step(100, inbound_latency_ms={"p99": 7.4, "max": 20.0})])
    assert line.startswith("largest call count that met every bar: 50 (cost goals met)")
    assert "100: inbound_latency_p99_ms 7.4 > 5" in line
    none = final_line([step(50, valid=False)])
    assert none.startswith("largest call count that met every bar: none")
    assert final_line([]) == "largest call count that met every bar: none (no step ran)"


# -- the ramp (bench/load.py): bounded, and it stops at the first broken bar


def _ramp(monkeypatch: Any, tmp_path: Any, argv: list[str], broken_from: int) -> list[int]:
    """Runs ``bench.load.main(argv)`` with every step faked: steps of ``broken_from`` calls or
    more miss the inbound bar. Returns the call counts the ramp ran."""
    import bench.load as load

    ran: list[int] = []

    async def fake_step(calls: int, args: Any, out_dir: Any) -> tuple[dict[str, Any], list[str]]:
        ran.append(calls)
        inbound = {"count": 10, "p50": 1.0, "p99": 9.0 if calls >= broken_from else 2.0}
        data = step(calls, inbound_latency_ms=inbound, held_sip=calls // 2, refused_sip=0)
        return data, [str(calls)] + ["-"] * (len(load.HEADERS) - 1)

    monkeypatch.setattr(load, "run_step", fake_step)
    monkeypatch.setattr(load, "print_step_details", lambda *a: None)
    assert load.main([*argv, "--out", str(tmp_path)]) == 0
    return ran


def test_the_default_ramp_climbs_until_a_bar_breaks(monkeypatch: Any, tmp_path: Any) -> None:
    from bench.bars import DEFAULT_RAMP

    assert DEFAULT_RAMP[:5] == (50, 100, 200, 300, 400) and DEFAULT_RAMP[-1] == 1000
    assert _ramp(monkeypatch, tmp_path, [], broken_from=300) == [50, 100, 200, 300]
    assert _ramp(monkeypatch, tmp_path, [], broken_from=5000) == list(DEFAULT_RAMP)  # bounded


def test_explicit_steps_all_run_unless_until_break(monkeypatch: Any, tmp_path: Any) -> None:
    steps = ["--calls", "100,200,300"]
    assert _ramp(monkeypatch, tmp_path, steps, broken_from=200) == [100, 200, 300]
    until = [*steps, "--until-break"]
    assert _ramp(monkeypatch, tmp_path, until, broken_from=200) == [100, 200]
