"""The carrier leg: what a call needs from the carrier that brought it.

The engine (``calls/call.py``) is carrier-agnostic: Twilio Media Streams today, SIP/RTP next. A
carrier implements :class:`CarrierLeg` and reports what happens on its side through
:class:`CarrierEvents`, which the call implements.
"""

from __future__ import annotations

from typing import Protocol

from appbridge.media.codecs import AudioFormat


class CarrierEvents(Protocol):
    def on_carrier_audio(self, payload: bytes) -> None:
        """20 ms (or so) of the caller's audio in ``CarrierLeg.audio_format``."""
        ...

    def on_carrier_dtmf(self, digit: str) -> None: ...

    def on_carrier_hangup(self) -> None:
        """The remote party ended the call (INTERFACES §6: reason ``caller_hangup``)."""
        ...


class CarrierLeg(Protocol):
    carrier: str  # "twilio" or "sip"
    audio_format: AudioFormat  # what the leg carries both ways

    def attach(self, events: CarrierEvents) -> None: ...

    def send_frame(self, frame: bytes) -> None:
        """One 20 ms output frame, on the media clock's tick. Never blocks."""
        ...

    def frames_wanted(self, playing: bool) -> int:
        """How many frames to pull this tick: 1, or more to rebuild the leg's small lead."""
        ...

    def clear_output(self) -> None:
        """Drop audio already handed over but not yet played (Twilio ``clear``)."""
        ...

    def send_dtmf(self, digits: str) -> bool:
        """Signal keypresses out of band (RFC 4733 on SIP). False: the carrier cannot, and the
        engine plays in-band tones through the output queue instead (Twilio streams)."""
        ...

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        """Hand the caller to ``target``; raise :class:`TransferError` when that fails."""
        ...

    async def hangup(self) -> None:
        """End the call on the carrier side. Safe to call twice."""
        ...

    async def close(self) -> None:
        """Let go of the carrier's media without ending the call (after a transfer)."""
        ...


class TransferError(Exception):
    """``code`` is the seed's error code: ``transfer_failed`` or ``feature_not_supported``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
