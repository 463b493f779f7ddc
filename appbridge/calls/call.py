"""The per-call engine: one carrier leg, one app session, one output queue.

Theory of operation
-------------------
A call is born when a carrier offers it (the Twilio webhook, a SIP INVITE). ``connect_app`` dials
the routed app (seed 004: signed, retried for 2.5 s, then the app's fallback: another app or a
message spoken by the gateway). When the carrier's media arrives, ``attach_carrier`` opens the
session: ``session.start`` goes out and the call is live.

From then on three things drive it, all on the event loop and none of them waiting on a peer:

* app frames (``on_app_text`` / ``on_app_binary``), handled by ``commands.CommandHandler``;
* carrier events (caller audio, keypresses, the caller hanging up);
* the process-wide media clock, whose tick pulls the next 20 ms frame from the output queue and
  hands it to the carrier leg, emitting ``output.*`` and ``mark`` events as items are heard.

Everything that can fail in one call is caught at this class's boundaries (one exception ends at
most this call, never another), and ``end`` is the single way out: ``session.end`` to the app,
the carrier hung up, the registry told.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from appbridge.apps.link import AppLink, AppUnreachable, dial
from appbridge.calls.commands import CommandHandler
from appbridge.carriers.base import CarrierLeg
from appbridge.config import AppConfig
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.output_queue import OutputQueue
from appbridge.protocol import session_v1 as sv1

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

log = logging.getLogger(__name__)

INBOUND_TRACK = 1
OUTBOUND_TRACK = 2
MAX_FALLBACK_HOPS = 4


class Call:
    def __init__(
        self,
        gw: Gateway,
        *,
        call_ref: str,
        app: AppConfig,
        direction: sv1.Direction,
        from_: str,
        to: str,
        carrier: str,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.gw = gw
        self.config = gw.config  # the snapshot this call lives with (SIGHUP reloads spare it)
        self.call_ref = call_ref
        self.app = app
        self.direction = direction
        self.from_ = from_
        self.to = to
        self.carrier = carrier
        self.metadata: dict[str, Any] = metadata or {}
        self.session_ref: str | None = None
        self.state = "dialing"
        self.end_reason: sv1.EndReason | None = None
        self.started_wall = gw.clock.wall()
        self.ended_wall: float | None = None
        self.link: AppLink | None = None
        self.leg: CarrierLeg | None = None
        self.queue: OutputQueue | None = None
        self.fallback_message: str | None = None
        self.session_format = AudioFormat(app.audio.codec, app.audio.rate)
        self.commands = CommandHandler(self)
        self._clock_key: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ending = False
        self._in_conv: Converter | None = None
        self._in_frame_bytes = 0
        self._in_pending = bytearray()
        self._track_prefix = bytes([INBOUND_TRACK])
        self.ended = asyncio.Event()
        self.frames_in = 0
        self.frames_out = 0

    # -- description (REST API) -------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "callRef": self.call_ref,
            "sessionRef": self.session_ref,
            "app": self.app.ref,
            "direction": self.direction,
            "from": self.from_,
            "to": self.to,
            "carrier": self.carrier,
            "started": _iso(self.started_wall),
            "ended": _iso(self.ended_wall) if self.ended_wall else None,
            "state": self.state,
            "endReason": self.end_reason,
        }

    # -- tasks ------------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.call_ref}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("call %s: task %s failed", self.call_ref, task.get_name(), exc_info=exc)
            self.spawn(self.end("error"), "end-after-failure")

    # -- phase 1: reach the app -------------------------------------------------------------
    async def connect_app(self) -> bool:
        """Dial the app, following fallbacks. True when the call should be answered."""
        app: AppConfig | None = self.app
        hops = 0
        while app is not None:
            try:
                link = await dial(
                    app.url,
                    secret=app.signing_secret,
                    clock=self.gw.clock,
                    ssl_context=self.gw.ssl_context,
                )
            except AppUnreachable as exc:
                log.warning("call %s: app %s unreachable: %s", self.call_ref, app.ref, exc)
                self.gw.metrics.app_unreachable += 1
                fallback = app.fallback
                hops += 1
                if fallback is not None and fallback.message:
                    self.fallback_message = fallback.message
                    return True
                if fallback is not None and fallback.app and hops < MAX_FALLBACK_HOPS:
                    app = self.config.apps.get(fallback.app)
                    continue
                return False
            if self._ending:
                link.close(1001, "call ended")
                return False
            self.link = link
            if app is not self.app:
                self.app = app
                self.session_format = AudioFormat(app.audio.codec, app.audio.rate)
            return True
        return False

    # -- phase 2: the carrier's media is here -------------------------------------------------
    def attach_carrier(self, leg: CarrierLeg) -> None:
        self.leg = leg
        fmt = leg.audio_format
        self.queue = OutputQueue(fmt.frame_bytes(20), fmt.silence(20))
        self.commands.on_queue_ready(self.queue, fmt)
        self._in_conv = Converter(fmt, self.session_format)
        self._in_frame_bytes = self.session_format.frame_bytes(20)
        leg.attach(self)
        self._clock_key = self.gw.media_clock.subscribe(self._on_tick)
        if self.link is not None:
            self._start_session()
        elif self.fallback_message is not None:
            self.state = "fallback"
            self.commands.speak_fallback(self.fallback_message)
        else:
            self.spawn(self.end("error"), "end-no-app")

    def _start_session(self) -> None:
        assert self.link is not None
        self.session_ref = str(uuid.uuid4())
        self.state = "active"
        fmt = self.session_format
        codec = cast(sv1.Codec, fmt.codec)
        rate = cast(sv1.RateHz, fmt.rate_hz)
        start = sv1.SessionStart(
            session_ref=self.session_ref,
            call_ref=self.call_ref,
            app_ref=self.app.ref,
            direction=self.direction,
            from_=self.from_,
            to=self.to,
            metadata=self.metadata,
            handoff=None,
            audio=sv1.AudioFormat(codec=codec, rate=rate),
            tracks=[
                sv1.Track(id=INBOUND_TRACK, side="inbound", kind="audio", codec=codec),
                sv1.Track(id=OUTBOUND_TRACK, side="outbound", kind="audio", codec=codec),
            ],
            speech=sv1.SpeechDefaults(
                voice=self.app.speech.voice, language=self.app.speech.language
            ),
        )
        self.send_event(start)
        self.link.attach(self)

    # -- to the app ---------------------------------------------------------------------------
    def send_event(self, event: Any) -> None:
        if self.link is not None:
            self.link.send_control(sv1.encode_event(event))

    def send_error(self, code: sv1.ErrorCode, message: str, relates_to: str) -> None:
        if self.link is not None:
            self.link.send_control(sv1.error_event(code, message, relates_to))

    # -- app link events ----------------------------------------------------------------------
    def on_app_text(self, data: bytes) -> None:
        try:
            self.commands.on_text(data)
        except Exception:
            log.exception("call %s: command failed", self.call_ref)
            self.send_error("internal", "the gateway failed to carry out this message", "unknown")

    def on_app_binary(self, data: bytes) -> None:
        try:
            self.commands.on_audio(data)
        except Exception:
            log.exception("call %s: app audio failed", self.call_ref)

    def on_app_gone(self, reason: str) -> None:
        # Seed 004: "Closing the socket yourself hangs up the call."
        end_reason: sv1.EndReason = (
            "app_hangup" if reason == "closed" else "timeout" if reason == "timeout" else "error"
        )
        self.spawn(self.end(end_reason, app_gone=True), "end-app-gone")

    # -- carrier events -----------------------------------------------------------------------
    def on_carrier_audio(self, payload: bytes) -> None:
        self.frames_in += 1
        link = self.link
        if link is None or self.state != "active" or self.commands.on_hold:
            return
        conv = self._in_conv
        assert conv is not None
        data = conv.convert(payload)
        size = self._in_frame_bytes
        pending = self._in_pending
        if not pending and len(data) == size:  # the steady state: one carrier frame, one app frame
            link.send_audio(self._track_prefix + data)
            return
        # Resamplers start a sample short and carriers may send odd sizes: reframe to exact 20 ms.
        pending += data
        while len(pending) >= size:
            link.send_audio(self._track_prefix + bytes(pending[:size]))
            del pending[:size]

    def on_carrier_dtmf(self, digit: str) -> None:
        if self.state == "active":
            self.send_event(sv1.DtmfEvent(digit=digit))

    def on_carrier_hangup(self) -> None:
        self.spawn(self.end("caller_hangup", carrier_gone=True), "end-caller-hangup")

    # -- the media clock ------------------------------------------------------------------------
    def _on_tick(self, tick: int) -> None:
        queue = self.queue
        leg = self.leg
        if queue is None or leg is None:
            return
        for _ in range(leg.frames_wanted(not queue.is_empty)):
            frame, events = queue.pull_frame()
            if events:
                self.commands.on_output_events(events)
            if frame is None:
                break
            self.frames_out += 1
            leg.send_frame(frame)

    # -- the one way out ------------------------------------------------------------------------
    async def end(
        self,
        reason: sv1.EndReason,
        command_id: str | None = None,
        *,
        app_gone: bool = False,
        carrier_gone: bool = False,
    ) -> None:
        if self._ending:
            return
        self._ending = True
        self.end_reason = reason
        self.state = "ending"
        if self._clock_key is not None:
            self.gw.media_clock.unsubscribe(self._clock_key)
            self._clock_key = None
        self.commands.shutdown()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        link = self.link
        if link is not None:
            if not app_gone and self.session_ref is not None:
                link.send_control(sv1.encode_event(sv1.SessionEnd(reason=reason, id=command_id)))
            link.close(1000, reason)
        if self.leg is not None and not carrier_gone:
            try:
                await self.leg.hangup()
            except Exception:
                log.exception("call %s: carrier hang-up failed", self.call_ref)
        self.state = "ended"
        self.ended_wall = self.gw.clock.wall()
        self.gw.registry.remove(self)
        self.gw.metrics.calls_ended[reason] = self.gw.metrics.calls_ended.get(reason, 0) + 1
        self.ended.set()
        log.info("call %s ended: %s", self.call_ref, reason)


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))
