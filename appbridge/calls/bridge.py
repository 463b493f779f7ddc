"""Two carrier legs joined by the gateway (a B2BUA's media path) after a transfer.

A cold transfer on a carrier that cannot hand the caller over itself (SIP), and every completed
warm transfer, end with the caller and the new party talking through the gateway: the app's
session is over (``session.end`` with ``transfer``), but the call lives on until either party
hangs up. That is this class.

Theory of operation
-------------------
Each leg reports its audio to its :class:`_Side` (the leg's :class:`CarrierEvents`). The audio
is converted at once into the other leg's format (``FrameConverter``: exact 20 ms frames, so a
PCMU caller and a G.722 or Twilio party meet) and queued for the other leg, at most
:data:`MAX_BUFFERED_FRAMES` deep: a party that sends faster than real time loses its oldest
frames rather than building delay. On every tick of the process-wide media clock each leg gets
what is queued for it, as many frames as it asks for (``frames_wanted``; a SIP leg fills the
gaps with its own silence, a Twilio leg keeps its small lead).

Keypresses cross over out of band where the other carrier can signal them (RFC 4733 on SIP).
When one party hangs up, the other is hung up and ``on_done`` tells the call; nothing here waits
on a peer, and a failing hang-up only gets logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from appbridge.calls.carrier_leg import CarrierLeg
from appbridge.media.media_clock import Tickable
from appbridge.media.reframe import FrameConverter

log = logging.getLogger(__name__)

#: The most audio waiting for one leg (5 x 20 ms); older frames are dropped past it.
MAX_BUFFERED_FRAMES = 5


class _Side:
    """One leg of the bridge, and the carrier events it reports.

    The side, its bridge, the other side and its leg (whose events are this side) point at one
    another while the bridge runs; when it is over (:meth:`Bridge._finish`) the side lets go of
    all of them, so that no reference cycle outlives the bridge (the paced collections rely on
    that: media/gc_pacer.py),
    and whatever the leg still reports is dropped."""

    __slots__ = ("bridge", "leg", "other", "outbox", "relayed", "to_other")

    def __init__(self, bridge: Bridge, leg: CarrierLeg) -> None:
        self.bridge: Bridge | None = bridge
        self.leg: CarrierLeg | None = leg
        self.other: _Side | None = None  # set once both sides exist
        self.outbox: deque[bytes] = deque(maxlen=MAX_BUFFERED_FRAMES)  # audio for this leg
        self.to_other: FrameConverter | None = None
        self.relayed = 0

    def release(self) -> None:
        self.bridge = self.leg = self.other = self.to_other = None
        self.outbox.clear()

    # -- CarrierEvents ---------------------------------------------------------------------------
    def on_carrier_audio(self, payload: bytes) -> None:
        conv, other = self.to_other, self.other
        if conv is None or other is None:
            return
        outbox = other.outbox
        for frame in conv.convert(payload):
            outbox.append(frame)
        self.relayed += 1

    def on_carrier_dtmf(self, digit: str) -> None:
        other = self.other
        if other is not None and other.leg is not None and not other.leg.send_dtmf(digit):
            log.debug("bridge: keypress %s not relayed in band", digit)

    def on_carrier_hangup(self) -> None:
        bridge = self.bridge
        if bridge is not None:
            bridge.party_hung_up(self)


class Bridge:
    """The media path between two answered legs (module doc)."""

    def __init__(
        self,
        name: str,
        a: CarrierLeg,
        b: CarrierLeg,
        *,
        subscribe: Callable[[Tickable], int],
        unsubscribe: Callable[[int], None],
        on_done: Callable[[], None],
    ) -> None:
        self.name = name
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._on_done = on_done
        self._legs = (a, b)
        self.a = _Side(self, a)
        self.b = _Side(self, b)
        self.a.other, self.b.other = self.b, self.a
        self.a.to_other = FrameConverter(a.audio_format, b.audio_format)
        self.b.to_other = FrameConverter(b.audio_format, a.audio_format)
        self._clock_key: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.done = False

    @property
    def frames_relayed(self) -> int:
        return self.a.relayed + self.b.relayed

    def start(self) -> None:
        """Both legs report to the bridge from now on, and get fed on every tick."""
        a, b = self._legs
        a.attach(self.a)
        b.attach(self.b)
        self._clock_key = self._subscribe(self._on_tick)

    def _on_tick(self, tick: int, now: float) -> None:
        for side in (self.a, self.b):
            leg, outbox = side.leg, side.outbox
            if leg is None:
                continue
            for _ in range(leg.frames_wanted(bool(outbox))):
                if not outbox:
                    break
                leg.send_frame(outbox.popleft())

    # -- the end -------------------------------------------------------------------------------
    def party_hung_up(self, side: _Side) -> None:
        """One party hung up: the other one is hung up too (docs/protocol-session-v1.md,
        ``transfer``: either party hanging up ends a bridged call)."""
        if self.done:
            return
        a, b = self._legs
        other_leg = b if side is self.a else a
        self._finish()
        self._spawn(self._hang_up(other_leg))

    async def hangup(self) -> None:
        """End both legs (``DELETE /v1/calls/{callRef}``, a drain running out)."""
        if self.done:
            return
        self._finish()
        await asyncio.gather(*(self._hang_up(leg) for leg in self._legs))

    def _finish(self) -> None:
        self.done = True
        if self._clock_key is not None:
            self._unsubscribe(self._clock_key)
            self._clock_key = None
        self.a.release()
        self.b.release()
        self._on_done()

    async def _hang_up(self, leg: CarrierLeg) -> None:
        try:
            await leg.hangup()
        except Exception:
            log.exception("bridge %s: hanging up a %s leg failed", self.name, leg.carrier)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:bridge-hangup")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
