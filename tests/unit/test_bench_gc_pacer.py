"""appbridge/media/gc_pacer.py: full collections in small batches off the media clock."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from appbridge.clock import VirtualClock
from appbridge.media.gc_pacer import (
    DEEP_GROWTH,
    DEFAULT_PERIOD_S,
    ENV_VAR,
    FULL_PASS_OFF,
    GROWTH_PASSES,
    IDLE_SLACK,
    MIN_GAP_S,
    GcPacer,
    GcPacerShell,
    period_from_env,
)


def test_period_from_the_environment() -> None:
    assert period_from_env({}) == DEFAULT_PERIOD_S
    assert period_from_env({ENV_VAR: "0.5"}) == 0.5
    assert period_from_env({ENV_VAR: "0"}) is None  # CPython's own schedule
    assert period_from_env({ENV_VAR: "soon"}) == DEFAULT_PERIOD_S


def test_passes_are_due_a_period_apart_and_never_bunch_up() -> None:
    pacer = GcPacer(period_s=2.0)
    assert not pacer.due(100.0)  # starts the schedule
    assert not pacer.due(101.99)
    assert pacer.due(102.0)
    pacer.ran(105.0, 0.004, 12)  # a late pass: the next one is a period after it
    assert not pacer.due(106.9)
    assert pacer.due(107.0)
    pacer.ran(107.0, 0.002, 3)
    assert (pacer.passes, pacer.collected) == (2, 15)
    assert pacer.total_s == pytest.approx(0.006) and pacer.max_s == pytest.approx(0.004)


def test_enough_new_objects_bring_a_pass_forward_but_never_closer_than_the_gap() -> None:
    pacer = GcPacer(period_s=10.0)
    assert (pacer.growth_passes, pacer.min_gap_s) == (GROWTH_PASSES, MIN_GAP_S) == (2, 1.0)
    assert not pacer.due(100.0, grown=5)  # starts the schedule, whatever has grown
    assert not pacer.due(100.5, grown=5)  # within the gap after the schedule's start
    assert not pacer.due(103.0, grown=1)  # under the budget: the period rules
    assert pacer.due(103.0, grown=2)
    pacer.ran(103.0, 0.005, 0)
    assert (pacer.passes, pacer.early_passes, pacer.next_due_s) == (1, 1, 113.0)
    assert not pacer.due(103.9, grown=9)  # the gap after the last pass
    assert pacer.due(104.0, grown=9)
    pacer.ran(104.0, 0.004, 0)
    assert not pacer.due(113.9, grown=0)
    assert pacer.due(114.0, grown=0)  # the period, with nothing grown
    pacer.ran(114.0, 0.001, 0)
    assert (pacer.passes, pacer.early_passes) == (3, 2)


def test_a_deep_pass_when_idle_and_grown_or_when_the_heap_has_doubled() -> None:
    pacer = GcPacer(period_s=10.0)
    assert not pacer.deep_due(1000, idle=False)  # the first pass sets the reference size
    assert pacer.heap_after_deep == 1000
    assert not pacer.deep_due(1999, idle=False)  # under load: rare, only a doubling
    assert pacer.deep_due(int(1000 * DEEP_GROWTH), idle=False)
    assert not pacer.deep_due(int(1000 * (1 + IDLE_SLACK)), idle=True)  # idle, barely grown
    assert pacer.deep_due(int(1000 * (1 + IDLE_SLACK)) + 1, idle=True)
    pacer.ran(50.0, 0.06, 7, deep=True, heap=1500)
    assert (pacer.deep_passes, pacer.heap_after_deep) == (1, 1500)
    assert not pacer.deep_due(2999, idle=False)  # measured from the last deep pass
    pacer.ran(60.0, 0.001, 0)
    assert (pacer.passes, pacer.deep_passes, pacer.heap_after_deep) == (2, 1, 1500)


async def test_each_pass_freezes_its_survivors_and_a_deep_pass_frees_frozen_cycles() -> None:
    class Node:
        other: object = None

    clock = VirtualClock()
    idle = [False]
    heap = [1000]
    shell = GcPacerShell(
        GcPacer(period_s=1.0), clock=clock.now, idle=lambda: idle[0], heap=lambda: heap[0]
    )
    shell.start(asyncio.get_running_loop())
    gc.collect()
    frozen_before = gc.get_freeze_count()
    try:
        shell.on_tick(0, clock.now())  # the schedule starts
        a, b = Node(), Node()
        a.other, b.other = b, a
        clock.advance(1.0)
        shell.on_tick(1, clock.now())
        await asyncio.sleep(0)  # a plain pass: the live pair survives it and is frozen
        assert shell.pacer.passes == 1 and shell.pacer.deep_passes == 0
        assert gc.get_freeze_count() >= frozen_before + 2
        alive = weakref.ref(a)
        del a, b  # a cycle dies frozen: a plain pass does not see it
        clock.advance(1.0)
        shell.on_tick(2, clock.now())
        await asyncio.sleep(0)
        assert shell.pacer.passes == 2 and alive() is not None
        idle[0], heap[0] = True, 2000  # no call live, and the heap has grown: deep
        clock.advance(1.0)
        shell.on_tick(3, clock.now())
        await asyncio.sleep(0)
        assert shell.pacer.deep_passes == 1 and alive() is None
        assert shell.pacer.heap_after_deep == 2000
    finally:
        shell.stop()
    assert gc.get_freeze_count() == 0  # stop gives everything back to the collector


async def test_shell_collects_after_a_due_tick_and_restores_the_thresholds() -> None:
    before = gc.get_threshold()
    clock = VirtualClock()
    shell = GcPacerShell(GcPacer(period_s=2.0), clock=clock.now)
    shell.start(asyncio.get_running_loop())
    try:
        assert gc.get_threshold() == (before[0], before[1], FULL_PASS_OFF)
        shell.on_tick(1, clock.now())  # schedule starts
        await asyncio.sleep(0)
        assert shell.pacer.passes == 0

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        del a, b
        clock.advance(2.0)
        shell.on_tick(2, clock.now())
        shell.on_tick(3, clock.now())  # already pending: one pass only
        await asyncio.sleep(0)
        assert shell.pacer.passes == 1
        assert shell.pacer.collected >= 2
        shell.on_tick(4, clock.now())
        await asyncio.sleep(0)
        assert shell.pacer.passes == 1  # not due again before the period
    finally:
        shell.stop()
    assert gc.get_threshold() == before


async def test_shell_runs_an_early_pass_when_young_collections_pile_up() -> None:
    clock = VirtualClock()
    grown = [0]
    shell = GcPacerShell(GcPacer(period_s=10.0), clock=clock.now, grown=lambda: grown[0])
    shell.start(asyncio.get_running_loop())
    try:
        shell.on_tick(1, clock.now())  # schedule starts
        clock.advance(2.0)
        grown[0] = GROWTH_PASSES - 1
        shell.on_tick(2, clock.now())
        await asyncio.sleep(0)
        assert shell.pacer.passes == 0
        grown[0] = GROWTH_PASSES
        shell.on_tick(3, clock.now())
        await asyncio.sleep(0)
        assert (shell.pacer.passes, shell.pacer.early_passes) == (1, 1)
        assert gc.get_count()[2] == 0  # the pass itself started the count again
    finally:
        shell.stop()


async def test_with_the_media_clock_the_pass_waits_for_the_ticks_last_slice() -> None:
    from appbridge.media.media_clock import MediaClock

    clock = VirtualClock()
    media = MediaClock(slice_size=1, clock=clock)
    media._loop = asyncio.get_running_loop()  # what MediaClock.start() sets
    shell = GcPacerShell(GcPacer(period_s=2.0), clock=clock.now)
    shell.start(asyncio.get_running_loop(), media.call_after_tick)
    seen: list[str] = []
    try:
        media.subscribe(shell.on_tick)
        media.subscribe(lambda tick, now: seen.append(f"call@{tick}:passes={shell.pacer.passes}"))
        media.run_tick()  # starts the schedule
        clock.advance(2.0)
        media.begin_tick()
        media._run_slice(1)  # the pacer's slice: the pass is due, but calls still wait
        assert shell.pacer.passes == 0
        await asyncio.sleep(0)  # the call's slice, then the pass
        assert seen == ["call@1:passes=0", "call@2:passes=0"]
        assert shell.pacer.passes == 1
    finally:
        shell.stop()
