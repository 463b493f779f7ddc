"""bench/speed.py: the core speed probe each benchmark step reports."""

from __future__ import annotations

import os

from bench.speed import probe_core


def test_the_probe_times_the_reference_work_on_the_given_core() -> None:
    core = min(os.sched_getaffinity(0))
    ms = probe_core(core, repeats=2)
    assert ms is not None and 0.0 < ms < 10_000.0


def test_a_probe_that_cannot_run_says_so_instead_of_failing_the_benchmark() -> None:
    assert probe_core(10_000, repeats=1) is None  # no such core: the child fails
