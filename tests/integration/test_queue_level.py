"""The queue level (docs/protocol-session-v1.md, "Queue level") on a real Twilio-carried call.

An app subscribed to ``output.queue`` gets reports while a long ``speak`` plays, at least 100 ms
apart, and a 0 once it was heard; an app that did not subscribe gets none.
"""

from __future__ import annotations

from tests.integration.conftest import Env
from tests.integration.test_session_protocol import SENTENCE, connect


async def test_reports_while_a_long_speak_plays_and_0_at_the_end(env: Env) -> None:
    _call, session, _ = await connect(env)
    await session.send({"type": "subscribe", "events": ["output.queue"]})
    await session.send({"type": "speak", "id": "long", "text": SENTENCE})
    await session.wait_for(lambda m: m["type"] == "output.done" and m["id"] == "long", 20)
    await session.wait_for(lambda m: m["type"] == "output.queue" and m["queuedMs"] == 0, 5)
    levels = [m["queuedMs"] for m in session.of_type("output.queue")]
    assert max(levels) >= 1000  # seconds of speech were waiting at some point
    assert len([level for level in levels if level > 0]) >= 3  # it went down as it played
    assert levels[-1] == 0
    stamps = [
        t
        for t, m in zip(session.message_times, session.messages, strict=True)
        if m["type"] == "output.queue"
    ]
    # At most every 100 ms (exact in tests/unit/test_queue_level.py; here arrival times jitter).
    assert stamps[-1] - stamps[0] >= 0.1 * (len(stamps) - 1) - 0.05


async def test_no_reports_without_subscribe(env: Env) -> None:
    _call, session, _ = await connect(env)
    await session.send({"type": "speak", "id": "s", "text": "Short."})
    await session.wait_for("output.done", timeout=15)
    assert not session.of_type("output.queue")
