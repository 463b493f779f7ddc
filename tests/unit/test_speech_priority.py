"""Speech worker threads yield the core to the event loop (appbridge/speech/priority.py)."""

from __future__ import annotations

import os
import threading

import pytest

from appbridge.speech.priority import WORKER_NICE_INCREMENT, lower_current_thread_priority
from appbridge.speech.providers.local import LocalTtsProvider


def _nice_of(native_id: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, native_id)


def _run_in_thread(fn: object) -> tuple[object, int]:
    """Run ``fn`` in a new thread; (its result, that thread's nice value afterwards)."""
    out: dict[str, object] = {}

    def body() -> None:
        out["result"] = fn()  # type: ignore[operator]
        out["nice"] = _nice_of(threading.get_native_id())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["result"], int(out["nice"])  # type: ignore[call-overload]


def test_the_calling_thread_alone_is_lowered() -> None:
    before = _nice_of(threading.get_native_id())
    took, nice = _run_in_thread(lower_current_thread_priority)
    assert took is True
    assert nice == min(19, before + WORKER_NICE_INCREMENT)
    assert _nice_of(threading.get_native_id()) == before  # the loop's thread keeps its own


def test_a_non_positive_increment_changes_nothing() -> None:
    before = _nice_of(threading.get_native_id())
    took, nice = _run_in_thread(lambda: lower_current_thread_priority(0))
    assert took is False
    assert nice == before


def test_the_value_is_capped_at_the_lowest_priority() -> None:
    took, nice = _run_in_thread(lambda: lower_current_thread_priority(100))
    assert took is True
    assert nice == 19


@pytest.mark.asyncio
async def test_the_espeak_worker_runs_below_the_loop() -> None:
    provider = LocalTtsProvider()
    voice = next(v for v in provider.voices() if v.id == "local/en-US")
    chunks = [c async for c in provider.synthesize("One moment please.", voice, "en-US")]
    assert chunks and any(c.pcm16 for c in chunks)
    workers = [t for t in threading.enumerate() if t.name.startswith("appbridge-espeak")]
    assert workers, "the synthesis ran on no named worker thread"
    loop_nice = _nice_of(threading.get_native_id())
    for worker in workers:
        assert worker.native_id is not None
        assert _nice_of(worker.native_id) == min(19, loop_nice + WORKER_NICE_INCREMENT)
