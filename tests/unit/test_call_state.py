"""The call's states and legal moves (appbridge/calls/state.py)."""

from __future__ import annotations

import itertools

import pytest

from appbridge.calls.state import OVER, TRANSITIONS, CallState, IllegalTransition, Lifecycle

S = CallState


def test_every_state_has_a_row_and_only_ended_is_final() -> None:
    assert set(TRANSITIONS) == set(CallState)
    finals = {state for state, targets in TRANSITIONS.items() if not targets}
    assert finals == {S.ENDED}


def test_every_state_reaches_ended() -> None:
    for start in CallState:
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert S.ENDED in seen, start


@pytest.mark.parametrize(("current", "wanted"), list(itertools.product(CallState, CallState)))
def test_a_move_is_allowed_exactly_when_the_table_lists_it(
    current: CallState, wanted: CallState
) -> None:
    life = Lifecycle("CA1", current)
    if wanted in TRANSITIONS[current]:
        life.move(wanted)
        assert life.state is wanted
    else:
        with pytest.raises(IllegalTransition) as info:
            life.move(wanted)
        assert life.state is current
        assert info.value.current is current and info.value.wanted is wanted
        assert f"call CA1: no move from {current.value} to {wanted.value}" == str(info.value)


def test_an_inbound_call_with_a_handoff_and_a_bridge() -> None:
    life = Lifecycle("CA1")
    assert life.state is S.DIALING
    for step in (S.ACTIVE, S.ACTIVE, S.ENDING, S.BRIDGED, S.ENDED):
        life.move(step)
    assert life.over


def test_an_outbound_callee_ringing_then_answering() -> None:
    life = Lifecycle("CA1")
    assert life.ringing() is True
    assert life.ringing() is False  # a repeated 180 changes nothing
    assert life.answered() is True
    assert life.state is S.ANSWERED
    assert life.ringing() is False and life.answered() is False
    life.move(S.ACTIVE)


def test_an_answer_without_ringing_and_late_reports_once_over() -> None:
    life = Lifecycle("CA1")
    assert life.answered() is True
    life.move(S.ENDING)
    assert life.ringing() is False and life.answered() is False
    assert life.state is S.ENDING


def test_over_is_ending_or_ended() -> None:
    assert {S.ENDING, S.ENDED} == OVER
    for state in CallState:
        assert Lifecycle("CA1", state).over is (state in OVER)


def test_the_state_reads_as_its_plain_value() -> None:
    assert S.BRIDGED == "bridged"
    assert [s.value for s in CallState] == [
        "dialing",
        "ringing",
        "answered",
        "active",
        "fallback",
        "ending",
        "bridged",
        "ended",
    ]
