"""Transfers: ``transfer`` and ``transfer.complete`` (docs/protocol-session-v1.md, "Call control").

The decisions are :class:`~appbridge.calls.transfer_core.TransferCore`'s; this module is its
shell, one :class:`TransferFlow` per transfer under way (a call has at most one). The modes:

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
is checked on the media clock's ticks against the injected clock; the carrier's own timer is
only a backstop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from appbridge.calls import transfer_core as tc
from appbridge.calls.adapters import PartyEvents
from appbridge.calls.bridge import Bridge
from appbridge.calls.carrier_leg import CarrierLeg, TransferError
from appbridge.calls.transfer_core import ANSWER_TIMEOUT_S, TransferCore
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.output_queue import OutputQueue
from appbridge.media.reframe import FrameConverter
from appbridge.media.wav import MAX_WAV_SECONDS
from appbridge.protocol import session_v1 as sv1

if TYPE_CHECKING:
    from appbridge.calls.call import Call

log = logging.getLogger(__name__)

__all__ = [
    "ANSWER_TIMEOUT_S",
    "MUSIC_MAX_MS",
    "TransferFlow",
    "begin_transfer",
    "music_queue",
    "ringback_pcm16",
]

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
    """One transfer under way: carries out what its :class:`TransferCore` decides."""

    def __init__(self, call: Call, cmd: sv1.Transfer) -> None:
        self.call = call
        leg = call.leg
        self.core = TransferCore(cmd, native_cold=leg is not None and leg.native_cold_transfer)
        self.party: CarrierLeg | None = None  # the new party, once it answered
        self._dial: asyncio.Task[CarrierLeg] | None = None

    @property
    def mode(self) -> str:
        return self.core.mode

    @property
    def command_id(self) -> str | None:
        return self.core.command_id

    @property
    def caller_waiting(self) -> bool:
        return self.core.caller_waiting

    @property
    def consulting(self) -> bool:
        """A warm transfer whose new party answered: the app talks to the party."""
        return self.core.consulting

    @property
    def hands_over(self) -> bool:
        return self.core.hands_over

    @property
    def finished(self) -> bool:
        return self.core.finished

    # -- inputs, passed to the core --------------------------------------------------------------
    async def run(self) -> None:
        call = self.call
        await self._carry_out(self.core.start(call.gw.clock.now(), has_leg=call.leg is not None))

    def on_tick(self, now: float) -> None:
        self._apply(self.core.on_tick(now))

    def complete(self, command_id: str) -> tuple[sv1.ErrorCode, str] | None:
        """``transfer.complete``: join the caller and the party; an error when it cannot."""
        error, steps = self.core.complete(command_id)
        self._apply(steps)
        return error

    def on_party_hangup(self) -> None:
        self.party = None
        self._apply(self.core.party_hung_up())

    def cancel(self, reason: str) -> None:
        self._apply(self.core.cancel(reason))

    async def abandon(self) -> None:
        await self._carry_out(self.core.abandon())

    # -- carrying out the steps ------------------------------------------------------------------
    async def _carry_out(self, steps: list[tc.Step]) -> None:
        """Each step in order, awaiting those that wait on the carrier."""
        for step in steps:
            pending = _RUNNERS[type(step)](self, step)
            if pending is not None:
                await pending

    def _apply(self, steps: list[tc.Step]) -> None:
        """Each step in order; those that wait on the carrier run as tasks of the call."""
        for step in steps:
            pending = _RUNNERS[type(step)](self, step)
            if pending is not None:
                self.call.spawn(pending, f"transfer-{type(step).__name__}")

    def _hand_to_carrier(self, step: tc.HandToCarrier) -> Coroutine[Any, Any, None]:
        return self._carrier_transfer(step)

    async def _carrier_transfer(self, step: tc.HandToCarrier) -> None:
        leg = self.call.leg
        assert leg is not None
        try:
            if step.mode == "refer":
                await leg.refer(step.target, step.headers)
            else:
                await leg.transfer(step.target, "cold", step.headers, step.music)
        except TransferError as exc:
            steps = self.core.failed(exc.code, str(exc))  # type: ignore[arg-type]
        else:
            steps = self.core.carrier_done()
        await self._carry_out(steps)

    def _wait_caller(self, step: tc.WaitCaller) -> None:
        _wait(self.call, self._wait_queue(step))

    def _dial_party(self, step: tc.DialParty) -> Coroutine[Any, Any, None]:
        return self._dial_and_report(step)

    async def _dial_and_report(self, step: tc.DialParty) -> None:
        call = self.call
        leg = call.leg
        assert leg is not None
        self._dial = asyncio.ensure_future(
            leg.dial_party(
                step.target,
                caller_id=call.caller_id(),
                headers=step.headers,
                timeout_s=step.timeout_s,
            )
        )
        try:
            party = await self._dial
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.core.timed_out or (task is not None and task.cancelling()):
                raise
            steps = self.core.dial_timed_out()
        except TransferError as exc:
            steps = self.core.failed(exc.code, str(exc))  # type: ignore[arg-type]
        else:
            self.party = party
            steps = self.core.dial_answered(call_over=call.over)
        finally:
            self._dial = None
        await self._carry_out(steps)

    def _cancel_dial(self, step: tc.CancelDial) -> None:
        if self._dial is not None:
            self._dial.cancel()

    def _hang_up_party(self, step: tc.HangUpParty) -> Coroutine[Any, Any, None] | None:
        party, self.party = self.party, None
        return _hang_up(party) if party is not None else None

    def _consult(self, step: tc.Consult) -> None:
        assert self.party is not None
        _consult(self.call, self.party)
        log.info("call %s: warm transfer: %s answered", self.call.call_ref, self.core.target)

    def _join(self, step: tc.Join) -> None:
        party, self.party = self.party, None
        assert party is not None
        _join(self.call, party)

    def _end_session(self, step: tc.EndSession) -> Coroutine[Any, Any, None]:
        return self.call.end("transfer", step.command_id)

    def _stop_waiting(self, step: tc.StopWaiting) -> None:
        _stop_wait(self.call)

    def _failed(self, step: tc.Failed) -> None:
        call = self.call
        _over(call, self)
        if not call.over:
            call.send_error(step.code, step.message, step.relates_to)

    def _wait_queue(self, step: tc.WaitCaller) -> OutputQueue:
        """What the caller hears while waiting: ``music`` when given (fetched in the
        background, silence until it arrives), else ringback (cold) or silence (warm)."""
        commands = self.call.commands
        fmt = self.call.core.out_format
        assert fmt is not None
        queue = music_queue(fmt)
        if step.music:
            self.call.spawn(
                commands.fetch_music(queue, step.music, self.core.relates_to), "transfer-music"
            )
        elif step.ringback:
            queue.add_item("ringback", loop=True)
            pcm = ringback_pcm16()
            queue.append_audio(
                "ringback", Converter(AudioFormat("pcm16", _RINGBACK_RATE_HZ), fmt).convert(pcm)
            )
            queue.close_item("ringback")
        return queue


_RUNNERS: Final[dict[type, Callable[[TransferFlow, Any], Coroutine[Any, Any, None] | None]]] = {
    tc.HandToCarrier: TransferFlow._hand_to_carrier,
    tc.WaitCaller: TransferFlow._wait_caller,
    tc.DialParty: TransferFlow._dial_party,
    tc.CancelDial: TransferFlow._cancel_dial,
    tc.HangUpParty: TransferFlow._hang_up_party,
    tc.Consult: TransferFlow._consult,
    tc.Join: TransferFlow._join,
    tc.EndSession: TransferFlow._end_session,
    tc.StopWaiting: TransferFlow._stop_waiting,
    tc.Failed: TransferFlow._failed,
}


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
