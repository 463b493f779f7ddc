"""Speech worker pools (appbridge/speech/workers.py): the lowered priority, and an exit that does
not wait on speech work of ended calls (appbridge/server.py, ``exit_now_if_speech_runs``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from appbridge.speech.workers import SpeechWorkers

REPO = Path(__file__).resolve().parents[2]


def _blocking(pool: SpeechWorkers) -> threading.Event:
    """Starts an item that runs until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        release.wait(10)

    pool.submit(work)
    assert started.wait(5)
    return release


def test_finish_cancels_what_waits_and_reports_what_runs() -> None:
    pool = SpeechWorkers(1, "test-speech")
    release = _blocking(pool)
    queued = pool.submit(lambda: 42)
    assert pool.unfinished == 2
    assert pool.finish(time.monotonic()) is False  # the first one is still running
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 1)  # no more work once finishing
    release.set()
    assert pool.finish(time.monotonic() + 5) is True
    assert pool.unfinished == 0


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no per-thread priority here")
def test_workers_run_below_the_callers_priority() -> None:
    pool = SpeechWorkers(1, "test-speech")
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    theirs = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert theirs.result(5) > mine or mine == 19
    pool.finish(time.monotonic() + 5)


def _run(script: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, timeout=60, capture_output=True, check=False
    )
    assert not done.stderr or b"Traceback" not in done.stderr, done.stderr.decode()
    return done.returncode


def test_the_exit_does_not_join_a_running_speech_worker() -> None:
    """Without the early exit, the interpreter would join the worker: 600 s here. Every pool
    of the process counts (a subprocess: it shuts down every pool, the shared recogniser's too)."""
    code = _run(
        "import threading, time\n"
        "from appbridge.speech.workers import SpeechWorkers\n"
        "from appbridge.server import exit_now_if_speech_runs\n"
        "idle, busy = SpeechWorkers(1, 'test-idle'), SpeechWorkers(1, 'test-busy')\n"
        "started = threading.Event()\n"
        "busy.submit(lambda: (started.set(), time.sleep(600)))\n"
        "busy.submit(time.sleep, 600)  # queued: cancelled\n"
        "started.wait(5)\n"
        "exit_now_if_speech_runs(0)\n"
        "raise SystemExit(5)  # not reached: the process ends in exit_now_if_speech_runs\n"
    )
    assert code == 0  # and within the subprocess timeout


def test_the_exit_code_is_kept_when_no_worker_runs() -> None:
    code = _run(
        "from appbridge.speech.workers import SpeechWorkers\n"
        "from appbridge.server import exit_now_if_speech_runs\n"
        "pool = SpeechWorkers(1, 'test-speech')\n"
        "pool.submit(lambda: None).result(5)\n"
        "raise SystemExit(exit_now_if_speech_runs(3))\n"
    )
    assert code == 3
