"""The reconnect timing rules (appbridge/apps/timers.py, ``ReconnectSeries``) in virtual time.

docs/protocol-session-v1.md, "Reconnecting": a backoff doubling from 100 ms up to 2 s, each wait
scaled by a random factor between 0.5 and 1, at most 5 attempts, none started later than 15 s
after the loss, a link that lived 5 s starting a fresh series, and the 2 s take-back. The
random source is injected, so every instant is exact.
"""

from __future__ import annotations

import pytest

from appbridge.apps.timers import (
    LIVED_RESET_S,
    RECONNECT_MAX_ATTEMPTS,
    RECONNECT_WINDOW_S,
    TAKE_BACK_S,
    ReconnectSeries,
    TakeBack,
    TakeBackOutcome,
)


def fixed(value: float):  # type: ignore[no-untyped-def]
    return lambda: value


def attempts(series: ReconnectSeries, now: float, answer_s: float = 0.0) -> list[float]:
    """Start every attempt as soon as allowed; each fails ``answer_s`` after it started."""
    starts: list[float] = []
    while (at := series.next_attempt(now)) is not None:
        starts.append(at)
        now = at + answer_s
        series.failed(now)
    return starts


def test_the_backoff_doubles_from_100_ms_with_the_full_factor() -> None:
    series = ReconnectSeries(10.0, fixed(0.999999))
    starts = attempts(series, 10.0)
    waits = [round(b - a, 4) for a, b in zip([10.0, *starts], starts, strict=False)]
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6]
    assert series.attempts == RECONNECT_MAX_ATTEMPTS == 5


def test_the_random_factor_halves_the_wait_at_its_low_end() -> None:
    series = ReconnectSeries(0.0, fixed(0.0))
    starts = attempts(series, 0.0)
    assert [round(t, 4) for t in starts] == [0.05, 0.15, 0.35, 0.75, 1.55]


@pytest.mark.parametrize("r", [0.0, 0.25, 0.5, 0.75, 0.999])
def test_each_wait_is_between_half_and_all_of_the_base(r: float) -> None:
    series = ReconnectSeries(0.0, fixed(r))
    for attempt, base in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0], start=1):
        delay = series.delay_s(attempt)
        assert 0.5 * base <= delay <= base
        assert delay == pytest.approx(base * (0.5 + 0.5 * r))


def test_the_wait_is_capped_at_2_s() -> None:
    series = ReconnectSeries(0.0, fixed(0.999999), max_attempts=10, window_s=100.0)
    assert round(series.delay_s(6), 4) == 2.0 and round(series.delay_s(9), 4) == 2.0


def test_the_wait_counts_from_the_failure_of_the_attempt_before() -> None:
    series = ReconnectSeries(0.0, fixed(0.999999))
    assert series.next_attempt(0.0) == pytest.approx(0.1)
    series.failed(0.1 + TAKE_BACK_S)  # the app said nothing for 2 s
    assert series.next_attempt(2.1) == pytest.approx(2.3)


def test_no_attempt_starts_later_than_15_s_after_the_loss() -> None:
    series = ReconnectSeries(0.0, fixed(0.999999))
    starts = attempts(series, 0.0, answer_s=TAKE_BACK_S + 2.0)
    assert starts and all(t <= RECONNECT_WINDOW_S for t in starts)
    assert len(starts) == 4  # the fifth would start at 17.1 s
    assert series.next_attempt(20.0) is None


def test_the_series_is_over_after_five_attempts() -> None:
    series = ReconnectSeries(0.0, fixed(0.5))
    attempts(series, 0.0)
    assert series.next_attempt(3.0) is None and series.attempts == 5


def test_a_link_that_lived_under_5_s_continues_its_series() -> None:
    series = ReconnectSeries(0.0, fixed(0.999999))
    assert series.next_attempt(0.0) == pytest.approx(0.1)
    assert series.next_attempt(0.1) == pytest.approx(0.3)  # taken back at 0.3 s
    assert series.lost(4.0, lived_s=3.7)  # lost again 3.7 s later
    assert series.attempts == 2
    assert series.next_attempt(4.0) == pytest.approx(4.4)  # the third wait: 400 ms
    assert series.deadline == RECONNECT_WINDOW_S  # still 15 s after the first loss


def test_a_link_that_lived_5_s_starts_a_fresh_series() -> None:
    series = ReconnectSeries(0.0, fixed(0.5))
    series.next_attempt(0.0)
    assert not series.lost(8.0, lived_s=LIVED_RESET_S)
    fresh = ReconnectSeries(8.0, fixed(0.999999))
    assert fresh.next_attempt(8.0) == pytest.approx(8.1) and fresh.deadline == 23.0


# --- the 2 s take-back (apps/timers.TakeBack) ------------------------------------------------


def test_a_take_back_within_2_s_is_taken() -> None:
    rule = TakeBack(offered_at=5.0)
    assert rule.deadline == 5.0 + TAKE_BACK_S == 7.0
    assert rule.on_answer(6.99, takes_back=True) is TakeBackOutcome.TAKEN
    assert rule.on_answer(7.0, takes_back=True) is TakeBackOutcome.TAKEN


def test_anything_else_first_or_a_close_refuses() -> None:
    rule = TakeBack(offered_at=0.0)
    assert rule.on_answer(0.2, takes_back=False) is TakeBackOutcome.REFUSED


def test_no_answer_in_2_s_fails_the_attempt() -> None:
    rule = TakeBack(offered_at=0.0)
    assert rule.on_timer(1.999) is None
    assert rule.on_timer(2.0) is TakeBackOutcome.NO_ANSWER
    assert rule.on_answer(2.01, takes_back=True) is TakeBackOutcome.NO_ANSWER  # too late
