"""The per-call engine: one carrier leg, one app session at a time, one output queue.

Theory of operation
-------------------
A call is born when a carrier offers it (the Twilio webhook, a SIP INVITE). ``connect_app`` dials
the routed app (docs/protocol-session-v1.md, "Connection and frames": signed, retried for 2.5 s,
then the app's fallback: another app or a message spoken by the gateway). When the carrier's media
arrives, ``attach_carrier`` opens the session: ``session.start`` goes out and the call is live.

From then on three things drive it, all on the event loop and none of them waiting on a peer:

* app frames (``on_app_text`` / ``on_app_binary``), decided by the call core
  (``calls/core.py``) and carried out by its shell (``calls/commands.py``);
* carrier events (caller audio, keypresses, the caller hanging up);
* the process-wide media clock, whose tick pulls the next 20 ms frame from the output queue (or,
  on hold, from the hold music) and hands it to the carrier leg, emitting ``output.*`` and
  ``mark`` events as items are heard.

A handoff replaces the app session and its listeners (a new ``sessionRef`` and
``session.start``) while the call and the carrier leg stay up. An app that asked to reconnect
(docs/protocol-session-v1.md, "Reconnecting") keeps its call when its link is lost: the call is
*between links* while ``calls/app_session.py`` redials, the output queue plays on, events for
the app are only counted and caller audio reaches only the ears and listeners.

A transfer (``calls/transfer.py``) may bring a second leg: during a warm transfer the new party
takes the caller's place toward the app (its audio in, the app's output out) while the caller
hears the transfer's music; a completed warm transfer, or a cold one the carrier cannot do
itself, leaves the two legs joined by a ``calls/bridge.Bridge``. The session then ends with
``transfer`` but the call lives on, in state ``bridged``, until a party hangs up.

Whatever fails in one call is caught at this class's boundaries and ends at most this call;
``end`` is the one way out: ``session.end`` to the app and its listeners, the carrier hung up
(or let go after a transfer), the registry told.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from appbridge.apps.dialects import INBOUND_TRACK, OUTBOUND_TRACK, Encoder, encoder_for
from appbridge.apps.link import AppLink, LinkTap
from appbridge.apps.listeners import ListenerSet
from appbridge.apps.timers import ReconnectSeries
from appbridge.calls.adapters import CoreAdapter
from appbridge.calls.app_session import (
    DialResult,
    connect,
    dial_with_fallbacks,
    hear_unlinked,
    lose_link,
    may_reconnect,
    session_format_for,
    session_start,
)
from appbridge.calls.bridge import Bridge
from appbridge.calls.carrier_leg import CarrierLeg
from appbridge.calls.commands import CommandShell
from appbridge.calls.core import CallCore
from appbridge.calls.description import describe
from appbridge.calls.ending import end_call
from appbridge.calls.handoff import hand_off
from appbridge.calls.listening import Ears
from appbridge.calls.state import CallState
from appbridge.calls.transfer import TransferFlow
from appbridge.config import AppConfig
from appbridge.logs import call_context
from appbridge.media.codecs import AudioFormat
from appbridge.media.output_queue import OutputQueue
from appbridge.media.reframe import FrameConverter
from appbridge.protocol import session_v1 as sv1
from appbridge.weakable import Anchor

if TYPE_CHECKING:
    from appbridge.calls.services import CallServices

log = logging.getLogger(__name__)


class Call:
    def __init__(
        self,
        gw: CallServices,
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
        # Stands for the call wherever it is held weakly (its core's services, its shell, the
        # log context of its tasks): a compiled object is never weakly referenced itself.
        self.anchor: Anchor[Call] = Anchor(self)
        self.config = gw.config  # the snapshot this call lives with (SIGHUP reloads spare it)
        self.call_ref = call_ref
        self.app = app
        self.direction = direction
        self.from_ = from_
        self.to = to
        self.carrier = carrier
        self.metadata: dict[str, Any] = metadata or {}
        self.session_ref: str | None = None
        self.end_reason: sv1.EndReason | None = None
        self.started_wall = gw.clock.wall()
        self.ended_wall: float | None = None
        self.link: AppLink | None = None
        self.listeners: ListenerSet | None = None
        self.ears: Ears | None = None
        # The ears listen in pcm16: when the session's format is that too, the app's frames serve
        # them (one conversion per frame); kept by _sync_ears and use_app, not per frame.
        self.ears_share_frames = False
        self.leg: CarrierLeg | None = None
        self.queue: OutputQueue | None = None
        self.hold_queue: OutputQueue | None = None  # music while on hold; None otherwise
        self.fallback_message: str | None = None
        self.session_format = session_format_for(app)
        self.encoder: Encoder = encoder_for(app.protocol, app.workspace_ref)
        self._session_started_at = 0.0
        self.start_frame = b""  # the encoded session.start, sent again on each reconnect
        self.between_links = False  # the app's link is lost and being redialled
        self.events_lost = 0  # events for the app while between links (events.lost)
        self.link_up_at = 0.0  # when the current link was taken (the 5 s rule)
        self.reconnect_series: ReconnectSeries | None = None
        sip = self.config.sip
        self.core = CallCore(
            call_ref,
            CoreAdapter(self),
            session_format=self.session_format,
            app_refs=frozenset(self.config.apps),
            trunk_hosts=frozenset(t.host for t in sip.trunks) if sip is not None else frozenset(),
        )
        self.lifecycle = self.core.life
        self.control = self.core.control
        self.heard = self.core.heard
        self.commands = CommandShell(self)
        self._clock_key: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.ending = False
        self.in_conv: FrameConverter | None = None
        self._out_conv: FrameConverter | None = None  # carrier → session format, for listeners
        self.transfer: TransferFlow | None = None  # the transfer under way, if any
        self.party: CarrierLeg | None = None  # a warm transfer's new party, while consulted
        self.party_in: FrameConverter | None = None  # party → caller leg format
        self.party_out: FrameConverter | None = None  # caller leg format → party
        self.bridge: Bridge | None = None  # the caller and a new party, joined
        self.ended = asyncio.Event()
        self.frames_in = 0
        self.frames_out = 0
        self.tap: LinkTap | None = None  # the console's (console/recorder.py), and its samples:
        self.last_in: bytes = b""
        self.last_out: bytes = b""

    # -- state (calls/state.py) ---------------------------------------------------------------
    @property
    def state(self) -> CallState:
        """Read only: the engine moves it (``lifecycle.move``), carriers report to it."""
        return self.lifecycle.state

    @property
    def over(self) -> bool:
        """Ending or ended: nothing new may start on this call."""
        return self.lifecycle.over

    def carrier_ringing(self) -> None:
        """An outbound callee is ringing (a late report changes nothing)."""
        self.lifecycle.ringing()

    def carrier_answered(self) -> bool:
        """An outbound callee answered. False when the call was past answering already."""
        return self.lifecycle.answered()

    def describe(self) -> dict[str, Any]:
        """The call as the REST API shows it (``calls/description.py``)."""
        return describe(self)

    # -- tasks ------------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        # Run in a context naming this call, so its log records carry callRef (appbridge/logs.py).
        task = asyncio.get_running_loop().create_task(
            coro, name=f"{self.call_ref}:{name}", context=call_context(self.anchor)
        )
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

    # -- reaching an app --------------------------------------------------------------------
    def dial_app(self, app: AppConfig) -> Coroutine[Any, Any, DialResult]:
        """Dial ``app`` and, failing that, its fallbacks (``calls/app_session.py``)."""
        return dial_with_fallbacks(self.gw, self.config, app, self.call_ref)

    def connect_app(self) -> Coroutine[Any, Any, bool]:
        """Dial the routed app. True when the call should be answered (``calls/app_session.py``)."""
        return connect(self)

    def _sync_ears(self) -> None:
        """VAD, turn detector and STT run for fonoster apps only: the Twilio dialect carries no
        turn or transcript events and the gateway never acts on caller speech by itself
        (docs/protocol-twilio.md, "Twilio-dialect apps", "Interruptions")."""
        leg = self.leg
        if leg is None:
            return
        wanted = self.app.protocol == "fonoster"
        if wanted and self.ears is None:
            self.ears = Ears(
                self,
                self.gw.stt_for(self.app.speech.voice, self.app.speech.stt),
                leg.audio_format,
                language=self.app.speech.language,
            )
            self.ears.open()
        elif not wanted and self.ears is not None:
            ears, self.ears = self.ears, None
            self.spawn(ears.close(), "ears-close")
        self.ears_share_frames = self.ears is not None and self.ears.format == self.session_format

    def use_app(self, app: AppConfig) -> None:
        self.app = app
        self._sync_ears()
        fmt = session_format_for(app)
        if fmt != self.session_format:
            self.session_format = fmt
            self.core.set_session_format(fmt)
            self._sync_ears()
            if self.leg is not None:
                self._build_converters(self.leg.audio_format)

    def _build_converters(self, carrier_fmt: AudioFormat) -> None:
        self.in_conv = FrameConverter(carrier_fmt, self.session_format)
        self._out_conv = FrameConverter(carrier_fmt, self.session_format)

    # -- the carrier's media is here -----------------------------------------------------------
    def attach_carrier(self, leg: CarrierLeg) -> None:
        self.leg = leg
        fmt = leg.audio_format
        self.queue = self.core.attach(fmt)
        self._build_converters(fmt)
        self._sync_ears()
        leg.attach(self)
        self._clock_key = self.gw.media_clock.subscribe(self._on_tick)
        decided = self.core.on_media_ready(
            app_reached=self.link is not None, fallback_message=self.fallback_message
        )
        self.commands.run(decided)

    def start_session(self, handoff: Any) -> None:
        assert self.link is not None
        self.session_ref = str(uuid.uuid4())
        self.lifecycle.move(CallState.ACTIVE)
        self._session_started_at = self.gw.clock.now()
        app = self.app
        self.encoder = encoder_for(app.protocol, app.workspace_ref)
        start = session_start(
            self.session_ref,
            self.call_ref,
            app,
            self.session_format,
            direction=self.direction,
            from_=self.from_,
            to=self.to,
            metadata=self.metadata,
            handoff=handoff,
        )
        encoded = sv1.encode_event(start)
        self.start_frame = encoded
        self.link_up_at = self._session_started_at
        self.reconnect_series = None
        self.link.tap = self.tap
        for message in self.encoder.start(start, encoded):
            self.link.send_control(message)
        self.link.attach(self)
        if app.listeners:
            self.listeners = ListenerSet(
                app.listeners,
                protocol=app.protocol,
                workspace_ref=app.workspace_ref,
                secret=self.gw.signing_secret(app),
                clock=self.gw.clock,
                ssl_context=self.gw.ssl_context,
            )
            self.listeners.start(start, encoded)

    def elapsed_ms(self) -> int:
        """Milliseconds since the session started (Twilio-dialect media timestamps)."""
        return int((self.gw.clock.now() - self._session_started_at) * 1000)

    # -- to the app (and its listeners) ------------------------------------------------------------
    def send_event(self, event: Any) -> None:
        encoded = sv1.encode_event(event)
        if self.link is not None:
            data = self.encoder.event(event, encoded)
            if data is not None:
                self.link.send_control(data)
        elif self.between_links:
            self.events_lost += 1  # never delivered late (docs/protocol-session-v1.md)
        if self.listeners is not None:
            self.listeners.send_event(event, encoded)

    def send_error(self, code: sv1.ErrorCode, message: str, relates_to: str) -> None:
        if self.encoder.protocol != "fonoster":
            log.warning("call %s: %s (%s): %s", self.call_ref, code, relates_to, message)
        self.send_event(
            sv1.ErrorEvent(code=code, message=message, fatal=False, relates_to=relates_to)
        )

    # -- app link events ----------------------------------------------------------------------
    def on_app_text(self, data: bytes) -> None:
        try:
            if self.encoder.protocol == "twilio":
                self.commands.run(self.core.on_twilio_text(data))
            else:
                self.commands.run(self.core.on_text(data))
        except Exception:
            log.exception("call %s: command failed", self.call_ref)
            self.send_error("internal", "the gateway failed to carry out this message", "unknown")

    def on_app_binary(self, data: bytes) -> None:
        if self.encoder.protocol == "twilio":
            # Twilio's dialect is text only; there is no error message to send back.
            self.gw.metrics.app_bad_messages += 1
            log.warning("call %s: binary frame from a Twilio-dialect app ignored", self.call_ref)
            return
        try:
            self.commands.run(self.core.on_audio(data))
        except Exception:
            log.exception("call %s: app audio failed", self.call_ref)

    def on_app_gone(self, reason: str) -> None:
        # Closing the socket hangs up the call (docs/protocol-session-v1.md, `session.end`),
        # unless the app asked to reconnect ("Reconnecting").
        if self.core.reconnect and may_reconnect(self):
            lose_link(self, reason)
            return
        end_reason: sv1.EndReason = (
            "app_hangup" if reason == "closed" else "timeout" if reason == "timeout" else "error"
        )
        self.spawn(self.end(end_reason, app_gone=True), "end-app-gone")

    # -- carrier events -----------------------------------------------------------------------
    def on_carrier_audio(self, payload: bytes) -> None:
        self.frames_in += 1
        self.last_in = payload
        if self.control.on_hold or self.party is not None:
            return  # on hold the app receives no caller frames at all
        transfer = self.transfer
        if transfer is not None and transfer.caller_waiting:
            return  # a transfer's caller waits on hold
        self._deliver(payload)

    def _deliver(self, payload: bytes) -> None:
        """One frame in the caller leg's format to the app, its ears and its listeners."""
        link = self.link
        if link is None or self.lifecycle.state is not CallState.ACTIVE:
            if self.between_links and self.lifecycle.state is CallState.ACTIVE:
                hear_unlinked(self, payload)
            return
        conv = self.in_conv
        assert conv is not None
        frames = conv.convert(payload)
        ears = self.ears
        if ears is not None:
            if self.ears_share_frames:
                ears.on_frames(frames)
            else:
                ears.on_carrier_frame(payload)
        encoder = self.encoder
        listeners = self.listeners
        for frame in frames:
            if encoder.audio_is_text:
                elapsed = self.elapsed_ms()
                if link.audio_room():
                    link.send_audio(encoder.audio(INBOUND_TRACK, frame, elapsed), text=True)
            else:
                elapsed = 0
                if link.audio_room():
                    link.send_audio(encoder.audio(INBOUND_TRACK, frame, 0))
            if listeners is not None:
                listeners.send_audio(INBOUND_TRACK, frame, elapsed or self.elapsed_ms())

    def on_carrier_dtmf(self, digit: str) -> None:
        self.commands.run(self.core.on_carrier_dtmf(digit))

    def on_carrier_hangup(self) -> None:
        transfer = self.transfer
        handed_over = transfer is not None and transfer.hands_over
        self.commands.run(self.core.on_carrier_hangup(handed_over=handed_over))

    # -- the media clock ------------------------------------------------------------------------
    def _on_tick(self, tick: int, now: float) -> None:
        leg, queue = self.leg, self.queue
        if leg is None or queue is None:
            return
        heard = self.heard
        if heard.holding:
            self.commands.run(self.core.on_tick(tick))  # events held for a lead, heard by now
        else:
            heard.tick = tick
        if self.core.queue_level is not None:
            self.commands.run(self.core.on_queue_level(now))
        transfer = self.transfer
        if transfer is not None:
            transfer.on_tick(now)
        listeners = self.listeners
        outbound = listeners is not None and listeners.wants_outbound
        party, hold = self.party, self.hold_queue
        if party is None:
            sent = self._feed(leg, hold if hold is not None else queue, None, outbound)
        else:
            # A warm transfer's consultation: the caller hears the transfer's music, the party
            # hears the app (with its output events and the listeners' outbound track).
            if hold is not None:
                self._feed(leg, hold, None, False)
            sent = self._feed(party, queue, self.party_out, outbound)
        if outbound and not sent:
            # Listeners of the outbound track get a continuous timeline: silence when idle.
            self._send_outbound(queue.silence_frame)

    def _feed(
        self,
        leg: CarrierLeg,
        queue: OutputQueue,
        conv: FrameConverter | None,
        outbound: bool,
    ) -> bool:
        """The frames ``leg`` wants this tick, from ``queue`` (converted when ``conv`` is set);
        the app's queue also reports its output events. True when a frame went to listeners."""
        sent = False
        app_output = queue is self.queue
        # On a leg with a lead, remember whose each frame is: a ``clear`` then knows what of
        # each item the far end never played (``media/pacing.py``, ``HeardLine``).
        heard = self.heard if app_output and leg.lead_frames else None
        for _ in range(leg.frames_wanted(not queue.is_empty)):
            frame, events = queue.pull_frame()
            if events and app_output:
                self.commands.run(self.core.on_output_events(events))
            if frame is None:
                break
            self.frames_out += 1
            self.last_out = frame
            owner: str | None = None
            if heard is not None and frame is not queue.silence_frame:
                owner = queue.head_item_id
            if conv is None:
                leg.send_frame(frame)
                if heard is not None:
                    heard.sent(owner)
            else:
                for converted in conv.convert(frame):
                    leg.send_frame(converted)
                    if heard is not None:
                        heard.sent(owner)
            if outbound:
                self._send_outbound(frame)
                sent = True
        return sent

    def _send_outbound(self, frame: bytes) -> None:
        assert self.listeners is not None and self._out_conv is not None
        for converted in self._out_conv.convert(frame):
            self.listeners.send_audio(OUTBOUND_TRACK, converted, self.elapsed_ms())

    # -- call control ---------------------------------------------------------------------------
    def start_hold(self, music: OutputQueue) -> None:
        """The caller hears ``music`` in place of the app's queue, which pauses where it is.
        What the leg already holds of the app's audio (Twilio's 40 ms lead) plays out rather
        than being dropped: it was taken from the queue, so dropping it would lose it for good,
        and its ``mark``/``output.*`` events would report audio never heard."""
        self.hold_queue = music
        if self.ears is not None:
            self.ears.pause()

    def stop_hold(self) -> None:
        self.hold_queue = None
        if self.ears is not None:
            self.ears.resume()
        if self.leg is not None:
            self.leg.clear_output()

    # -- transfers (calls/transfer.py) ----------------------------------------------------------
    def active_leg(self) -> CarrierLeg | None:
        """Where the app's output and keypresses go: a consulted party, else the caller."""
        return self.party if self.party is not None else self.leg

    def caller_id(self) -> str:
        """The number a new party sees: the gateway's own side of this call."""
        return self.to if self.direction == "inbound" else self.from_

    def on_party_audio(self, payload: bytes) -> None:
        conv = self.party_in
        if conv is None or self.control.on_hold:
            return
        for frame in conv.convert(payload):
            self._deliver(frame)

    def on_party_hangup(self) -> None:
        if self.transfer is not None and self.party is not None:
            self.transfer.on_party_hangup()

    def bridge_done(self) -> None:
        """The bridge is over: a call whose session ended already is finished now."""
        if self.lifecycle.state is CallState.BRIDGED:
            self.finish()
        # else: the session is still closing; ``end`` finishes the call when it is done

    def handoff(
        self, target_ref: str, payload: Any, command_id: str | None
    ) -> Coroutine[Any, Any, None]:
        """``handoff``, accepted by the core (``calls/handoff.py``)."""
        return hand_off(self, target_ref, payload, command_id)

    def close_session(self, reason: sv1.EndReason, command_id: str | None) -> None:
        """``session.end`` to the app and its listeners, then close them."""
        end = sv1.SessionEnd(reason=reason, id=command_id)
        link = self.link
        if link is not None:
            if self.session_ref is not None:
                data = self.encoder.event(end, sv1.encode_event(end))
                if data is not None:
                    link.send_control(data)
            self.close_link(reason)
        if self.listeners is not None:
            self.listeners.close(end if self.session_ref is not None else None)
            self.listeners = None

    def close_link(self, reason: str) -> None:
        """Close the app link, counting the audio it dropped for a slow app (``/metrics``)."""
        link = self.link
        if link is None:
            return
        self.gw.metrics.audio_dropped_to_app += link.audio_dropped_frames
        link.close(1000, reason)
        self.link = None

    # -- the one way out ------------------------------------------------------------------------
    def end(
        self,
        reason: sv1.EndReason,
        command_id: str | None = None,
        *,
        app_gone: bool = False,
        carrier_gone: bool = False,
    ) -> Coroutine[Any, Any, None]:
        """The single way out (``calls/ending.py``); await it or spawn it."""
        return end_call(self, reason, command_id, app_gone=app_gone, carrier_gone=carrier_gone)

    def leave_media_clock(self) -> None:
        if self._clock_key is not None:
            self.gw.media_clock.unsubscribe(self._clock_key)
            self._clock_key = None

    def cancel_tasks(self) -> None:
        """Cancel the call's tasks, all but the one running this."""
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    def finish(self, *, count: bool = True) -> None:
        """The call is over on every side: the record, the metrics, and ``ended``."""
        if self.ended.is_set():
            return
        reason = self.end_reason or "error"
        self.lifecycle.move(CallState.ENDED)
        self.ended_wall = self.gw.clock.wall()
        self.gw.registry.remove(self)
        if count and self.bridge is None:
            self.gw.metrics.calls_ended[reason] = self.gw.metrics.calls_ended.get(reason, 0) + 1
        self.ended.set()
        log.info("call %s ended: %s", self.call_ref, reason)
        self._let_go()

    def _let_go(self) -> None:
        """Drop the parts that point back at the call, so that an ended call forms no reference
        cycle and reference counting frees it as soon as its last task is done, not a full
        collection (media/gc_pacer.py); the registry keeps its description."""
        if self.leg is not None:
            self.gw.metrics.audio_dropped_to_carrier += self.leg.audio_dropped
        self.anchor.target = None
        self.leg = self.party = None
        self.ears = None
        self.link = None
        self.listeners = None
        self.transfer = None
        self.bridge = None
        self.queue = self.hold_queue = None
        self.in_conv = self._out_conv = self.party_in = self.party_out = None
