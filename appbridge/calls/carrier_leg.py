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
        """The remote party ended the call (``session.end`` reason ``caller_hangup``)."""
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

    #: Output frames dropped because the far end read too slowly (a Twilio stream's socket
    #: backlog); 0 where sends cannot back up (RTP over UDP).
    audio_dropped: int

    #: Frames the leg keeps ahead of the far end's playout (Twilio: 2); 0 when each frame is
    #: sent on its own tick (SIP).
    lead_frames: int

    def unplayed_frames(self) -> int:
        """Frames handed over that the far end has not played yet (an estimate: one per tick).
        Output events about them wait (``media/pacing.py``, ``HeardLine``)."""
        ...

    def send_dtmf(self, digits: str) -> bool:
        """Signal keypresses out of band (RFC 4733 on SIP). False: the carrier cannot, and the
        engine plays in-band tones through the output queue instead (Twilio streams)."""
        ...

    #: True when the carrier can hand the caller to another party itself (Twilio: the call's
    #: TwiML becomes ``<Dial>``), so a cold transfer leaves the gateway's media path. False: the
    #: gateway places the new party's leg with :meth:`dial_party` and bridges the two (B2BUA).
    native_cold_transfer: bool

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        """A native cold transfer (only when :attr:`native_cold_transfer`); raise
        :class:`TransferError` when that fails."""
        ...

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> CarrierLeg:
        """Place a call to ``target`` (E.164 or a trunk's ``sip:`` URI, already checked) on
        this call's carrier and trunk, for a warm transfer or a B2BUA cold transfer.

        Returns the new party's leg once it answered, its media ready (the caller attaches it
        and feeds it frames on the media clock). ``headers`` go on the new call where the
        carrier carries headers (SIP: as header fields). Raises :class:`TransferError`
        (``transfer_failed``) on busy, no answer within ``timeout_s``, or any failure. When the
        awaiting task is cancelled, the attempt is abandoned cleanly (SIP: CANCEL, or BYE for a
        2xx that crosses it)."""
        ...

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        """RFC 3515 REFER of the remote party to ``target``; returns once the NOTIFYs report
        success (and the gateway has sent its BYE; docs/sip.md). Raises
        :class:`TransferError`: ``feature_not_supported`` where the carrier has no REFER
        (Twilio), ``transfer_failed`` when refused or failed."""
        ...

    async def hangup(self) -> None:
        """End the call on the carrier side. Safe to call twice."""
        ...

    async def close(self) -> None:
        """Let go of the carrier's media without ending the call (after a transfer)."""
        ...


class TransferError(Exception):
    """``code`` is the session protocol's error code: ``transfer_failed`` or
    ``feature_not_supported``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
