"""Pure helpers of the benchmark: statistics, /proc and /metrics readers, the printed table.

Nothing here does I/O or reads a clock, so each piece is unit-tested on fixed text and numbers
(tests/unit/test_bench.py). The load generator (:mod:`bench.load`) feeds it what it
sampled: the text of ``/proc/<pid>/stat`` and ``/proc/<pid>/status`` (proc(5)), the Prometheus
exposition of ``GET /metrics`` (text format 0.0.4) and the timelines recorded by the fake peers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CpuTimes",
    "Histogram",
    "Summary",
    "format_table",
    "histogram_delta",
    "number_cell",
    "paced_collections",
    "paced_collections_line",
    "parse_cpu_times",
    "parse_histogram",
    "parse_metric",
    "parse_proc_stat_ticks",
    "parse_vmrss_bytes",
    "percentile",
    "receive_stamps_line",
    "step_detail_lines",
    "summarize",
    "summary_cell",
]


# ---------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest-rank method: a value that was observed.

    Nearest rank keeps the tail honest on small samples (p99 of 50 values is the maximum),
    where interpolation would invent a figure between two observations.
    """
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0-100, got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    """p50/p99/max of a sample, in the sample's unit; ``count`` 0 means no sample at all."""

    count: int
    p50: float | None
    p99: float | None
    max: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"count": self.count, "p50": self.p50, "p99": self.p99, "max": self.max}

    def cell(self, digits: int = 1) -> str:
        """``p50/p99/max`` for the table, or ``-`` when nothing was measured."""
        if self.count == 0 or self.p50 is None or self.p99 is None or self.max is None:
            return "-"
        return f"{self.p50:.{digits}f}/{self.p99:.{digits}f}/{self.max:.{digits}f}"


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(0, None, None, None)
    return Summary(len(values), percentile(values, 50), percentile(values, 99), max(values))


# ---------------------------------------------------------------------- /proc (proc(5))
def parse_proc_stat_ticks(stat_text: str) -> int:
    """utime + stime of ``/proc/<pid>/stat``, in clock ticks (``SC_CLK_TCK``), all threads."""
    user, system = parse_proc_stat_split(stat_text)
    return user + system


def parse_proc_stat_split(stat_text: str) -> tuple[int, int]:
    """(utime, stime) of ``/proc/<pid>/stat``, in clock ticks, all threads.

    Fields 14 and 15 of proc(5). The command name (field 2) is in parentheses and may itself hold
    spaces or parentheses, so fields are counted from the *last* ``)``: field 3 is the first
    after it, which puts utime and stime at offsets 11 and 12.
    """
    close = stat_text.rfind(")")
    if close < 0:
        raise ValueError("not a /proc/<pid>/stat line: no ')' after the command name")
    fields = stat_text[close + 1 :].split()
    if len(fields) < 13:
        raise ValueError(f"/proc/<pid>/stat has {len(fields) + 2} fields, expected at least 15")
    return int(fields[11]), int(fields[12])


def parse_vmrss_bytes(status_text: str) -> int:
    """``VmRSS`` of ``/proc/<pid>/status`` in bytes (the file states it in kB, i.e. KiB)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) < 2 or (len(parts) > 2 and parts[2] != "kB"):
                raise ValueError(f"unexpected VmRSS line: {line!r}")
            return int(parts[1]) * 1024
    raise ValueError("no VmRSS line (a zombie or kernel thread has none)")


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's counters from the system-wide ``/proc/stat``, in clock ticks."""

    busy: int  # user + nice + system + irq + softirq
    idle: int  # idle + iowait
    steal: int  # time the hypervisor ran something else while this vCPU wanted to run

    def minus(self, earlier: CpuTimes) -> CpuTimes:
        return CpuTimes(
            self.busy - earlier.busy, self.idle - earlier.idle, self.steal - earlier.steal
        )


def parse_cpu_times(stat_text: str) -> dict[int, CpuTimes]:
    """Per-CPU times from ``/proc/stat`` (proc(5): ``cpuN user nice system idle iowait irq
    softirq steal ...``). The aggregate ``cpu`` line is skipped. Guest time is already counted
    in user, so it is not added again."""
    out: dict[int, CpuTimes] = {}
    for line in stat_text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if not name[3:].isdigit() or len(fields) < 8:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        out[int(name[3:])] = CpuTimes(user + nice + system + irq + softirq, idle + iowait, steal)
    return out


# ---------------------------------------------------------------------- /metrics
@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound (``le``), ``+Inf`` last."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum: float
    count: int

    def quantile_bound(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q``-quantile (0-1), or None when empty.

        A histogram only knows buckets, so this is "at most X": the true value lies in
        (previous bound, X]. ``math.inf`` means beyond the last finite bound.
        """
        if self.count <= 0:
            return None
        target = q * self.count
        for bound, cumulative in zip(self.bounds, self.cumulative, strict=True):
            if cumulative >= target and cumulative > 0:
                return bound
        return self.bounds[-1]

    def max_bound(self) -> float | None:
        """The upper bound of the highest non-empty bucket (the maximum is at most this)."""
        previous = 0
        highest: float | None = None
        for bound, cumulative in zip(self.bounds, self.cumulative, strict=True):
            if cumulative > previous:
                highest = bound
            previous = cumulative
        return highest

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in text.split(","):
        if "=" in part:
            key, _, value = part.partition("=")
            labels[key.strip()] = value.strip().strip('"')
    return labels


def _samples(exposition: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line; comments and blank lines skipped."""
    samples = []
    for raw in exposition.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        labels: dict[str, str] = {}
        if "{" in head:
            name, _, rest = head.partition("{")
            labels = _labels(rest.rstrip("}"))
        else:
            name = head
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            continue
    return samples


def parse_metric(exposition: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0.0 when absent)."""
    want = dict(labels or {})
    total = 0.0
    for sample_name, sample_labels, value in _samples(exposition):
        if sample_name == name and all(sample_labels.get(k) == v for k, v in want.items()):
            total += value
    return total


def paced_collections(before: str, after: str) -> dict[str, float]:
    """The gateway's paced full collections (appbridge/media/gc_pacer.py) between two /metrics
    expositions: passes, those brought forward by the objects made (``early``), deep ones, the
    seconds they took, and the longest pass since the gateway started."""

    def counter(name: str) -> float:
        return parse_metric(after, name) - parse_metric(before, name)

    return {
        "passes": counter("appbridge_gc_full_passes_total"),
        "early_passes": counter("appbridge_gc_early_passes_total"),
        "deep_passes": counter("appbridge_gc_deep_passes_total"),
        "seconds": round(counter("appbridge_gc_full_pass_seconds_total"), 4),
        "max_seconds": parse_metric(after, "appbridge_gc_full_pass_max_seconds"),
    }


def paced_collections_line(gc_figures: dict[str, float]) -> str:
    """:func:`paced_collections` in words, for the lines under a table."""
    return (
        f"paced collections: {gc_figures['passes']:g} passes ({gc_figures['early_passes']:g} "
        f"early, {gc_figures['deep_passes']:g} deep), {gc_figures['seconds'] * 1e3:.1f} ms in "
        f"all; the longest since the gateway started {gc_figures['max_seconds'] * 1e3:.1f} ms"
    )


def parse_histogram(exposition: str, name: str) -> Histogram:
    """Read histogram ``name`` (its ``_bucket``, ``_sum`` and ``_count`` samples)."""
    buckets: list[tuple[float, int]] = []
    total_sum = 0.0
    count = 0
    for sample_name, labels, value in _samples(exposition):
        if sample_name == f"{name}_bucket" and "le" in labels:
            le = labels["le"]
            bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
            buckets.append((bound, int(value)))
        elif sample_name == f"{name}_sum":
            total_sum = value
        elif sample_name == f"{name}_count":
            count = int(value)
    if not buckets:
        raise ValueError(f"histogram {name} not found in the exposition")
    buckets.sort()
    return Histogram(tuple(b for b, _ in buckets), tuple(c for _, c in buckets), total_sum, count)


def histogram_delta(before: Histogram, after: Histogram) -> Histogram:
    """What was observed between two scrapes of one histogram (same buckets, counters only grow)."""
    if before.bounds != after.bounds:
        raise ValueError("the two histograms have different buckets")
    cumulative = tuple(a - b for a, b in zip(after.cumulative, before.cumulative, strict=True))
    if any(c < 0 for c in cumulative):
        raise ValueError("a bucket went down between scrapes: the process restarted?")
    return Histogram(after.bounds, cumulative, after.sum - before.sum, after.count - before.count)


def bound_cell(value: float | None) -> str:
    """A histogram bound for the table: ``≤3`` style; ``>max`` for the +Inf bucket."""
    if value is None:
        return "-"
    if math.isinf(value):
        return ">max"
    return f"≤{value:g}"


# ---------------------------------------------------------------------- the table
def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: columns right-aligned to their widest cell, a rule under the header."""
    widths = [len(h) for h in headers]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, the header {len(headers)}")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.rjust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


# ---------------------------------------------------------------------- the lines under a row
def number_cell(value: float | None, digits: int = 1) -> str:
    """A table cell of one number, or ``-``."""
    return "-" if value is None else f"{value:.{digits}f}"


def summary_cell(summary: dict[str, Any]) -> str:
    """``p50/p99/max`` of a :meth:`Summary.as_dict`, or ``-``."""
    if not summary.get("count"):
        return "-"
    return "/".join(f"{summary[k]:.1f}" for k in ("p50", "p99", "max"))


def receive_stamps_line(step: dict[str, Any]) -> str:
    """The step's detail line on receive stamps: the table's figures use the kernel's arrival
    stamps (bench/stamped.py); the same figures from the generator loop's read instants show
    how much of the old figure was the generator's own lag (bench/README.md)."""
    return (
        "receive stamps: kernel (table) vs generator loop, p50/p99/max ms: inbound "
        f"{summary_cell(step['inbound_latency_ms'])} vs "
        f"{summary_cell(step['inbound_latency_loop_ms'])}; "
        f"caller jitter {summary_cell(step['caller_jitter_ms'])} vs "
        f"{summary_cell(step['caller_jitter_loop_ms'])}"
    )


def step_detail_lines(data: dict[str, Any]) -> list[str]:
    """The lines under a step's row, from its JSON: what the table's cells summarise."""
    lines = [
        f"  clears passed on to the caller {data['clears_at_caller']}/{data['clears_sent']}; "
        f"bursts with no audio at all {data['bursts_silent']} (in "
        f"{data['calls_with_silent_bursts']} calls); frames lost by kind "
        f"{data['lost_by_kind']} of {data['expected_by_kind']}; marks echoed "
        f"{data['marks_echoed']}/{data['marks_sent']} (repeated {data['marks_duplicated']}); "
        f"app errors {data['gateway_errors'] or 'none'}; core use {data['cores']}"
    ]
    dropped = data.get("gateway_dropped_frames") or {}
    if any(dropped.values()):
        lines.append(
            f"  frames the gateway dropped because a peer read too slowly: to apps "
            f"{dropped.get('app', 0):.0f}, to carriers {dropped.get('carrier', 0):.0f}"
        )
    if "gc" in data:
        lines.append(f"  {paced_collections_line(data['gc'])}")
    for lost in data.get("lost_bursts", [])[:5]:
        lines.append(f"  lost frames in: {json.dumps(lost, separators=(',', ':'))}")
    lines.append(
        "  gateway CPU user/system: "
        + "/".join(number_cell(v, 1) for v in data["gateway_user_sys_pct"])
        + " %; core speed probe before/after the step (bench/speed.py; lower is faster): "
        + "/".join(number_cell(v, 1) for v in data["core_probe_ms"])
        + " ms"
    )
    lines.append(
        "  by carrier (p50/p99/max ms): "
        + "; ".join(
            f"{carrier}: clear→silence {summary_cell(part['clear_to_silence_ms'])}, inbound "
            f"{summary_cell(part['inbound_latency_ms'])}, "
            f"jitter {summary_cell(part['caller_jitter_ms'])}, "
            f"frames lost {part['frames_lost']}/{part['frames_expected']}"
            for carrier, part in data["by_carrier"].items()
        )
    )
    lines.append(f"  {receive_stamps_line(data)}")
    return lines
