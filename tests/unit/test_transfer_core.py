"""A transfer's decisions (appbridge/calls/transfer_core.py), driven directly in virtual time.

No sockets, no loop, no clock: the test plays the shell, feeding the core the transfer's start,
ticks at chosen instants and the dial's results, and reads the steps off the lists.
"""

from __future__ import annotations

import pytest

from appbridge.calls import transfer_core as tc
from appbridge.calls.transfer_core import ANSWER_TIMEOUT_S, DIAL_BACKSTOP_S, Phase, TransferCore
from appbridge.protocol import session_v1 as sv1


def _core(
    mode: str = "warm", *, native_cold: bool = False, music: str | None = None
) -> TransferCore:
    cmd = sv1.Transfer(id="t1", to="+15550001111", mode=mode, music=music)  # type: ignore[arg-type]
    return TransferCore(cmd, native_cold=native_cold)


def _kinds(steps: list[tc.Step]) -> list[type]:
    return [type(step) for step in steps]


def test_warm_dials_while_the_caller_waits_in_silence() -> None:
    core = _core("warm")
    steps = core.start(100.0, has_leg=True)
    assert steps == [
        tc.WaitCaller(ringback=False, music=None),
        tc.DialParty("+15550001111", None, ANSWER_TIMEOUT_S + DIAL_BACKSTOP_S),
    ]
    assert core.phase is Phase.DIALING and core.caller_waiting
    assert core.deadline == 100.0 + ANSWER_TIMEOUT_S


def test_cold_on_a_b2bua_leg_rings_back_then_joins_and_ends_the_session() -> None:
    core = _core("cold")
    assert core.start(0.0, has_leg=True)[0] == tc.WaitCaller(ringback=True, music=None)
    assert core.dial_answered(call_over=False) == [tc.Join(), tc.EndSession("t1")]
    assert core.phase is Phase.DONE and core.finished


def test_music_replaces_the_ringback() -> None:
    core = _core("cold", music="https://example.test/hold.wav")
    wait = core.start(0.0, has_leg=True)[0]
    assert wait == tc.WaitCaller(ringback=True, music="https://example.test/hold.wav")


@pytest.mark.parametrize(("mode", "native"), [("refer", False), ("cold", True)])
def test_the_carrier_carries_out_refer_and_its_own_cold_transfer(mode: str, native: bool) -> None:
    core = _core(mode, native_cold=native)
    assert core.hands_over
    assert _kinds(core.start(0.0, has_leg=True)) == [tc.HandToCarrier]
    assert not core.caller_waiting and core.deadline is None
    assert core.carrier_done() == [tc.EndSession("t1")]


def test_a_refused_refer_is_the_carriers_error_and_nothing_to_stop() -> None:
    core = _core("refer")
    core.start(0.0, has_leg=True)
    steps = core.failed("feature_not_supported", "no REFER here")
    assert steps == [tc.Failed("feature_not_supported", "no REFER here", "t1")]


def test_no_leg_fails_at_once() -> None:
    steps = _core().start(0.0, has_leg=False)
    assert steps == [tc.Failed("transfer_failed", "the call has no carrier leg", "t1")]


def test_the_answer_timeout_fires_on_the_tick_at_30_s_and_not_before() -> None:
    core = _core("warm")
    core.start(10.0, has_leg=True)
    assert core.on_tick(10.0 + ANSWER_TIMEOUT_S - 0.02) == []
    assert core.on_tick(10.0 + ANSWER_TIMEOUT_S) == [tc.CancelDial()]
    assert core.timed_out
    assert core.on_tick(10.0 + ANSWER_TIMEOUT_S + 1) == []  # once
    steps = core.dial_timed_out()
    assert steps == [
        tc.StopWaiting(),
        tc.Failed("transfer_failed", "+15550001111 did not answer within 30 s", "t1"),
    ]
    assert core.phase is Phase.FAILED and not core.caller_waiting


def test_an_answer_just_before_the_deadline_wins() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    assert core.dial_answered(call_over=False) == [tc.Consult()]
    assert core.on_tick(ANSWER_TIMEOUT_S + 5) == []  # the deadline went with the answer
    assert core.consulting and core.caller_waiting


def test_busy_brings_the_caller_back() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    steps = core.failed("transfer_failed", "+15550001111 is busy")
    assert steps == [tc.StopWaiting(), tc.Failed("transfer_failed", "+15550001111 is busy", "t1")]


def test_complete_joins_only_the_answered_warm_transfer_with_its_id() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    error, steps = core.complete("t1")
    assert error == ("bad_message", "transfer.complete: the new party has not answered yet")
    assert steps == []
    core.dial_answered(call_over=False)
    error, steps = core.complete("other")
    assert error is not None and "'other'" in error[1] and steps == []
    assert core.complete("t1") == (None, [tc.Join(), tc.EndSession("t1")])
    assert core.party_hung_up() == []  # after the join the party's hang-up is the bridge's


def test_complete_of_a_cold_transfer_is_a_bad_message() -> None:
    core = _core("cold")
    core.start(0.0, has_leg=True)
    error, _ = core.complete("t1")
    assert error is not None and error[0] == "bad_message"


def test_the_party_hanging_up_during_the_consultation_brings_the_caller_back() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    core.dial_answered(call_over=False)
    steps = core.party_hung_up()
    assert steps == [
        tc.StopWaiting(),
        tc.Failed("transfer_failed", "+15550001111 hung up before completion", "t1"),
    ]
    assert core.party_hung_up() == []


def test_resume_while_dialing_cancels_the_dial() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    steps = core.cancel("resume")
    assert _kinds(steps) == [tc.CancelDial, tc.StopWaiting, tc.Failed]
    assert steps[-1] == tc.Failed(
        "transfer_failed", "the warm transfer was cancelled by resume", "t1"
    )
    # The dial reports its answer after all: the party is let go, nothing else happens.
    assert core.dial_answered(call_over=False) == [tc.HangUpParty()]


def test_resume_while_consulting_lets_the_party_go() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    core.dial_answered(call_over=False)
    assert _kinds(core.cancel("resume")) == [tc.HangUpParty, tc.StopWaiting, tc.Failed]
    assert core.cancel("resume") == []


def test_the_call_ending_lets_a_consulted_party_go_and_an_answer_after_it_is_hung_up() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    core.dial_answered(call_over=False)
    assert core.abandon() == [tc.HangUpParty()]
    dialing = _core("warm")
    dialing.start(0.0, has_leg=True)
    assert dialing.abandon() == []
    assert dialing.dial_answered(call_over=True) == [tc.HangUpParty()]


def test_an_answer_when_the_call_is_over_is_hung_up() -> None:
    core = _core("cold")
    core.start(0.0, has_leg=True)
    assert core.dial_answered(call_over=True) == [tc.HangUpParty()]


def test_the_failure_path_runs_once() -> None:
    core = _core("warm")
    core.start(0.0, has_leg=True)
    assert core.failed("transfer_failed", "rejected")
    assert core.failed("transfer_failed", "rejected again") == []
