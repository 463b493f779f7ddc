"""The small objects through which parts of a call reach it: its core, a warm transfer's party.

An ended call must form no reference cycle, so that reference counting frees it at once
(media/gc_pacer.py): the core's adapter holds the call weakly, and a party's events go with the
party when the call lets go of it (``Call._let_go``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appbridge.weakable import WeakTo

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.speech.base import TtsProvider, VoiceInfo


class CoreAdapter:
    """What the call core asks of the world (``calls/services.CoreServices``), answered from the
    call. It holds the call weakly: the call owns the core, and an ended call must form no
    reference cycle (media/gc_pacer.py)."""

    __slots__ = ("_call",)

    def __init__(self, call: Call) -> None:
        self._call = WeakTo(call.anchor)  # appbridge/weakable.py: never a weakref to the call

    def _get(self) -> Call:
        call = self._call()
        if call is None:
            raise ReferenceError("the call these services answered for is gone")
        return call

    def voice_for(
        self, voice: str | None, language: str | None
    ) -> tuple[TtsProvider, VoiceInfo, str]:
        call = self._get()
        return call.gw.catalog.voice_for(voice, language, call.app.speech)

    def check_language(self, tag: str) -> str:
        return self._get().gw.catalog.check_language(tag)

    def unplayed_frames(self) -> int:
        leg = self._get().active_leg()
        return leg.unplayed_frames() if leg is not None else 0


class PartyEvents:
    """A warm transfer's new party, reporting to the call (``calls/transfer.py``)."""

    __slots__ = ("call",)

    def __init__(self, call: Call) -> None:
        self.call = call

    def on_carrier_audio(self, payload: bytes) -> None:
        self.call.on_party_audio(payload)

    def on_carrier_dtmf(self, digit: str) -> None:
        self.call.on_carrier_dtmf(digit)  # the party's keypresses reach the app too

    def on_carrier_hangup(self) -> None:
        self.call.on_party_hangup()
