"""Reconnecting, from the app's side (docs/protocol-session-v1.md, "Reconnecting"; docs/sdk.md,
"Reconnecting").

Opt-in (``AppServer(..., reconnect=True)``): each session sends ``session.update`` with
``reconnect: true`` right after ``session.start``. When its socket is lost before
``session.end``, the session is *parked* (:class:`Parking`): its data and the events already
queued stay, the handles still waiting raise ``SessionClosed`` (their answers went with the
socket), and new commands raise it too. The server keeps a parked session for the 15 s the
gateway may redial (:class:`Resumer`). A ``session.start`` with ``reconnect`` for a parked
``sessionRef`` moves the session onto the new socket, answered with ``session.update``, without
a second handler call; the handler then sees :class:`~appbridge.sdk.events.Resumed`, then the
gateway's ``events.lost``. A parked session not resumed in time ends.

A ``session.start`` with ``reconnect`` for a session this process does not know (it restarted,
its memory is gone) is refused by closing the socket, so the gateway applies the app's fallback;
unless the app's *resume hook* says it can restore the session from its own store (keyed by
``sessionRef``): the handler is then called with a session whose first event is ``Resumed``
with ``restored`` True.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk.errors import SessionClosed
from appbridge.sdk.events import Resumed

if TYPE_CHECKING:
    from appbridge.sdk.handles import Pending
    from appbridge.sdk.session import Session
    from appbridge.sdk.wire import Wire

__all__ = ["RESUME_WINDOW_S", "Parking", "ResumeHook", "Resumer"]

log = logging.getLogger("appbridge.sdk")

RESUME_WINDOW_S: Final = 15.0
"""How long a parked session waits for the gateway: its attempts start within 15 s of the loss."""

ResumeHook = Callable[[sv1.SessionStart], Awaitable[bool] | bool]
"""Asked for a redialled session this process does not know: True restores it."""


class Parking:
    """The parking half of :class:`~appbridge.sdk.Session` (module doc)."""

    # What the session provides; declared for the type checker.
    _wire: Wire
    _closed: bool
    _io: list[asyncio.Task[None]]
    _outbox: asyncio.Queue[tuple[str | bytes, Pending[None] | None]]
    _pending: dict[str, Pending[Any]]
    _playing: str | None
    _barged_in_on: str | None
    end: sv1.SessionEnd | None

    @property
    def session_ref(self) -> str:
        raise NotImplementedError

    def __init__(self, reconnect: bool) -> None:
        self.reconnect = reconnect
        """Park on a lost socket and wait to be resumed (docs/sdk.md, "Reconnecting")."""
        self.parked = False
        """True while the socket is lost and the gateway may still redial."""
        self.on_park: Callable[[Any], None] | None = None  # the server's, told of each parking
        self.wire_done = asyncio.Event()
        """Set when the current socket is done with: parked on, or the session closed."""
        self._io = []
        self._resumed = asyncio.Event()

    async def wait_resumed(self) -> bool:
        """While parked: True once the session is resumed, False once it ended instead. Not
        parked: True at once (False when closed)."""
        while self.parked:
            self._resumed.clear()
            await self._resumed.wait()
        return not self._closed

    def _unpark(self) -> None:
        """The session closed: nothing waits for a resume or a socket any more."""
        self.parked = False
        self._resumed.set()
        self.wire_done.set()

    def _wire_lost(self, wire: Wire) -> None:
        """The socket ``wire`` is gone: park (with ``reconnect``, before ``session.end``), else
        close. A socket the session already left changes nothing."""
        if wire is not self._wire or self.parked or self._closed:
            return
        if self.reconnect and self.end is None:
            self._park()
        else:
            self._on_closed()

    def _park(self) -> None:
        self.parked = True
        log.info("session %s: the socket was lost; parked", self.session_ref)
        current = asyncio.current_task()
        for task in self._io:
            if task is not current:
                task.cancel()
        self._outbox = asyncio.Queue()  # what was meant for the lost socket is dropped
        self._playing = self._barged_in_on = None
        pending, self._pending = list(self._pending.values()), {}
        for handle in pending:
            handle._fail(SessionClosed())
        self.wire_done.set()
        if self.on_park is not None:
            self.on_park(self)

    def _resume(self, wire: Wire, info: sv1.Reconnect, *, restored: bool = False) -> None:
        """Move the session onto ``wire``, on which a ``session.start`` with ``reconnect``
        came: ``session.update`` goes out first, then iteration yields :class:`Resumed`."""
        if not self.parked and not restored:
            self._park()  # the gateway redialled before this side saw the old socket go
        old, self._wire = self._wire, wire
        if old is not wire:
            self._spawn(old.close(), f"sdk-close-old-{self.session_ref}")
        self.parked = False
        self.wire_done = asyncio.Event()
        self._resumed.set()
        resumed = Resumed(info.attempt, info.down_ms, restored)
        self._publish(resumed)
        self._queue(resumed)
        self._run_io()
        log.info("session %s: resumed (attempt %d)", self.session_ref, info.attempt)

    # Provided by the session.
    def _on_closed(self) -> None:
        raise NotImplementedError

    def _queue(self, event: Any) -> None:
        raise NotImplementedError

    def _publish(self, event: Any) -> None:
        raise NotImplementedError

    def _run_io(self) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        raise NotImplementedError


class Resumer:
    """The server's parked sessions, by ``sessionRef``, each for :data:`RESUME_WINDOW_S`."""

    def __init__(self, hook: ResumeHook | None, window_s: float = RESUME_WINDOW_S) -> None:
        self.hook = hook
        self.window_s = window_s
        self._sessions: dict[str, Session] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def track(self, session: Session) -> None:
        self._sessions[session.session_ref] = session
        session.on_park = self._parked

    def forget(self, session: Session) -> None:
        if self._sessions.get(session.session_ref) is session:
            del self._sessions[session.session_ref]
        timer = self._timers.pop(session.session_ref, None)
        if timer is not None:
            timer.cancel()

    def take(self, session_ref: str) -> Session | None:
        """The live session ``session_ref`` names, its wait for the gateway over."""
        session = self._sessions.get(session_ref)
        if session is None or session.closed:
            return None
        timer = self._timers.pop(session_ref, None)
        if timer is not None:
            timer.cancel()
        return session

    async def restores(self, start: sv1.SessionStart) -> bool:
        """Whether the app's resume hook takes back a session this process does not know."""
        if self.hook is None:
            return False
        try:
            answer = self.hook(start)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception:
            log.exception("session %s: the resume hook failed; refusing", start.session_ref)
            return False
        return bool(answer)

    def _parked(self, session: Session) -> None:
        loop = asyncio.get_running_loop()
        self._timers[session.session_ref] = loop.call_later(self.window_s, self._expire, session)

    def _expire(self, session: Session) -> None:
        self._timers.pop(session.session_ref, None)
        if session.parked:
            log.info("session %s: not resumed in time; closed", session.session_ref)
            session._on_closed()
            self.forget(session)
