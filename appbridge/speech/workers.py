"""Speech worker pools: a lowered CPU priority, and a process exit that does not wait on them.

Python joins a ``ThreadPoolExecutor``'s threads when the process exits, after they have run every
item still queued. A speech worker may be loading the recogniser's model or decoding the audio of
a call that has already ended, at a lowered priority (``priority.py``), and neither CTranslate2 nor
eSpeak NG can be interrupted. Under load, a drained gateway waited many seconds for them after
its last call (docs/operations.md, "Signals": SIGTERM exits once the live calls have ended).

So every pool is a :class:`SpeechWorkers`, known to this module. At exit, :func:`finish_all`
cancels what has not started and gives what is running a short grace; when something is still
running after it, the caller ends the process without joining the threads (``server.py``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ParamSpec, TypeVar

from appbridge.speech.priority import lower_current_thread_priority

__all__ = ["SpeechWorkers", "finish_all"]

P = ParamSpec("P")
T = TypeVar("T")

_pools: weakref.WeakSet[SpeechWorkers] = weakref.WeakSet()


class SpeechWorkers(ThreadPoolExecutor):
    """A thread pool whose threads run at the speech workers' priority (``priority.py``) and
    whose unfinished work can be abandoned at exit (module doc)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(
            max_workers,
            thread_name_prefix=thread_name_prefix,
            initializer=lower_current_thread_priority,
        )
        self._live: set[Future[Any]] = set()
        self._live_lock = threading.Lock()
        _pools.add(self)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future = super().submit(fn, *args, **kwargs)
        with self._live_lock:
            self._live.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self._live_lock:
            self._live.discard(future)

    @property
    def unfinished(self) -> int:
        """Items submitted and not finished (queued or running)."""
        with self._live_lock:
            return len(self._live)

    def finish(self, deadline: float) -> bool:
        """Take no more work, cancel what has not started, and wait for what runs until
        ``deadline`` (``time.monotonic()``). False when something is still running then."""
        self.shutdown(wait=False, cancel_futures=True)
        with self._live_lock:
            live = list(self._live)
        return not wait(live, timeout=max(0.0, deadline - time.monotonic())).not_done


def finish_all(grace_s: float) -> bool:
    """:meth:`SpeechWorkers.finish` for every pool of the process, within one ``grace_s``. False
    when a worker is still running: the process should then exit without joining them."""
    deadline = time.monotonic() + grace_s
    return all([pool.finish(deadline) for pool in list(_pools)])
