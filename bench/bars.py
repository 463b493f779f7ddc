"""The benchmark's quality bars, checked on one step's figures; the table's final line.

Pure (no I/O, no clock): :func:`bar_failures` reads the step dictionary that
:func:`bench.load.run_step` writes to the JSON, and says which bars it missed;
:func:`largest_passing` and :func:`final_line` give the line under the table, "the largest call
count that met every bar" (bench/README.md, "The bars and the final line").

The bars (docs/PERFORMANCE.md, "Against the goals"), per step:

* output pacing lateness p99 ≤ 5 ms and max ≤ 20 ms: the gateway's tick-lateness histogram,
  which is bucketed, so a bucket *bound* must be within the bar (a step whose p99 falls in
  the "≤ 7.5" bucket fails a 5 ms bar even if the true value was 5.1 ms: the bar is kept);
* clear-to-silence p99 ≤ 20 ms and max ≤ 40 ms, at the callers;
* inbound added latency p99 ≤ 5 ms, at the apps;
* no lost frames (``frames_lost`` 0), and no media-clock resync;
* every call that was let in held to the end of the window (offered minus the calls refused
  by admission control, which the overload mode counts instead);
* and the step is *valid*: a generator over 70 % of its core measures itself.

Cost per call (CPU ≤ 0.25 % of a core, memory ≤ 200 KB) is a goal (docs/PERFORMANCE.md), not a
quality bar: the final line reports it beside the count, and :func:`cost_failures` checks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BARS",
    "COST_BARS",
    "bar_failures",
    "cost_failures",
    "final_line",
    "largest_passing",
]

#: name -> limit; the names say what is compared (ms, except ``frames_lost`` and ``resyncs``).
BARS: dict[str, float] = {
    "tick_lateness_p99_ms": 5.0,
    "tick_lateness_max_ms": 20.0,
    "clear_to_silence_p99_ms": 20.0,
    "clear_to_silence_max_ms": 40.0,
    "inbound_latency_p99_ms": 5.0,
    "frames_lost": 0.0,
    "tick_resyncs": 0.0,
}
COST_BARS: dict[str, float] = {"cpu_pct_per_call": 0.25, "rss_kb_per_call": 200.0}


def _get(step: Mapping[str, Any], *path: str) -> Any:
    value: Any = step
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _over(value: Any, limit: float) -> bool:
    """A missing figure (nothing measured) passes; ``inf`` (the +Inf bucket) fails."""
    return isinstance(value, int | float) and float(value) > limit


#: ``make bench`` with no ``--calls`` (a bounded ramp: 50, 100, 200, 300, 400, ... until a bar
#: breaks): these steps in order, stopping after the first that misses a bar.
DEFAULT_RAMP: tuple[int, ...] = (50, 100, *range(200, 1001, 100))


def bar_failures(step: Mapping[str, Any]) -> list[str]:
    """Which bars ``step`` missed, as short texts (empty: it met every bar)."""
    if "error" in step:
        return [f"step failed: {step['error']}"]
    failures: list[str] = []
    measured = {
        "tick_lateness_p99_ms": _get(step, "tick_lateness_ms", "p99_le"),
        "tick_lateness_max_ms": _get(step, "tick_lateness_ms", "max_le"),
        "clear_to_silence_p99_ms": _get(step, "clear_to_silence_ms", "p99"),
        "clear_to_silence_max_ms": _get(step, "clear_to_silence_ms", "max"),
        "inbound_latency_p99_ms": _get(step, "inbound_latency_ms", "p99"),
        "frames_lost": step.get("frames_lost"),
        "tick_resyncs": step.get("tick_resyncs"),
    }
    for name, limit in BARS.items():
        value = measured[name]
        if _over(value, limit):
            failures.append(f"{name} {value:g} > {limit:g}")
    admitted = int(step.get("offered", 0)) - int(step.get("refused", 0))
    held = int(step.get("held", 0))
    if held < admitted:
        failures.append(f"held {held} of {admitted} admitted")
    if not step.get("valid", False):
        failures.append("INVALID (generator over 70 % of its core)")
    return failures


def cost_failures(step: Mapping[str, Any]) -> list[str]:
    """Which cost-per-call goals ``step`` missed."""
    out: list[str] = []
    for name, key in (
        ("cpu_pct_per_call", "gateway_cpu_pct_per_call"),
        ("rss_kb_per_call", "gateway_rss_per_call_kb"),
    ):
        value = step.get(key)
        if _over(value, COST_BARS[name]):
            out.append(f"{name} {value:g} > {COST_BARS[name]:g}")
    return out


def largest_passing(steps: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The step with the most calls held among those that met every bar, or None."""
    passing = [s for s in steps if not bar_failures(s)]
    if not passing:
        return None
    return max(passing, key=lambda s: (int(s.get("held", 0)), int(s.get("offered", 0))))


def final_line(steps: Sequence[Mapping[str, Any]]) -> str:
    """The line under the table: the largest call count that met every bar."""
    best = largest_passing(steps)
    if best is None:
        reasons = "; ".join(f"{s.get('offered', '?')}: {', '.join(bar_failures(s))}" for s in steps)
        return f"largest call count that met every bar: none ({reasons or 'no step ran'})"
    held = int(best.get("held", 0))
    costs = cost_failures(best)
    cost_text = "cost goals met" if not costs else "cost goals missed: " + ", ".join(costs)
    failed_above = [
        f"{s.get('offered', '?')}: {', '.join(bar_failures(s))}"
        for s in steps
        if int(s.get("offered", 0)) > int(best.get("offered", 0)) and bar_failures(s)
    ]
    tail = f"; above it {'; '.join(failed_above)}" if failed_above else ""
    return f"largest call count that met every bar: {held} ({cost_text}){tail}"
