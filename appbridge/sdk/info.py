"""The call a session belongs to, as ``session.start`` described it (docs/protocol-session-v1.md,
``session.start``).

Kept apart from :class:`~appbridge.sdk.Session`'s behaviour: these are read-only facts of the
call (who called whom, the refs, the audio format, what a previous app handed over).
"""

from __future__ import annotations

from typing import Any

from appbridge.protocol import session_v1 as sv1

__all__ = ["SessionInfo"]


class SessionInfo:
    """Start data: :attr:`start` is the whole ``session.start``; the common fields are here."""

    def __init__(self, start: sv1.SessionStart) -> None:
        self.start = start

    @property
    def from_(self) -> str:
        """The caller (``from``; ``from`` is a Python keyword)."""
        return self.start.from_

    @property
    def to(self) -> str:
        return self.start.to

    @property
    def direction(self) -> sv1.Direction:
        return self.start.direction

    @property
    def metadata(self) -> dict[str, Any]:
        """The ``metadata`` of the ``POST /v1/calls`` that placed an outbound call, else {}."""
        return self.start.metadata

    @property
    def handoff_payload(self) -> Any:
        """The payload of the app that handed the call over (``handoff`` in ``session.start``;
        the name ``handoff`` is the method that hands the call on)."""
        return self.start.handoff

    @property
    def call_ref(self) -> str:
        return self.start.call_ref

    @property
    def session_ref(self) -> str:
        return self.start.session_ref

    @property
    def app_ref(self) -> str:
        return self.start.app_ref

    @property
    def audio(self) -> sv1.AudioFormat:
        """The format of caller frames and of ``send_audio``'s frames."""
        return self.start.audio

    @property
    def speech(self) -> sv1.SpeechDefaults:
        """The app's default voice and language (catalog ids)."""
        return self.start.speech
