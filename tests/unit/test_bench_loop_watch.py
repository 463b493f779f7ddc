"""appbridge/net/loop_watch.py: the opt-in stall tracer and heap log the benchmark relies on."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from appbridge.net.loop_watch import (
    ENV_VAR,
    GARBAGE_ENV_VAR,
    HEAP_LOG_ENV_VAR,
    TRACEMALLOC_ENV_VAR,
    LoopStallWatch,
    MemoryDiffLog,
    c_heap,
    rss_bytes,
    steal_ms,
    threshold_from_env,
)


def test_threshold_is_off_unless_a_positive_number_of_ms() -> None:
    assert threshold_from_env({}) is None
    assert threshold_from_env({ENV_VAR: ""}) is None
    assert threshold_from_env({ENV_VAR: "0"}) is None
    assert threshold_from_env({ENV_VAR: "-5"}) is None
    assert threshold_from_env({ENV_VAR: "25"}) == pytest.approx(0.025)


def test_a_bad_threshold_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="appbridge.net.loop_watch"):
        assert threshold_from_env({ENV_VAR: "fast"}) is None
    assert "not a number" in caplog.text


def test_memory_log_modes_from_the_environment() -> None:
    assert MemoryDiffLog.from_env({}) is None
    light = MemoryDiffLog.from_env({HEAP_LOG_ENV_VAR: "10"})
    assert light is not None and not light.trace and not light.garbage
    census = MemoryDiffLog.from_env({HEAP_LOG_ENV_VAR: "10", GARBAGE_ENV_VAR: "1"})
    assert census is not None and census.garbage
    heavy = MemoryDiffLog.from_env({TRACEMALLOC_ENV_VAR: "30", HEAP_LOG_ENV_VAR: "10"})
    assert heavy is not None and heavy.trace and heavy.period_s == 30.0


def test_rss_is_read_from_proc() -> None:
    assert rss_bytes() > 1 << 20


def test_the_c_heap_sees_a_c_allocation() -> None:
    import ctypes

    before = c_heap()
    if before is None:
        pytest.skip("this C library has no mallinfo2 (glibc 2.33+ has)")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(8 << 20)  # above the mmap threshold: counted the moment it is made
    try:
        during = c_heap()
        assert during is not None
        assert during[1] - before[1] >= 8 << 20
        assert during[0] >= during[1]
    finally:
        libc.free(block)


async def test_watch_starts_and_stops_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    watch = LoopStallWatch(0.5)
    with caplog.at_level(logging.WARNING, logger="appbridge.net.loop_watch"):
        watch.start(asyncio.get_running_loop())
        assert watch._on_gc in gc.callbacks
        watch.stop()
    assert watch._on_gc not in gc.callbacks
    assert "stall tracing on" in caplog.text
    assert watch.stalls == 0


async def test_heap_log_reports_and_the_garbage_census_counts_cycles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryDiffLog(3600.0, trace=False, garbage=True)
    gc.collect()  # earlier tests' uncollected cycles would otherwise crowd the census
    with caplog.at_level(logging.WARNING, logger="appbridge.net.loop_watch"):
        log.start(asyncio.get_running_loop())
        try:

            class Node:
                pass

            for _ in range(5):
                a, b = Node(), Node()
                a.other, b.other = b, a  # type: ignore[attr-defined]
                del a, b
            gc.collect()
            log._report()
        finally:
            log.stop()
    assert gc.get_debug() == 0 and not gc.garbage
    assert "heap: rss" in caplog.text
    assert (
        "gc garbage:" in caplog.text and "census_counts_cycles.<locals>.Node', 10)" in caplog.text
    )


async def test_a_stall_is_logged_with_its_cpu_time_and_the_hypervisor_s_share(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import time

    watch = LoopStallWatch(0.04)
    with caplog.at_level(logging.WARNING, logger="appbridge.net.loop_watch"):
        watch.start(asyncio.get_running_loop())
        try:
            await asyncio.sleep(0.05)  # the watch sees the loop alive first
            time.sleep(0.15)  # noqa: ASYNC251  (the point: the loop is blocked 150 ms)
            for _ in range(50):
                await asyncio.sleep(0.01)
                if watch.stalls:
                    break
        finally:
            watch.stop()
    assert watch.stalls == 1 and watch.worst_s >= 0.1
    line = next(r.getMessage() for r in caplog.records if "loop stall of" in r.getMessage())
    assert "taken by the hypervisor (steal)" in line and " ms on CPU " in line
    assert "time.sleep" in line or "test_a_stall_is_logged" in line  # the blocked stack


def test_steal_is_read_per_cpu() -> None:
    import os

    stolen = steal_ms()
    assert len(stolen) == os.cpu_count()
    assert all(ms >= 0 for ms in stolen)
