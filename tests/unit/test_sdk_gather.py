"""The gather state machine (appbridge.sdk.gather), in virtual time: every deadline is exact."""

from __future__ import annotations

import pytest

from appbridge.clock import VirtualClock
from appbridge.protocol.session_v1 import (
    DtmfEvent,
    OutputStarted,
    TurnEnded,
    TurnLikelyEnded,
    TurnUserStarted,
)
from appbridge.sdk.events import GatherResult
from appbridge.sdk.gather import GatherState


def ended(text: str, abandoned: bool = False) -> TurnEnded:
    return TurnEnded(
        text=text, language="en-US", confidence=0.9, duration_ms=1200, abandoned=abandoned
    )


def test_a_turn_ends_the_gather_with_its_text() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=5)
    assert g.deadline() == clock.now() + 5
    clock.advance(1)
    assert g.on_event(TurnUserStarted(), clock.now()) is None
    assert g.deadline() is None  # a talking caller is not cut off
    assert g.on_event(TurnLikelyEnded(text="book a"), clock.now()) is None
    clock.advance(30)
    assert g.on_timer(clock.now()) is None
    turn = ended("book a table")
    result = g.on_event(turn, clock.now())
    assert result == GatherResult("speech", text="book a table", turn=turn)
    assert g.finished and g.deadline() is None
    assert g.on_event(DtmfEvent(digit="1"), clock.now()) is None  # answered once


def test_nothing_times_out_exactly_at_the_deadline() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=3)
    clock.advance(2.999)
    assert g.on_timer(clock.now()) is None
    clock.advance(0.001)
    assert g.on_timer(clock.now()) == GatherResult("timeout")
    assert g.result is not None and g.result.timed_out


def test_an_abandoned_or_empty_turn_restarts_the_timeout() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=4)
    g.on_event(TurnUserStarted(), clock.now())
    clock.advance(10)
    assert g.on_event(ended("", abandoned=True), clock.now()) is None
    assert g.deadline() == clock.now() + 4
    g.on_event(TurnUserStarted(), clock.now())
    clock.advance(1)
    assert g.on_event(ended("   "), clock.now()) is None
    assert g.deadline() == clock.now() + 4


def test_digits_until_the_terminator() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=5, digit_timeout_s=2)
    for digit in "123":
        assert g.on_event(DtmfEvent(digit=digit), clock.now()) is None
        assert g.deadline() == clock.now() + 2
        clock.advance(1)
    assert g.on_event(DtmfEvent(digit="#"), clock.now()) == GatherResult(
        "dtmf", digits="123", terminator="#"
    )


def test_digits_up_to_a_count_and_keys_stop_speech() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=5, max_digits=2, terminators="")
    assert g.on_event(DtmfEvent(digit="4"), clock.now()) is None
    assert not g.wants(ended("hello"))  # a digit gather ignores turns from now on
    assert g.on_event(ended("hello"), clock.now()) is None
    assert g.on_event(DtmfEvent(digit="#"), clock.now()) == GatherResult("dtmf", digits="4#")


def test_the_digit_timeout_submits_what_was_pressed() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=10, digit_timeout_s=3)
    g.on_event(DtmfEvent(digit="7"), clock.now())
    clock.advance(3)
    assert g.on_timer(clock.now()) == GatherResult("dtmf", digits="7")


def test_the_timeout_starts_after_the_prompt() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=5, awaiting_prompt=True)
    assert g.deadline() is None
    clock.advance(20)
    assert g.on_timer(clock.now()) is None
    g.prompt_finished(clock.now())
    assert g.deadline() == clock.now() + 5
    clock.advance(5)
    assert g.on_timer(clock.now()) == GatherResult("timeout")


def test_input_during_the_prompt_counts() -> None:
    clock = VirtualClock()
    g = GatherState(now=clock.now(), timeout_s=5, awaiting_prompt=True, max_digits=3)
    assert not g.input_started
    g.on_event(DtmfEvent(digit="9"), clock.now())
    assert g.input_started
    deadline = g.deadline()
    clock.advance(1)
    g.prompt_finished(clock.now())  # keys already pressed: the digit timeout stays
    assert g.deadline() == deadline


def test_what_a_gather_takes() -> None:
    speech_only = GatherState(now=0, timeout_s=1, dtmf=False)
    assert not speech_only.wants(DtmfEvent(digit="1"))
    assert speech_only.wants(TurnUserStarted())
    assert speech_only.on_event(DtmfEvent(digit="1"), 0) is None
    keys_only = GatherState(now=0, timeout_s=1, speech=False)
    assert keys_only.wants(DtmfEvent(digit="1"))
    assert not keys_only.wants(ended("hi"))
    assert keys_only.on_event(ended("hi"), 0) is None
    assert not keys_only.wants(OutputStarted(id="x"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0},
        {"timeout_s": 1, "speech": False, "dtmf": False},
        {"timeout_s": 1, "max_digits": 0},
        {"timeout_s": 1, "terminators": "x"},
        {"timeout_s": 1, "digit_timeout_s": 0},
    ],
)
def test_impossible_gathers_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GatherState(now=0, **kwargs)  # type: ignore[arg-type]
