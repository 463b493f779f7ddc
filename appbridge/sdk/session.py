"""One call, from the app's side: :class:`Session` builds ``say``, ``gather`` and the rest out of
the messages of ``fonoster.session.v1`` (docs/protocol-session-v1.md).

Theory of operation
-------------------
A session owns one WebSocket (a :class:`Wire`) after ``session.start`` arrived. A reader task
decodes every frame with :func:`appbridge.protocol.session_v1.decode_event` (typed and
validated; a frame that does not decode is logged and dropped, so the app never sees garbage) and
a writer task sends commands in the order the app issued them, so no command method has to wait
for the network.

Each command gets an ``id`` made by the SDK. The events it causes echo that id (``output.*``,
``mark``, ``session.end``) and so do errors (``relatesTo``), which is how an ``error`` finds the
awaiting call and becomes its exception (:mod:`appbridge.sdk.errors`). Every event that did not
answer an await is yielded; callbacks and extra iterators see all (:mod:`appbridge.sdk.fanout`).

Automatic barge-in (docs/protocol-session-v1.md, "Interruptions"): the gateway never stops output
on caller speech; it sends ``turn.user_started``. When that arrives while an item the app marked
``interruptible`` is playing, the session sends ``clear`` (``auto_barge_in = False``: it does not).

When the session ends (``session.end``, or the socket closing) every pending handle and gather
raises :class:`~appbridge.sdk.errors.SessionClosed`, and iteration stops once the events already
received were yielded: nothing hangs on a call that is gone.
A session with ``reconnect`` (docs/protocol-session-v1.md, "Reconnecting"; docs/sdk.md) is
*parked* instead when its socket is lost: its data and queued events stay, pending handles raise
``SessionClosed`` (their answers went with the socket) and so do new commands, while the server
waits for the gateway to redial (``sdk/resume.py``). :meth:`_resume` moves it onto the new
socket; iteration then yields :class:`~appbridge.sdk.events.Resumed`, then ``events.lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Final, Literal

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk.errors import CommandError, SessionClosed, SessionEnded, error_from_event
from appbridge.sdk.event_queue import MAX_QUEUED_AUDIO_FRAMES, EventQueue
from appbridge.sdk.events import AudioFrame, Event, GatherResult, OutputResult
from appbridge.sdk.fanout import Fanout
from appbridge.sdk.gather import GatherState
from appbridge.sdk.handles import Output, Pending, TransferHandle
from appbridge.sdk.inbound import decode_frame
from appbridge.sdk.info import SessionInfo
from appbridge.sdk.resume import Parking
from appbridge.sdk.streaming import pump_text
from appbridge.sdk.wire import Wire

__all__ = ["Session"]

log = logging.getLogger("appbridge.sdk")

_DTMF_SEND_KEYS: Final = frozenset("0123456789*#ABCD,")
_GATHER_INPUT = (
    sv1.DtmfEvent,
    sv1.TurnUserStarted,
    sv1.TurnLikelyEnded,
    sv1.TurnResumed,
    sv1.TurnEnded,
)


class _Gather:
    def __init__(self, state: GatherState, future: asyncio.Future[GatherResult]) -> None:
        self.state = state
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.prompt: Output | None = None
        self.owns_prompt = False


class Session(SessionInfo, Fanout, Parking):
    """One call's session. The server hands it to the handler after ``session.start``.

    Start data (:class:`~appbridge.sdk.info.SessionInfo`): :attr:`start` is the whole
    ``session.start``; :attr:`from_`, :attr:`to`, :attr:`direction`, :attr:`metadata`,
    :attr:`handoff_payload`, :attr:`call_ref`, :attr:`session_ref`, :attr:`app_ref`,
    :attr:`audio` and :attr:`speech` are its fields.
    """

    def __init__(
        self,
        start: sv1.SessionStart,
        wire: Wire,
        *,
        auto_barge_in: bool = True,
        max_queued_audio_frames: int = MAX_QUEUED_AUDIO_FRAMES,
        reconnect: bool = False,
    ) -> None:
        super().__init__(start)
        Parking.__init__(self, reconnect)
        Fanout.__init__(self, f"session {start.session_ref}")
        self.auto_barge_in = auto_barge_in
        """Send ``clear`` when the caller starts talking over an interruptible item."""
        self.end: sv1.SessionEnd | None = None
        """The ``session.end`` once it arrived."""
        self._wire = wire
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._pending: dict[str, Pending[Any]] = {}
        self._playing: str | None = None
        self._barged_in_on: str | None = None
        self._gathers: list[_Gather] = []
        self._events = EventQueue(f"session {start.session_ref}", max_queued_audio_frames)
        self._outbox: asyncio.Queue[tuple[str | bytes, Pending[None] | None]] = asyncio.Queue()
        self._closed = False
        self._closed_event = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def gathering(self) -> bool:
        """Whether a :meth:`gather` is waiting for input (input arriving now goes to it)."""
        return any(not g.future.done() for g in self._gathers)

    async def wait_closed(self) -> None:
        """Returns once the session is over."""
        await self._closed_event.wait()

    # ------------------------------------------------------------------ output
    def say(
        self,
        text: str,
        *,
        voice: str | None = None,
        language: str | None = None,
        interruptible: bool = True,
        preempt: bool = False,
    ) -> Output:
        """Speaks ``text``; ``await`` it for how it ended (done, or interrupted with what was
        heard). ``voice``/``language`` are catalog ids; ``preempt`` plays it before anything
        queued, interrupting what plays."""
        out = self._new_output("say", interruptible)
        self._send(
            sv1.Speak(
                text=text,
                id=out.id,
                voice=voice,
                language=language,
                interruptible=interruptible,
                preempt=preempt,
            )
        )
        return out

    def say_stream(
        self,
        pieces: AsyncIterable[str] | Iterable[str],
        *,
        voice: str | None = None,
        language: str | None = None,
        interruptible: bool = True,
        preempt: bool = False,
    ) -> Output:
        """Streams text (LLM tokens, say) as one utterance: ``last: false`` pieces with one id,
        then an empty ``last: true`` piece once ``pieces`` is exhausted. Stops reading
        ``pieces`` when the utterance is interrupted. If ``pieces`` raises, what was sent still
        plays and awaiting the handle raises that exception."""
        out = self._new_output("say", interruptible)
        fields = {
            "voice": voice,
            "language": language,
            "interruptible": interruptible,
            "preempt": preempt,
        }
        self._spawn(pump_text(self, out, pieces, fields), f"say-stream-{out.id}")
        return out

    def play(
        self, url: str, *, loop: bool = False, interruptible: bool = True, preempt: bool = False
    ) -> Output:
        """Plays the WAV file at ``url`` (looped with ``loop``); ``await`` it for how it ended."""
        out = self._new_output("play", interruptible)
        self._send(
            sv1.Play(url=url, id=out.id, loop=loop, interruptible=interruptible, preempt=preempt)
        )
        return out

    def send_audio(self, frames: bytes | Iterable[bytes]) -> Pending[None]:
        """Queues raw audio in the session's format (binary frames, no track byte). Raw audio
        has no id: it produces no ``output.*`` events, so put a :meth:`mark` after it."""
        chunks = [frames] if isinstance(frames, bytes | bytearray | memoryview) else list(frames)
        handle: Pending[None] = self._new_pending("audio")
        self._check_open()
        for i, chunk in enumerate(chunks):
            self._outbox.put_nowait((bytes(chunk), handle if i == len(chunks) - 1 else None))
        if not chunks:
            self._settle(handle, None)
        return handle

    def mark(self, name: str) -> Pending[sv1.MarkEvent]:
        """Marks the current end of the output queue; resolves with the ``mark`` event
        (``cleared`` False once everything before it was heard, True if ``clear`` dropped it)."""
        handle: Pending[sv1.MarkEvent] = self._new_pending("mark")
        self._send(sv1.MarkCommand(name=name, id=handle.id))
        return handle

    def clear(self) -> Pending[None]:
        """Empties the output queue: the caller hears silence within 40 ms."""
        return self._send_unanswered("clear", lambda i: sv1.Clear(id=i))

    # ------------------------------------------------------------------ input
    async def gather(
        self,
        *,
        timeout_s: float = 5.0,
        speech: bool = True,
        dtmf: bool = True,
        max_digits: int | None = None,
        terminators: str = "#",
        digit_timeout_s: float | None = None,
        prompt: str | Output | None = None,
        voice: str | None = None,
        language: str | None = None,
    ) -> GatherResult:
        """Waits for the caller's next turn or keypresses (see :mod:`appbridge.sdk.gather`).

        ``prompt`` is text the SDK says first (with ``voice``/``language``), or an item already
        sent (a ``say``, ``say_stream`` or ``play`` handle): the timeout starts when it stops
        playing, and input during it stops it. A text prompt that fails (an unknown voice, say)
        makes the gather raise that error. Input used here is not yielded by the iterator.
        """
        self._check_open()
        state = GatherState(
            now=self._loop.time(),
            timeout_s=timeout_s,
            speech=speech,
            dtmf=dtmf,
            max_digits=max_digits,
            terminators=terminators,
            digit_timeout_s=digit_timeout_s,
            awaiting_prompt=prompt is not None,
        )
        gather = _Gather(state, self._loop.create_future())
        self._gathers.append(gather)
        try:
            if isinstance(prompt, str):
                gather.prompt = self.say(prompt, voice=voice, language=language)
                gather.prompt._awaited = True  # its error is the gather's, not an event
                gather.owns_prompt = True
            elif prompt is not None:
                gather.prompt = prompt
            if gather.prompt is not None:
                gather.prompt.add_done_callback(lambda _o: self._prompt_done(gather))
            self._arm_gather(gather)
            return await gather.future
        finally:
            if gather.timer is not None:
                gather.timer.cancel()
            with contextlib.suppress(ValueError):
                self._gathers.remove(gather)

    def listen(
        self,
        *,
        language: str | None = None,
        hints: list[str] | None = None,
        patience: Literal["low", "normal", "high"] | None = None,
    ) -> Pending[None]:
        """Changes speech recognition from now on (``listen.update``)."""
        return self._send_unanswered(
            "listen",
            lambda i: sv1.ListenUpdate(language=language, hints=hints, patience=patience, id=i),
        )

    def subscribe(self, *events: str) -> Pending[None]:
        """Turns on opt-in events, e.g. ``"turn.estimate"``, ``"transcript.partial"``."""
        return self._send_unanswered(
            "subscribe", lambda i: sv1.Subscribe(events=list(events), id=i)
        )

    # ------------------------------------------------------------------ call control
    def hold(self, music: str | None = None) -> Pending[None]:
        """Puts the caller on hold (looped ``music`` or silence). Until :meth:`resume`, no caller
        audio arrives and most commands raise :class:`~appbridge.sdk.errors.OnHold`."""
        return self._send_unanswered("hold", lambda i: sv1.Hold(music=music, id=i))

    def resume(self) -> Pending[None]:
        return self._send_unanswered("resume", lambda i: sv1.Resume(id=i))

    def dtmf(self, digits: str) -> Pending[None]:
        """Sends keypresses on the call: 0-9, ``*``, ``#``, A-D, and ``,`` for a 500 ms pause."""
        if not digits or set(digits) - _DTMF_SEND_KEYS:
            raise ValueError(f"not DTMF digits: {digits!r}")
        return self._send_unanswered("dtmf", lambda i: sv1.DtmfSend(digits=digits, id=i))

    def transfer(
        self,
        to: str,
        *,
        mode: Literal["cold", "warm", "refer"] = "cold",
        headers: dict[str, str] | None = None,
        music: str | None = None,
    ) -> TransferHandle:
        """Transfers the caller to ``to`` (E.164 or a trunk's ``sip:`` URI). Await it: it
        resolves with the ``session.end`` (reason ``transfer``) or raises ``TransferFailed``."""
        self._check_open()
        self.reconnect = False  # the app's last word (docs/protocol-session-v1.md)
        handle = TransferHandle(self._new_id("transfer"), mode=mode, complete=self._complete)
        self._pending[handle.id] = handle
        self._send(sv1.Transfer(to=to, mode=mode, headers=headers, music=music, id=handle.id))
        return handle

    def handoff(self, app: str, payload: Any = None) -> Pending[sv1.SessionEnd]:
        """Hands the call to the app ``app`` (its ``session.start`` carries ``payload``)."""
        handle: Pending[sv1.SessionEnd] = self._new_pending("handoff")
        self.reconnect = False  # the app's last word (docs/protocol-session-v1.md)
        self._send(sv1.Handoff(app=app, payload=payload, id=handle.id))
        return handle

    def hangup(self) -> Pending[str]:
        """Ends the call; resolves with the end reason (``app_hangup``, unless the call had
        already ended otherwise). Never raises SessionClosed: a closed session is hung up."""
        if self.parked:
            self._on_closed()  # not to be resumed any more: the gateway falls back
        if self._closed:
            done: Pending[str] = Pending(self._new_id("hangup"), "hangup")
            done._resolve(self.end.reason if self.end else "closed")
            return done
        handle: Pending[str] = self._new_pending("hangup")
        self.reconnect = False  # the app's last word (docs/protocol-session-v1.md)
        self._send(sv1.Hangup(id=handle.id))
        return handle

    # ------------------------------------------------------------------ events
    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            event = self._events.pop()
            if event is not None:
                yield event
            elif self._closed:
                return
            else:
                self._events.wakeup.clear()
                await self._events.wakeup.wait()

    # ------------------------------------------------------------------ internals: sending
    def _new_id(self, kind: str) -> str:
        return f"sdk-{kind}-{next(self._ids)}"

    def _check_open(self) -> None:
        if self._closed:
            raise SessionEnded(self.end.reason) if self.end else SessionClosed()
        if self.parked:
            raise SessionClosed()

    def _new_pending(self, kind: str) -> Pending[Any]:
        self._check_open()
        handle: Pending[Any] = Pending(self._new_id(kind), kind)
        self._pending[handle.id] = handle
        return handle

    def _new_output(self, kind: str, interruptible: bool) -> Output:
        self._check_open()
        out = Output(self._new_id(kind), kind, interruptible=interruptible)
        self._pending[out.id] = out
        return out

    def _send(self, command: sv1.AnyCommand, written: Pending[None] | None = None) -> None:
        self._check_open()
        self._outbox.put_nowait((sv1.encode_command(command).decode(), written))

    def _send_unanswered(self, kind: str, build: Any) -> Pending[None]:
        handle: Pending[None] = self._new_pending(kind)
        self._send(build(handle.id), handle)
        return handle

    def _complete(self, transfer: TransferHandle) -> None:
        self._send(sv1.TransferComplete(id=transfer.id))

    def _settle(self, handle: Pending[Any], value: Any) -> None:
        self._pending.pop(handle.id, None)
        handle._resolve(value)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _run_io(self) -> None:
        """Starts the reader and writer tasks on the current socket (the server calls this once,
        and :meth:`_resume` again for each new socket)."""
        if self.reconnect:
            self._send(sv1.SessionUpdate(reconnect=True))  # first, before any command
        wire = self._wire
        self._io = [
            self._spawn(self._reader(wire), f"sdk-reader-{self.session_ref}"),
            self._spawn(self._writer(wire), f"sdk-writer-{self.session_ref}"),
        ]

    async def _writer(self, wire: Wire) -> None:
        try:
            while True:
                frame, written = await self._outbox.get()
                await wire.send(frame)
                if written is not None:
                    self._settle(written, None)
        except (ConnectionError, OSError):
            return
        finally:
            self._wire_lost(wire)

    async def _reader(self, wire: Wire) -> None:
        """Reads until the socket closes. A bug in handling a frame ends this session (code
        1011) instead of leaving its awaits hanging; it never reaches another call."""
        try:
            while (frame := await wire.recv()) is not None:
                self._on_frame(frame)
        except Exception:
            log.exception("session %s: failed to handle a frame; closing", self.session_ref)
            self.reconnect = False
            await wire.close(1011, "internal error")
        finally:
            self._wire_lost(wire)

    # ------------------------------------------------------------------ internals: receiving
    def _on_frame(self, frame: str | bytes) -> None:
        event = decode_frame(frame)
        if event is None or isinstance(event, sv1.SessionStart):
            return
        self._publish(event)
        if isinstance(event, AudioFrame):
            self._queue(event)
            return
        consumed = False
        if isinstance(event, sv1.OutputStarted):
            self._on_output_started(event)
        elif isinstance(event, sv1.OutputDone | sv1.OutputInterrupted):
            self._on_output_ended(event)
        elif isinstance(event, sv1.MarkEvent) and event.id is not None:
            handle = self._pending.get(event.id)
            if handle is not None and handle.kind == "mark":
                self._settle(handle, event)
        elif isinstance(event, sv1.ErrorEvent):
            consumed = self._on_error(event)
        elif isinstance(event, sv1.TurnUserStarted):
            self._maybe_barge_in()
        if isinstance(event, _GATHER_INPUT):
            consumed = self._feed_gathers(event)
        if not consumed:
            self._queue(event)
        if isinstance(event, sv1.SessionEnd):
            self._on_end(event)

    def _on_output_started(self, event: sv1.OutputStarted) -> None:
        self._playing = event.id
        handle = self._pending.get(event.id)
        if isinstance(handle, Output):
            handle._mark_started()

    def _on_output_ended(self, event: sv1.OutputDone | sv1.OutputInterrupted) -> None:
        if self._playing == event.id:
            self._playing = None
        handle = self._pending.get(event.id)
        if not isinstance(handle, Output):
            return
        if isinstance(event, sv1.OutputDone):
            result = OutputResult(event.id, "done", event.heard_ms)
        else:
            result = OutputResult(event.id, "interrupted", event.heard_ms, event.heard_text)
        self._settle(handle, result)

    def _on_error(self, event: sv1.ErrorEvent) -> bool:
        """Fails the command ``relatesTo`` names; True when someone awaits it."""
        handle = self._pending.get(event.relates_to) if event.relates_to else None
        if handle is None:
            return False
        self._pending.pop(handle.id, None)
        handle._fail(error_from_event(event))
        return handle.awaited

    def _maybe_barge_in(self) -> None:
        playing = self._playing
        if not self.auto_barge_in or playing is None or self._barged_in_on == playing:
            return
        handle = self._pending.get(playing)
        if isinstance(handle, Output) and handle.interruptible:
            self._barged_in_on = playing
            log.debug("session %s: caller barged in over %s; clearing", self.session_ref, playing)
            self._send(sv1.Clear(id=self._new_id("barge-in")))

    def _feed_gathers(self, event: object) -> bool:
        used = False
        now = self._loop.time()
        for gather in list(self._gathers):
            if gather.future.done():
                continue
            state = gather.state
            if not state.wants(event):
                continue
            had_input = state.input_started
            result = state.on_event(event, now)
            used = True
            if not had_input and state.input_started:
                self._stop_prompt(gather, event)
            if result is not None:
                gather.future.set_result(result)
            self._arm_gather(gather)
        return used

    def _stop_prompt(self, gather: _Gather, event: object) -> None:
        """Input stops the gather's prompt, playing or still queued, as a keypress stops a
        telephony menu. Speech does so only with auto barge-in on. ``clear`` empties the whole
        queue, so it is not sent while an earlier item of the app's is still playing."""
        prompt = gather.prompt
        if prompt is None or prompt.done() or self._barged_in_on == prompt.id:
            return
        if isinstance(event, sv1.TurnUserStarted) and not self.auto_barge_in:
            return
        if self._playing not in (None, prompt.id):
            return
        self._barged_in_on = prompt.id
        self._send(sv1.Clear(id=self._new_id("clear")))

    def _prompt_done(self, gather: _Gather) -> None:
        if gather.future.done():
            return
        prompt = gather.prompt
        failure = prompt._future.exception() if prompt is not None else None
        if gather.owns_prompt and isinstance(failure, CommandError):
            gather.future.set_exception(failure)
            return
        gather.state.prompt_finished(self._loop.time())
        self._arm_gather(gather)

    def _arm_gather(self, gather: _Gather) -> None:
        if gather.timer is not None:
            gather.timer.cancel()
            gather.timer = None
        deadline = gather.state.deadline()
        if deadline is not None and not gather.future.done():
            gather.timer = self._loop.call_at(deadline, self._gather_timer, gather)

    def _gather_timer(self, gather: _Gather) -> None:
        gather.timer = None
        if gather.future.done():
            return
        result = gather.state.on_timer(self._loop.time())
        if result is not None:
            gather.future.set_result(result)
        else:
            self._arm_gather(gather)

    def _queue(self, event: Event) -> None:
        self._events.push(event)

    # ------------------------------------------------------------------ internals: the end
    def _on_end(self, end: sv1.SessionEnd) -> None:
        """``session.end``: the commands that asked for this end resolve; all else raises."""
        if self.end is None:
            self.end = end
        for handle in list(self._pending.values()):
            if handle.kind == "hangup":
                self._settle(handle, end.reason)
            elif (handle.kind, end.reason) in (
                ("transfer", "transfer"),
                ("handoff", "handoff"),
            ) and end.id in (None, handle.id):
                self._settle(handle, end)
        self._on_closed()

    def _on_closed(self) -> None:
        if self._closed:
            return
        self._closed = True
        reason = self.end.reason if self.end is not None else None
        for handle in list(self._pending.values()):
            if handle.kind == "hangup":
                handle._resolve(reason or "closed")
            else:
                handle._fail(SessionEnded(reason) if reason else SessionClosed())
        self._pending.clear()
        for gather in self._gathers:
            if not gather.future.done():
                gather.future.set_exception(SessionEnded(reason) if reason else SessionClosed())
                gather.future.exception()
        self._closed_event.set()
        self._events.wakeup.set()
        self._close_taps()
        self._unpark()

    async def _shutdown(self) -> None:
        """Stops the session's tasks (the server calls this after the handler returned)."""
        self._on_closed()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
