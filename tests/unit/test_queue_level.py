"""The queue-level rules (docs/protocol-session-v1.md, "Queue level") in virtual time.

``apps/timers.QueueLevel`` decides when to report: a change of 200 ms or more since the last
report, or the queue becoming 0, at most every 100 ms. The core (``calls/core.py``) reports
only after ``subscribe`` with ``output.queue``, counting synthesised audio and the leg's lead.
"""

from __future__ import annotations

import itertools

from appbridge.apps.timers import QueueLevel
from appbridge.calls import effects as fx
from appbridge.protocol import session_v1 as sv1
from tests.unit.test_call_core import FRAME, events, new_core, send


def run(level: QueueLevel, samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    for now, queued in samples:
        reported = level.observe(now, queued)
        if reported is not None:
            out.append((now, reported))
    return out


def test_a_change_under_200_ms_is_not_reported() -> None:
    assert run(QueueLevel(), [(0.0, 0), (0.1, 199), (0.5, 150)]) == []


def test_a_change_of_200_ms_is_reported_and_becomes_the_reference() -> None:
    level = QueueLevel()
    assert run(level, [(0.0, 200), (0.2, 300), (0.4, 399), (0.6, 400), (0.8, 201)]) == [
        (0.0, 200),
        (0.6, 400),
    ]
    assert level.observe(1.0, 200) == 200  # 200 ms down from 400


def test_reports_are_at_least_100_ms_apart() -> None:
    samples = [(t / 100, 1000 + 300 * t) for t in range(0, 30, 2)]  # +300 ms every 20 ms
    reports = run(QueueLevel(), samples)
    assert [round(t, 2) for t, _ in reports] == [0.0, 0.1, 0.2]
    assert all(b[0] - a[0] >= 0.1 - 1e-9 for a, b in itertools.pairwise(reports))


def test_becoming_0_is_reported_even_when_the_change_is_small() -> None:
    level = QueueLevel()
    assert run(level, [(0.0, 250), (0.2, 150), (0.4, 0), (0.6, 0)]) == [(0.0, 250), (0.4, 0)]


def test_becoming_0_too_soon_waits_for_the_100_ms() -> None:
    level = QueueLevel()
    assert run(level, [(0.0, 300), (0.04, 0), (0.08, 0), (0.12, 0)]) == [(0.0, 300), (0.12, 0)]


def test_nothing_is_reported_while_nothing_is_queued() -> None:
    assert run(QueueLevel(), [(t / 50, 0) for t in range(20)]) == []


# --- through the core ------------------------------------------------------------------------


def levels(effects: list[fx.Effect]) -> list[int]:
    return [e.queued_ms for e in events(effects) if isinstance(e, sv1.OutputQueueLevel)]


def test_the_core_reports_only_after_subscribe() -> None:
    core, _ = new_core()
    assert core.queue_level is None
    assert core.on_queue_level(0.0) == []
    send(core, type="subscribe", events=["turn.estimate"])
    assert core.queue_level is None
    send(core, type="subscribe", events=["output.queue"])
    assert core.queue_level is not None


def test_the_core_counts_synthesised_audio_and_the_leg_lead() -> None:
    core, services = new_core()
    send(core, type="subscribe", events=["output.queue"])
    send(core, type="speak", id="s1", text="Hello")
    assert core.queued_ms() == 0  # nothing synthesised yet
    assert levels(core.on_queue_level(0.0)) == []
    utt = next(iter(core._utterances.values()))
    core.tts_audio(utt, b"\xff" * FRAME * 15, [])  # 300 ms synthesised so far
    assert levels(core.on_queue_level(0.1)) == [300]
    services.unplayed = 2  # 40 ms the carrier holds
    assert core.queued_ms() == 340
    core.tts_audio(utt, b"\xff" * FRAME * 10, [])
    assert levels(core.on_queue_level(0.2)) == [540]


def test_the_core_reports_0_when_the_queue_drains() -> None:
    core, _ = new_core()
    send(core, type="subscribe", events=["output.queue"])
    send(core, type="speak", id="s1", text="Hello")
    utt = next(iter(core._utterances.values()))
    core.tts_audio(utt, b"\xff" * FRAME * 20, [])
    core.tts_finished(utt)
    assert levels(core.on_queue_level(0.0)) == [400]
    queue = core.queue
    assert queue is not None
    now, reports = 0.0, []
    while not queue.is_empty:
        queue.pull_frame()
        now += 0.02
        reports += levels(core.on_queue_level(now))
    reports += levels(core.on_queue_level(now + 0.1))
    assert reports[-1] == 0 and all(r > 0 for r in reports[:-1])


def test_a_handoff_resets_the_subscription() -> None:
    core, _ = new_core()
    send(core, type="subscribe", events=["output.queue"])
    core.reset_listening()
    assert core.queue_level is None
