"""The request-head deadline and the cap on waiting heads (appbridge/http/head_deadline.py),
in virtual time: a loop whose timers fire when the test says."""

from __future__ import annotations

from typing import Any

import pytest

from appbridge.http import head_deadline
from appbridge.http.head_deadline import HeadDeadline


class Timer:
    def __init__(self, when: float, callback: Any) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Any) -> Timer:
        timer = Timer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in list(self.timers):
            if not timer.cancelled and timer.when <= self.now:
                self.timers.remove(timer)
                timer.callback()


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Conn(HeadDeadline):
    def __init__(self, loop: VirtualLoop, state: object) -> None:
        self.loop = loop  # type: ignore[assignment]
        self.server_state = state
        self.transport = Transport()  # type: ignore[assignment]


class State:
    pass


def test_the_head_must_be_complete_within_the_deadline() -> None:
    loop, state = VirtualLoop(), State()
    slow, quick = Conn(loop, state), Conn(loop, state)
    slow._await_head()
    quick._await_head()
    loop.advance(head_deadline.HEAD_TIMEOUT_S - 0.01)
    quick._head_done()
    assert not slow.transport.is_closing()
    loop.advance(0.01)
    assert slow.transport.written.startswith(b"HTTP/1.1 408 Request Timeout")
    assert slow.transport.is_closing()
    assert not quick.transport.is_closing()
    loop.advance(60)
    assert not quick.transport.is_closing()  # its timer was cancelled with the head


def test_arming_twice_keeps_the_first_deadline() -> None:
    loop, state = VirtualLoop(), State()
    conn = Conn(loop, state)
    conn._await_head()
    loop.advance(6)
    conn._await_head()  # on_message_begin after connection_made: same head
    loop.advance(4)
    assert conn.transport.is_closing()


def test_beyond_the_cap_the_longest_waiting_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(head_deadline, "MAX_PENDING_HEADS", 3)
    loop, state, other = VirtualLoop(), State(), State()
    conns = [Conn(loop, state) for _ in range(5)]
    elsewhere = Conn(loop, other)  # another server's connections are counted apart
    elsewhere._await_head()
    for conn in conns:
        conn._await_head()
        loop.advance(0.1)
    assert [c.transport.is_closing() for c in conns] == [True, True, False, False, False]
    assert not elsewhere.transport.is_closing()
    conns[2]._head_done()
    Conn(loop, state)._await_head()
    assert not conns[3].transport.is_closing()  # a finished head left room
