"""Transfers: ``transfer`` and ``transfer.complete`` (docs/protocol-session-v1.md, "Call control").

One :class:`TransferFlow` per transfer under way (a call has at most one). The modes:

``cold``
    On a carrier that hands calls over itself (Twilio: the call's TwiML becomes ``<Dial>``) the
    carrier does it and the session ends with ``transfer`` once the carrier lets go. Elsewhere
    (SIP) the gateway is the B2BUA: it dials the new party on the call's own trunk while the
    caller hears ``music`` (looped) or a ringback tone, and once the party answers it joins the
    two legs (``calls/bridge.py``) and ends the session with ``transfer``.
``warm``
    The caller waits on hold, hearing ``music`` or silence, while the gateway dials the new party.
    When the party answers, the app talks to it: the app's output plays to the party, and the
    party's audio reaches the app (its inbound track, the turn detector, the listeners) in the
    caller's place. ``transfer.complete`` joins the caller and the party and ends the session
    with ``transfer``. The caller is back with the app, with ``error transfer_failed``, when the
    party does not answer within :data:`ANSWER_TIMEOUT_S`, is busy or unreachable, or hangs up
    before the transfer completes; ``resume`` cancels a warm transfer the same way.
``refer``
    A SIP REFER to the caller's side (RFC 3515); the session ends with ``transfer`` once the
    NOTIFYs report success and the gateway has sent its BYE. ``feature_not_supported`` on
    carriers without REFER (Twilio).

A failure is always ``error transfer_failed`` (or the carrier's ``feature_not_supported``) with
``relatesTo`` the command's id, and the call goes on as before the transfer. The answer timeout
is checked on the media clock's ticks against the injected clock, so it is tested in virtual
time; the carrier's own timer is only a backstop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

import numpy as np

from appbridge.calls.adapters import PartyEvents
from appbridge.calls.bridge import Bridge
from appbridge.calls.carrier_leg import CarrierLeg, TransferError
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.output_queue import OutputQueue
from appbridge.media.reframe import FrameConverter
from appbridge.media.wav import MAX_WAV_SECONDS
from appbridge.protocol import session_v1 as sv1

if TYPE_CHECKING:
    from appbridge.calls.call import Call

log = logging.getLogger(__name__)

#: The session protocol: "no answer in 30 s: ``error`` ``transfer_failed`` and the caller is back".
ANSWER_TIMEOUT_S = 30.0
#: The ringback a caller hears while a cold transfer rings (ITU-T E.180 / North American
#: practice: 440 Hz + 480 Hz, 2 s on, 4 s off).
RINGBACK_HZ = (440.0, 480.0)
RINGBACK_ON_S = 2.0
RINGBACK_OFF_S = 4.0
_RINGBACK_RATE_HZ = 8000


def ringback_pcm16(rate_hz: int = _RINGBACK_RATE_HZ) -> bytes:
    """One ringback cadence (tone then silence), 16-bit mono at ``rate_hz``, for looping."""
    n_on = int(RINGBACK_ON_S * rate_hz)
    t = np.arange(n_on, dtype=np.float64) / rate_hz
    tone = sum(np.sin(2 * np.pi * hz * t) for hz in RINGBACK_HZ) * (0.15 * 32767 / 2)
    pcm = np.zeros(n_on + int(RINGBACK_OFF_S * rate_hz), dtype=np.int16)
    pcm[:n_on] = np.asarray(tone, dtype=np.float64).astype(np.int16)
    return pcm.tobytes()


#: The longest music kept for a transfer's wait or a ``hold`` (it loops): as long as a WAV file
#: may be. It is not the app's output, so the output queue's 120 s does not apply: a hold track
#: of a few minutes is common. 10 minutes of µ-law 8 kHz is 4.8 MB, one copy shared by every
#: call that plays the track (media/music.py).
MUSIC_MAX_MS: Final = int(MAX_WAV_SECONDS * 1000)


def music_queue(out_format: AudioFormat) -> OutputQueue:
    """The queue that plays hold or transfer music (or ringback) to the caller."""
    return OutputQueue(
        out_format.frame_bytes(20), out_format.silence(20), max_queued_ms=MUSIC_MAX_MS
    )


class TransferFlow:
    """One transfer under way (module doc). Created and run by the command handler."""

    def __init__(self, call: Call, cmd: sv1.Transfer) -> None:
        self.call = call
        self.mode = cmd.mode
        self.command_id = cmd.id
        self.relates_to = cmd.id or "transfer"
        self.target = cmd.to
        self.headers = cmd.headers
        self.music = cmd.music
        self.party: CarrierLeg | None = None  # the new party, once it answered (warm)
        self.caller_waiting = False  # the caller hears music/ringback and is not heard
        self.deadline: float | None = None
        self._dial: asyncio.Task[CarrierLeg] | None = None
        self._timed_out = False
        self._over = False  # the failure path ran (it runs once)
        self.finished = False

    @property
    def consulting(self) -> bool:
        """A warm transfer whose new party answered: the app talks to the party."""
        return self.party is not None and not self.finished

    # -- running -------------------------------------------------------------------------------
    async def run(self) -> None:
        leg = self.call.leg
        if leg is None:
            self._fail(TransferError("transfer_failed", "the call has no carrier leg"))
            return
        try:
            if self.mode == "refer":
                await leg.refer(self.target, self.headers)
                self.finished = True
                await self.call.end("transfer", self.command_id)
            elif self.mode == "cold" and leg.native_cold_transfer:
                await leg.transfer(self.target, "cold", self.headers, self.music)
                self.finished = True
                await self.call.end("transfer", self.command_id)
            else:
                await self._dial_party(leg)
        except TransferError as exc:
            self._fail(exc)

    async def _dial_party(self, leg: CarrierLeg) -> None:
        call = self.call
        self.caller_waiting = True
        _wait(call, self._wait_queue(ringback=self.mode == "cold"))
        self.deadline = call.gw.clock.now() + ANSWER_TIMEOUT_S
        self._dial = asyncio.ensure_future(
            leg.dial_party(
                self.target,
                caller_id=call.caller_id(),
                headers=self.headers,
                timeout_s=ANSWER_TIMEOUT_S + 5.0,  # the carrier's backstop; the tick decides
            )
        )
        try:
            party = await self._dial
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._timed_out or (task is not None and task.cancelling()):
                raise
            raise TransferError(
                "transfer_failed", f"{self.target} did not answer within {ANSWER_TIMEOUT_S:.0f} s"
            ) from None
        finally:
            self._dial = None
            self.deadline = None
        if self.finished or call.over:
            await _hang_up(party)
            return
        if self.mode == "cold":
            self.finished = True
            _join(call, party)
            await call.end("transfer", self.command_id)
            return
        self.party = party
        _consult(call, party)
        log.info("call %s: warm transfer: %s answered", call.call_ref, self.target)

    def _wait_queue(self, *, ringback: bool) -> OutputQueue:
        """What the caller hears while waiting: ``music`` when given (fetched in the
        background, silence until it arrives), else ringback (cold) or silence (warm)."""
        commands = self.call.commands
        fmt = self.call.core.out_format
        assert fmt is not None
        queue = music_queue(fmt)
        if self.music:
            self.call.spawn(
                commands.fetch_music(queue, self.music, self.relates_to), "transfer-music"
            )
        elif ringback:
            queue.add_item("ringback", loop=True)
            pcm = ringback_pcm16()
            queue.append_audio(
                "ringback", Converter(AudioFormat("pcm16", _RINGBACK_RATE_HZ), fmt).convert(pcm)
            )
            queue.close_item("ringback")
        return queue

    # -- events ----------------------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        """The answer timeout, checked on the media clock (module doc)."""
        if self.deadline is not None and now >= self.deadline and self._dial is not None:
            self.deadline = None
            self._timed_out = True
            self._dial.cancel()

    def complete(self, command_id: str) -> tuple[sv1.ErrorCode, str] | None:
        """``transfer.complete``: join the caller and the party; an error when it cannot."""
        if self.mode != "warm" or command_id != self.command_id:
            return "bad_message", f"transfer.complete: no warm transfer with id {command_id!r}"
        if self.party is None:
            return "bad_message", "transfer.complete: the new party has not answered yet"
        party, self.party = self.party, None
        self.finished = True
        call = self.call
        _join(call, party)
        call.spawn(call.end("transfer", self.command_id), "end-transfer-complete")
        return None

    def on_party_hangup(self) -> None:
        """The new party hung up during the consultation: the caller is back with the app."""
        if self.finished:
            return
        self.party = None
        self._fail(TransferError("transfer_failed", f"{self.target} hung up before completion"))

    def cancel(self, reason: str) -> None:
        """``resume`` during a warm transfer: the party is let go, the caller is back."""
        if self.finished:
            return
        if self._dial is not None:
            self._dial.cancel()
        party, self.party = self.party, None
        if party is not None:
            self.call.spawn(_hang_up(party), "transfer-cancel")
        self._fail(TransferError("transfer_failed", f"the warm transfer was cancelled by {reason}"))

    async def abandon(self) -> None:
        """The call is ending: let the party go (a dial in progress is cancelled with the
        call's tasks)."""
        self.finished = True
        party, self.party = self.party, None
        if party is not None:
            await _hang_up(party)

    @property
    def hands_over(self) -> bool:
        """The carrier takes the caller away (native cold, REFER): its hang-up is the end."""
        leg = self.call.leg
        return self.mode == "refer" or (
            self.mode == "cold" and leg is not None and leg.native_cold_transfer
        )

    def _fail(self, exc: TransferError) -> None:
        if self._over:
            return
        self._over = True
        self.finished = True
        call = self.call
        if self.caller_waiting:
            self.caller_waiting = False
            _stop_wait(call)
        _over(call, self)
        if not call.over:
            call.send_error(exc.code, str(exc), self.relates_to)  # type: ignore[arg-type]


async def _hang_up(leg: CarrierLeg) -> None:
    try:
        await leg.hangup()
    except Exception:
        log.exception("hanging up a transfer's %s leg failed", leg.carrier)


# -- what a transfer does to its call -----------------------------------------------------------
def begin_transfer(call: Call, flow: TransferFlow) -> None:
    """A transfer the core accepted starts: it replaces a hold, and runs as a task of the call."""
    if call.control.resume():
        call.stop_hold()  # the transfer's own waiting takes the place of a hold
    call.transfer = flow
    call.control.transfer_pending = flow.mode
    call.control.transfer_id = flow.command_id
    call.spawn(flow.run(), "transfer")


def _wait(call: Call, music: OutputQueue) -> None:
    """The caller waits (music or ringback), unheard, while the new party is dialed."""
    call.start_hold(music)


def _stop_wait(call: Call) -> None:
    """The caller is back with the app."""
    party = call.party
    call.party = None
    call.party_in = call.party_out = None
    if party is not None and call.queue is not None:
        party.clear_output()
    call.stop_hold()


def _consult(call: Call, party: CarrierLeg) -> None:
    """A warm transfer's party answered: it takes the caller's place toward the app."""
    leg = call.leg
    assert leg is not None
    call.party_in = FrameConverter(party.audio_format, leg.audio_format)
    call.party_out = FrameConverter(leg.audio_format, party.audio_format)
    call.party = party
    party.attach(PartyEvents(call))
    if call.ears is not None:
        call.ears.resume()  # the turn detector now hears the party


def _over(call: Call, flow: TransferFlow) -> None:
    """A transfer failed or was cancelled: the call goes on as before it."""
    if call.transfer is flow:
        call.transfer = None
        call.control.transfer_pending = None
        call.control.transfer_id = None


def _join(call: Call, party: CarrierLeg) -> None:
    """Join the caller and ``party`` (module doc); the session ends next, the call lives
    on in state ``bridged``."""
    leg = call.leg
    assert leg is not None
    call.party = None
    call.party_in = call.party_out = None
    call.hold_queue = None
    leg.clear_output()
    media_clock = call.gw.media_clock
    bridge = Bridge(
        call.call_ref,
        leg,
        party,
        subscribe=media_clock.subscribe,
        unsubscribe=media_clock.unsubscribe,
        on_done=call.bridge_done,
    )
    call.bridge = bridge
    bridge.start()
    log.info("call %s: caller and new party bridged", call.call_ref)
