"""Awaitable handles of the commands a :class:`~appbridge.sdk.Session` sends.

Every command is written the moment its method is called, in call order, and the method returns a
handle. Awaiting the handle gives the command's outcome, or raises the exception of the ``error``
event that answered it (``relatesTo`` is the id the SDK gave the command;
docs/protocol-session-v1.md, "Errors for bad input"), or
:class:`~appbridge.sdk.errors.SessionClosed` once the session is gone. Not awaiting is fine too: the
command still goes out, and an error for it is then delivered as an event of the session instead.

Commands the gateway never answers (``clear``, ``hold``, ``listen.update``...) resolve once they
are written to the socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from appbridge.protocol.session_v1 import SessionEnd
from appbridge.sdk.events import OutputResult

__all__ = ["Output", "Pending", "TransferHandle"]

T = TypeVar("T")


class Pending(Generic[T]):
    """A command in flight. ``await`` it for the outcome; :attr:`id` is the command's ``id``."""

    def __init__(self, command_id: str, kind: str) -> None:
        self.id = command_id
        self.kind = kind
        self._future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._awaited = False

    def __await__(self) -> Generator[Any, None, T]:
        self._awaited = True
        return self._future.__await__()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<{type(self).__name__} {self.kind} id={self.id!r} {state}>"

    @property
    def awaited(self) -> bool:
        """Whether anyone awaits (or awaited) this handle; errors go to the event stream if not."""
        return self._awaited

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> T:
        """The outcome of a finished command (raises its error, or InvalidStateError if pending)."""
        return self._future.result()

    def add_done_callback(self, callback: Callable[[Pending[T]], None]) -> None:
        self._future.add_done_callback(lambda _f: callback(self))

    def _resolve(self, value: T) -> None:
        if not self._future.done():
            self._future.set_result(value)

    def _fail(self, exc: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(exc)
            # Retrieved here so an unawaited failure is not logged as "never retrieved": the
            # session already delivered it as an event. Awaiting it still raises.
            self._future.exception()


class Output(Pending[OutputResult]):
    """A ``say``/``say_stream``/``play`` item: awaiting gives how it ended (done or interrupted)."""

    def __init__(self, command_id: str, kind: str, *, interruptible: bool) -> None:
        super().__init__(command_id, kind)
        self.interruptible = interruptible
        self.started = False
        """True once ``output.started`` arrived: the caller began to hear it."""
        self._started_or_over = asyncio.Event()
        self._future.add_done_callback(lambda _f: self._started_or_over.set())

    async def wait_started(self) -> bool:
        """Waits until the caller begins to hear the item (True) or it ended unheard (False)."""
        await self._started_or_over.wait()
        return self.started

    def _mark_started(self) -> None:
        self.started = True
        self._started_or_over.set()


class TransferHandle(Pending[SessionEnd]):
    """A ``transfer``: awaiting gives the ``session.end`` (reason ``transfer``) that ends this
    session, or raises :class:`~appbridge.sdk.errors.TransferFailed` (or
    ``FeatureNotSupported``) and the call stays with the app.

    For ``mode="warm"`` the caller waits on hold while the app talks to the new party; call
    :meth:`complete` to connect them (docs/protocol-session-v1.md, "Call control":
    ``transfer.complete``).
    """

    def __init__(
        self, command_id: str, *, mode: str, complete: Callable[[TransferHandle], None]
    ) -> None:
        super().__init__(command_id, "transfer")
        self.mode = mode
        self._complete = complete

    def complete(self) -> TransferHandle:
        """Sends ``transfer.complete`` for this transfer; await the result for the outcome."""
        self._complete(self)
        return self
