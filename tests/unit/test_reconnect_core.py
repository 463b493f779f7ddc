"""``session.update`` in the call core (docs/protocol-session-v1.md, "Reconnecting").

Reconnecting is off until the app asks; ``false`` turns it off; ``hangup``, ``transfer`` and
``handoff`` (the app's last word, refused or not) turn it off for the rest of the session; it is
allowed on hold; a handoff's new app starts with it off.
"""

from __future__ import annotations

from tests.unit.test_call_core import errors, new_core, send


def test_off_until_asked_then_on_and_off() -> None:
    core, _ = new_core()
    assert not core.reconnect
    assert send(core, type="session.update", reconnect=True) == []
    assert core.reconnect
    send(core, type="session.update", reconnect=False)
    assert not core.reconnect


def test_a_bad_session_update_is_bad_message() -> None:
    core, _ = new_core()
    assert errors(send(core, type="session.update")) == [("bad_message", "session.update")]
    assert errors(send(core, type="session.update", reconnect="yes", id="u1")) == [
        ("bad_message", "u1")
    ]
    assert not core.reconnect


def test_allowed_on_hold() -> None:
    core, _ = new_core()
    send(core, type="hold")
    assert core.control.on_hold
    assert send(core, type="session.update", reconnect=True) == []
    assert core.reconnect


def test_the_last_word_turns_it_off_for_the_session() -> None:
    for last in (
        {"type": "hangup"},
        {"type": "transfer", "to": "not a number", "id": "t"},  # refused, still the last word
        {"type": "handoff", "app": "nowhere"},
    ):
        core, _ = new_core()
        send(core, type="session.update", reconnect=True)
        send(core, **last)
        assert not core.reconnect
        send(core, type="session.update", reconnect=True)
        assert not core.reconnect, last


def test_a_handoff_starts_the_new_app_with_it_off() -> None:
    core, _ = new_core()
    send(core, type="session.update", reconnect=True)
    send(core, type="handoff", app="other")
    core.reset_listening()
    assert not core.reconnect
    send(core, type="session.update", reconnect=True)
    assert core.reconnect
