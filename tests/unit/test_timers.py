"""The app link's timing rules in virtual time (docs/protocol-session-v1.md, "Connection and
frames")."""

from __future__ import annotations

import pytest

from appbridge.apps.timers import Keepalive, KeepaliveAction, RetryWindow
from appbridge.clock import VirtualClock


def run_until(ka: Keepalive, clock: VirtualClock, until: float) -> list[tuple[float, str]]:
    """Fire the keepalive's timer at each deadline it reports, like the shell does."""
    seen: list[tuple[float, str]] = []
    while True:
        deadline = ka.next_deadline()
        if deadline > until or ka.dead:
            return seen
        clock.advance(max(0.0, deadline - clock.now()))
        action = ka.on_timer(clock.now())
        if action is not KeepaliveAction.NONE:
            seen.append((round(clock.now() - 1000.0, 6), action.value))


def test_pings_every_10_s_and_a_silent_peer_is_dead_at_30_s() -> None:
    clock = VirtualClock()
    ka = Keepalive(clock.now())
    assert ka.next_deadline() == pytest.approx(1010.0)
    seen = run_until(ka, clock, 1100.0)
    assert seen == [(10.0, "ping"), (20.0, "ping"), (30.0, "dead")]


def test_activity_keeps_the_link_alive_and_pings_stay_on_their_grid() -> None:
    clock = VirtualClock()
    ka = Keepalive(clock.now())
    for _ in range(12):  # a pong or a frame every 9 s
        clock.advance(9.0)
        ka.on_activity(clock.now())
        ka.on_timer(clock.now())
    assert not ka.dead
    assert ka.next_ping == pytest.approx(1110.0)


def test_dead_exactly_30_s_after_the_last_frame() -> None:
    clock = VirtualClock()
    ka = Keepalive(clock.now())
    clock.advance(25.0)
    ka.on_activity(clock.now())  # last sign of life at t=25
    seen = run_until(ka, clock, 1200.0)
    assert seen[-1] == (55.0, "dead")
    # The timer of t=10 and t=20 was not fired (the loop was busy): one late ping at 25, then the
    # 10 s grid again.
    pings = [s[0] for s in seen if s[1] == "ping"]
    assert pings == [25.0, 30.0, 40.0, 50.0]


def test_a_late_timer_does_not_burst_pings() -> None:
    clock = VirtualClock()
    ka = Keepalive(clock.now())
    ka.on_activity(clock.now())
    clock.advance(25.0)
    ka.on_activity(clock.now())
    assert ka.on_timer(clock.now()) is KeepaliveAction.PING
    assert ka.on_timer(clock.now()) is KeepaliveAction.NONE
    assert ka.next_ping == pytest.approx(1030.0)


def test_retry_window_is_about_two_and_a_half_seconds() -> None:
    clock = VirtualClock()
    window = RetryWindow(started=clock.now())
    attempts_at = [0.0]
    while True:
        # Each refused attempt fails at once (connection refused).
        at = window.on_failure(clock.now())
        if at is None:
            break
        clock.advance(at - clock.now())
        attempts_at.append(round(clock.now() - 1000.0, 6))
    assert attempts_at == [0.0, 0.1, 0.3, 0.7, 1.2, 1.7, 2.2]
    assert clock.now() - 1000.0 < 2.5
    assert window.attempts == 7


def test_an_attempt_is_bounded_by_what_is_left_of_the_window() -> None:
    clock = VirtualClock()
    window = RetryWindow(started=clock.now())
    assert window.attempt_timeout(clock.now()) == pytest.approx(2.0)
    clock.advance(2.2)
    assert window.attempt_timeout(clock.now()) == pytest.approx(0.5)


def test_slow_attempts_end_the_window_too() -> None:
    clock = VirtualClock()
    window = RetryWindow(started=clock.now())
    clock.advance(2.0)  # a black-holed attempt used up 2 s
    assert window.on_failure(clock.now()) == pytest.approx(1002.1)
    clock.advance(0.1 + 0.5)  # the second attempt timed out at its 0.5 s floor
    assert window.on_failure(clock.now()) is None
