"""The call core: what the app's messages do to a call, decided without I/O.

In the style of h11 and aioquic: the core is driven by what happens (an app message, app audio,
a chunk of synthesised speech, a finished fetch, the output queue's events, a media-clock tick)
and answers each with a list of effects (``calls/effects.py``) that its shell
(``calls/commands.py``) carries out. It imports no asyncio, opens no socket and reads no clock;
what it needs to know of the world it asks through :class:`CoreServices`.

It owns the call's state (``calls/state.py``), the call-control rules (``calls/control.py``:
hold gating, one handoff or transfer at a time, at most five handoffs), the output queue with its
marks and the items being synthesised or fetched, and the app's listening choices. Output events
go out once the caller heard what they report (``media/pacing.py``, ``HeardLine``: a carrier's
lead delays them, ``clear`` settles them). Items keep their place in the queue from the moment
the command arrived, even while their audio is still being made, so the queue's order is the
order of the commands (docs/protocol-session-v1.md, "Output: speech, files, audio and marks";
``preempt`` plays first and the items behind it stay queued).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from appbridge.apps.timers import QueueLevel
from appbridge.calls import effects as fx
from appbridge.calls.control import CallControl, transfer_target_ok
from appbridge.calls.output_events import new_item_id, to_app
from appbridge.calls.services import CoreServices
from appbridge.calls.state import CallState, Lifecycle
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.dtmf import dtmf_pcm16
from appbridge.media.output_queue import (
    OutputEvent,
    OutputInterrupted,
    OutputQueue,
    QueueFull,
    WordTiming,
)
from appbridge.media.pacing import HeardLine
from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.session_v1_ext import OUTPUT_QUEUE
from appbridge.protocol.twilio_streams import (
    TwilioBadMessage,
    TwilioClear,
    TwilioMark,
    TwilioMedia,
    decode_twilio,
)
from appbridge.speech.base import SpeechError

log = logging.getLogger(__name__)

MAX_AUDIO_FRAME_BYTES: Final = 1024 * 1024
QUEUE_FULL: Final = "more than 120 s of output is queued"
#: The app's last word: each turns reconnecting off for the rest of the session
#: (docs/protocol-session-v1.md, "Reconnecting").
_LAST_WORDS: Final = frozenset({"hangup", "transfer", "handoff"})


class CallCore:
    """One call's decisions (module doc). Every public method returns the effects to carry out."""

    def __init__(
        self,
        call_ref: str,
        services: CoreServices,
        *,
        session_format: AudioFormat,
        app_refs: Collection[str],
        trunk_hosts: Collection[str],
    ) -> None:
        self.life = Lifecycle(call_ref)
        self.control = CallControl()
        self._services = services
        self._app_refs = app_refs
        self._trunk_hosts = trunk_hosts
        self.session_format = session_format
        self.queue: OutputQueue | None = None
        self.out_format: AudioFormat | None = None
        self._raw_conv: Converter | None = None
        self.heard = HeardLine()
        self._utterances: dict[str, fx.Utterance] = {}
        self._cleared_streams: set[str] = set()  # ids whose remaining pieces must be dropped
        self._marks: dict[str, tuple[str, str | None]] = {}
        self._mark_seq = 0
        self._internal_items: set[str] = set()
        self._raw_full_reported = False
        self._hold_audio_reported = False
        self.subscriptions: set[str] = set()
        self.listen_language: str | None = None
        self.listen_hints: list[str] = []
        self.patience = "normal"
        # docs/protocol-session-v1.md, "Reconnecting" and "Queue level": both off until asked.
        self.reconnect = False
        self.reconnect_barred = False
        self.queue_level: QueueLevel | None = None
        self._out: list[fx.Effect] = []

    def _take(self) -> list[fx.Effect]:
        out, self._out = self._out, []
        return out

    def _error(self, code: str, message: str, relates_to: str) -> None:
        self._out.append(fx.SendError(code, message, relates_to))

    # -- set-up ---------------------------------------------------------------------------------
    def attach(self, out_format: AudioFormat) -> OutputQueue:
        """The carrier's media is here: the output queue in the leg's format."""
        queue = OutputQueue(out_format.frame_bytes(20), out_format.silence(20))
        self.queue = queue
        self.out_format = out_format
        self.heard.frame_ms = queue.frame_ms
        self._raw_conv = Converter(self.session_format, out_format)
        return queue

    def set_session_format(self, session_format: AudioFormat) -> None:
        """A handoff brought an app with another audio format."""
        self.session_format = session_format
        if self.out_format is not None:
            self._raw_conv = Converter(session_format, self.out_format)

    def reset_output(self) -> list[fx.Effect]:
        """A handoff: the old app's output is dropped, its events go nowhere."""
        if self.queue is not None:
            self.queue.clear()
            self._out.append(fx.ClearLeg())
        self._out.extend(self.shutdown())
        self._cleared_streams.clear()
        self._marks.clear()
        return self._take()

    def reset_listening(self) -> None:
        """A handoff: ``subscribe`` and ``listen.update`` were the old app's choices."""
        self.subscriptions.clear()
        self.listen_language = None
        self.listen_hints = []
        self.patience = "normal"
        self.reconnect = self.reconnect_barred = False
        self.queue_level = None

    def shutdown(self) -> list[fx.Effect]:
        """The end, or a handoff: held events go nowhere and every utterance stops."""
        self.heard.drop()
        stops: list[fx.Effect] = [fx.StopTts(utt) for utt in self._utterances.values()]
        self._utterances.clear()
        return stops

    # -- app messages ---------------------------------------------------------------------------
    def on_text(self, data: bytes) -> list[fx.Effect]:
        """A fonoster.session.v1 text frame (docs/protocol-session-v1.md)."""
        msg = sv1.decode_command(data)
        if isinstance(msg, sv1.BadMessage):
            return [fx.SendError("bad_message", msg.message, msg.relates_to)]
        if isinstance(msg, sv1.Ignored):
            log.debug("call %s: ignoring message type %r", self.life.call_ref, msg.type)
            return []
        return self.on_command(msg)

    def on_twilio_text(self, data: bytes) -> list[fx.Effect]:
        """A Twilio-dialect app's message (docs/protocol-twilio.md): ``media``, ``mark`` and
        ``clear``; the rest is ignored, and malformed input is reported (that dialect has no
        error message)."""
        msg = decode_twilio(data, sender="app")
        if isinstance(msg, TwilioMedia):
            return self.on_audio(msg.media.payload)
        if isinstance(msg, TwilioMark):
            self._add_mark(msg.mark.name, None)
        elif isinstance(msg, TwilioClear):
            self._clear()
        elif isinstance(msg, TwilioBadMessage):
            self._out.append(fx.ReportBadMessage(msg.message))
        else:
            log.debug("call %s: ignoring %r from a Twilio-dialect app", self.life.call_ref, msg)
        return self._take()

    def on_audio(self, data: bytes) -> list[fx.Effect]:
        """App audio joins the output queue, with no ``output.*`` events
        (docs/protocol-session-v1.md, "Connection and frames")."""
        queue, conv = self.queue, self._raw_conv
        if queue is None or conv is None:
            return []
        if len(data) > MAX_AUDIO_FRAME_BYTES:
            limit = MAX_AUDIO_FRAME_BYTES
            message = f"binary frame of {len(data)} bytes is over the {limit}-byte limit"
            return [fx.SendError("bad_message", message, "audio")]
        if self.control.on_hold:
            if self._hold_audio_reported:
                return []
            self._hold_audio_reported = True
            return [
                fx.SendError("on_hold", "audio is dropped while the caller is on hold", "audio")
            ]
        try:
            queue.append_raw(conv.convert(data))
        except QueueFull:
            if self._raw_full_reported:
                return []
            self._raw_full_reported = True
            return [fx.SendError("queue_full", QUEUE_FULL, "audio")]
        self._raw_full_reported = False
        return []

    def on_command(self, cmd: sv1.AnyCommand) -> list[fx.Effect]:
        """One decoded command: refused while a rule forbids it (``CallControl.gate``), else
        carried out by its handler. ``session.update`` is allowed at any time, on hold too."""
        if type(cmd) is sv1.SessionUpdate:
            self._session_update(cmd)
            return []
        kind = str(cmd.__struct_config__.tag)
        if kind in _LAST_WORDS:
            self.reconnect = False
            self.reconnect_barred = True
        refused = self.control.gate(kind)
        if refused is not None:
            return [fx.SendError(refused[0], refused[1], cmd.id or kind)]
        _HANDLERS[type(cmd)](self, cmd)
        return self._take()

    # -- output: speech -------------------------------------------------------------------------
    def _speak(self, cmd: sv1.Speak) -> None:
        queue = self.queue
        if queue is None:
            return
        if cmd.id is not None and cmd.id in self._cleared_streams:
            # The rest of an utterance that ``clear`` dropped: never play it.
            if cmd.last:
                self._cleared_streams.discard(cmd.id)
            return
        item_id = cmd.id if cmd.id is not None else new_item_id()
        relates_to = cmd.id if cmd.id is not None else "speak"
        utt = self._utterances.get(item_id)
        if utt is None:
            if queue.has_item(item_id):
                message = f"speak: id {item_id!r} is still playing and complete"
                self._error("bad_message", message, item_id)
                return
            try:
                provider, voice, language = self._services.voice_for(cmd.voice, cmd.language)
            except SpeechError as exc:
                self._error(exc.code, str(exc), relates_to)
                return
            self._add_item(item_id, preempt=cmd.preempt)
            utt = fx.Utterance(item_id, relates_to, provider, voice, language)
            self._utterances[item_id] = utt
            self._out.append(fx.StartTts(utt))
        if cmd.last:
            utt.last_seen = True
        self._out.append(fx.SpeakText(utt, cmd.text, cmd.last))

    def on_media_ready(self, *, app_reached: bool, fallback_message: str | None) -> list[fx.Effect]:
        """The carrier's media is here: the session opens with the app that was reached, or
        the app's fallback message is spoken, or, with neither, the call ends."""
        if app_reached:
            return [fx.OpenSession()]
        if fallback_message is not None:
            return self.fall_back(fallback_message)
        return [fx.EndCall("error")]

    def fall_back(self, text: str) -> list[fx.Effect]:
        """No app could be reached (at the start, or on a handoff): the call is in ``fallback``
        and says ``text``, then hangs up."""
        self.life.move(CallState.FALLBACK)
        return self.speak_fallback(text)

    def speak_fallback(self, text: str) -> list[fx.Effect]:
        """No app could be reached: say the configured message, then hang up."""
        if self.queue is None:
            return []
        try:
            provider, voice, language = self._services.voice_for(None, None)
        except SpeechError:
            log.exception("call %s: fallback voice unavailable", self.life.call_ref)
            return [fx.EndCall("error")]
        item_id = new_item_id()
        self._internal_items.add(item_id)
        self.queue.add_item(item_id)
        utt = fx.Utterance(item_id, "speak", provider, voice, language, last_seen=True)
        self._utterances[item_id] = utt
        return [fx.StartTts(utt), fx.SpeakText(utt, text, True)]

    def item_audio_ms(self, item_id: str) -> int | None:
        return self.queue.item_audio_ms(item_id) if self.queue is not None else None

    def tts_audio(
        self, utt: fx.Utterance, audio: bytes, words: Sequence[WordTiming]
    ) -> list[fx.Effect]:
        """Synthesised audio of ``utt``, in the leg's format. ``StopTts`` when the item has left
        the queue (the rest is dropped) or the queue is full."""
        queue = self.queue
        assert queue is not None
        if words:
            queue.append_words(utt.item_id, words)
        try:
            if not queue.append_audio(utt.item_id, audio):
                return [fx.StopTts(utt)]  # cleared or preempted
        except QueueFull:
            self._fail_item(utt.item_id, "queue_full", QUEUE_FULL, utt.relates_to)
            self._out.append(fx.StopTts(utt))
        return self._take()

    def tts_finished(self, utt: fx.Utterance) -> list[fx.Effect]:
        """Every piece of ``utt`` is synthesised: the item is complete."""
        assert self.queue is not None
        self._emit(self.queue.close_item(utt.item_id))
        return self._take()

    def tts_failed(self, utt: fx.Utterance, code: str, message: str) -> list[fx.Effect]:
        self._fail_item(utt.item_id, code, message, utt.relates_to)
        return self._take()

    def tts_over(self, utt: fx.Utterance) -> None:
        """The synthesis of ``utt`` is over, however it ended."""
        if self._utterances.get(utt.item_id) is utt:
            del self._utterances[utt.item_id]

    # -- output: files ------------------------------------------------------------------------
    def _play(self, cmd: sv1.Play) -> None:
        queue = self.queue
        if queue is None:
            return
        item_id = cmd.id if cmd.id is not None else new_item_id()
        if queue.has_item(item_id):
            self._error("bad_message", f"play: id {item_id!r} is in use", item_id)
            return
        self._add_item(item_id, loop=cmd.loop, preempt=cmd.preempt)
        relates_to = cmd.id if cmd.id is not None else "play"
        self._out.append(fx.FetchAudio(item_id, cmd.url, relates_to))

    def fetched(self, item_id: str, audio: bytes, relates_to: str) -> list[fx.Effect]:
        """A ``play`` file's audio, in the leg's format."""
        queue = self.queue
        assert queue is not None
        try:
            if queue.append_audio(item_id, audio):
                self._emit(queue.close_item(item_id))
        except QueueFull:
            self._fail_item(item_id, "queue_full", QUEUE_FULL, relates_to)
        return self._take()

    def fetch_failed(self, item_id: str, message: str, relates_to: str) -> list[fx.Effect]:
        self._fail_item(item_id, "play_fetch_failed", message, relates_to)
        return self._take()

    def _fail_item(self, item_id: str, code: str, message: str, relates_to: str) -> None:
        queue = self.queue
        if queue is not None and queue.has_item(item_id):
            self._emit(queue.discard_item(item_id))
        if item_id not in self._internal_items:
            self._error(code, message, relates_to)
        elif self.life.state is CallState.FALLBACK:
            self._out.append(fx.EndCall("error"))

    # -- output: marks, clear, preempt, keypresses ----------------------------------------------
    def _mark(self, cmd: sv1.MarkCommand) -> None:
        self._add_mark(cmd.name, cmd.id)

    def _add_mark(self, name: str, command_id: str | None) -> None:
        queue = self.queue
        if queue is None:
            return
        self._mark_seq += 1
        key = f"m{self._mark_seq}"
        self._marks[key] = (name, command_id)
        self._emit(queue.add_mark(key))

    def _clear_command(self, cmd: sv1.Clear) -> None:
        self._clear()

    def _clear(self) -> None:
        """``clear``: empty the queue; the caller hears silence within 40 ms
        (docs/protocol-session-v1.md, ``clear``). What the far end has not played yet goes
        with the queue: not heard."""
        queue = self.queue
        if queue is None:
            return
        heard = self.heard
        unheard = heard.unheard_by_item(self._services.unplayed_frames())
        events = queue.clear(unheard)
        self._out.append(fx.ClearLeg())
        settled = heard.settle_on_clear(unheard)
        if settled:
            events = settled + events
        for item_id in list(self._utterances):
            self._end_stream(item_id)
        self._send(events)

    def _add_item(self, item_id: str, *, loop: bool = False, preempt: bool = False) -> None:
        """Queue an item; a ``preempt`` that cuts off a ``speak`` still being streamed ends that
        stream as ``clear`` would: its remaining pieces are dropped, not played later as a new
        item under the same id."""
        assert self.queue is not None
        events = self.queue.add_item(item_id, loop=loop, preempt=preempt)
        for ev in events:
            if isinstance(ev, OutputInterrupted):
                self._end_stream(ev.item_id)
        self._emit(events)

    def _end_stream(self, item_id: str) -> None:
        """The item left the queue unfinished: stop synthesising it, and drop the pieces of it
        still to come (docs/protocol-session-v1.md, ``speak`` with ``last: false``)."""
        utt = self._utterances.pop(item_id, None)
        if utt is None:
            return
        if not utt.last_seen:
            self._cleared_streams.add(item_id)
        self._out.append(fx.StopTts(utt))

    def _dtmf_send(self, cmd: sv1.DtmfSend) -> None:
        """Keypresses: out of band where the carrier can, else tones in the output queue."""
        if self.queue is not None:
            self._out.append(fx.SendDtmf(cmd.digits, cmd.id or "dtmf.send"))

    def queue_tones(self, digits: str, relates_to: str) -> list[fx.Effect]:
        """The carrier cannot signal keypresses: in-band tones take their place in the queue."""
        queue, out_format = self.queue, self.out_format
        assert queue is not None and out_format is not None
        pcm = dtmf_pcm16(digits, 8000)
        audio = Converter(AudioFormat("pcm16", 8000), out_format).convert(pcm)
        item_id = new_item_id()
        self._internal_items.add(item_id)
        self._emit(queue.add_item(item_id))
        try:
            queue.append_audio(item_id, audio)
        except QueueFull:
            self._emit(queue.discard_item(item_id))  # internal: the command's error says it
            self._error("queue_full", QUEUE_FULL, relates_to)
            return self._take()
        self._emit(queue.close_item(item_id))
        return self._take()

    # -- call control ---------------------------------------------------------------------------
    def _hangup(self, cmd: sv1.Hangup) -> None:
        self._out.append(fx.EndCall("app_hangup", cmd.id))

    def _hold(self, cmd: sv1.Hold) -> None:
        """The caller hears ``music`` (looped) or silence; the app's queue waits untouched."""
        if self.out_format is not None and self.control.hold():
            self._out.append(fx.StartHold(cmd.music, cmd.id))

    def _resume(self, cmd: sv1.Resume) -> None:
        if self.control.transfer_pending == "warm":
            self._out.append(fx.CancelTransfer())
        elif self.control.resume():
            self._hold_audio_reported = False
            self._out.append(fx.StopHold())

    def _handoff(self, cmd: sv1.Handoff) -> None:
        """``handoff`` (docs/protocol-session-v1.md, "Call control"): a known app, within the
        limits; the shell dials it and reports back with :meth:`handoff_over`."""
        relates_to = cmd.id or "handoff"
        if cmd.app not in self._app_refs:
            self._error("bad_message", f"handoff: unknown app {cmd.app!r}", relates_to)
            return
        limit = self.control.begin_handoff()
        if limit is not None:
            self._error("bad_message", f"handoff: {limit}", relates_to)
            return
        self._out.append(fx.StartHandoff(cmd.app, cmd.payload, cmd.id))

    def handoff_over(self, succeeded: bool) -> None:
        self.control.end_handoff(succeeded)

    def _transfer(self, cmd: sv1.Transfer) -> None:
        """``transfer`` (docs/protocol-session-v1.md, "Call control"): its id and target are
        checked here; ``calls/transfer.py`` carries it out."""
        if self.queue is None:
            return
        if cmd.mode == "warm" and cmd.id is None:
            # transfer.complete names the warm transfer by this id: without one the caller
            # would wait on hold with no way to be connected.
            message = "transfer: a warm transfer needs an id (transfer.complete names it)"
            self._error("bad_message", message, "transfer")
            return
        if not transfer_target_ok(cmd.to, self._trunk_hosts):
            message = (
                f"transfer: {cmd.to!r} is neither an E.164 number "
                "nor a sip: URI of a configured trunk"
            )
            self._error("transfer_failed", message, cmd.id or "transfer")
            return
        self._out.append(fx.StartTransfer(cmd))

    def _transfer_complete(self, cmd: sv1.TransferComplete) -> None:
        if self.control.transfer_pending is None:
            message = "transfer.complete: no warm transfer is under way"
            self._error("bad_message", message, cmd.id)
            return
        self._out.append(fx.CompleteTransfer(cmd.id))

    # -- reconnecting and the queue level ---------------------------------------------------------
    def _session_update(self, cmd: sv1.SessionUpdate) -> None:
        """docs/protocol-session-v1.md, "Reconnecting": on or off, unless the app's last word
        (``hangup``, ``transfer``, ``handoff``) already turned it off for this session."""
        if not self.reconnect_barred:
            self.reconnect = cmd.reconnect

    def queued_ms(self) -> int:
        """Audio waiting to be heard: the queue's synthesised audio and what the carrier leg
        holds of it (docs/protocol-session-v1.md, "Queue level")."""
        queue = self.queue
        if queue is None:
            return 0
        return queue.queued_ms + self._services.unplayed_frames() * queue.frame_ms

    def on_queue_level(self, now: float) -> list[fx.Effect]:
        """A tick while ``output.queue`` is subscribed: a report when its rules say so."""
        level = self.queue_level
        if level is None:
            return []
        queued = level.observe(now, self.queued_ms())
        if queued is None:
            return []
        return [fx.SendEvent(sv1.OutputQueueLevel(queued_ms=queued))]

    # -- listening ------------------------------------------------------------------------------
    def _subscribe(self, cmd: sv1.Subscribe) -> None:
        self.subscriptions.update(cmd.events)
        if OUTPUT_QUEUE in cmd.events and self.queue_level is None:
            self.queue_level = QueueLevel()

    def _listen_update(self, cmd: sv1.ListenUpdate) -> None:
        if cmd.language is not None:
            try:
                self.listen_language = self._services.check_language(cmd.language)
            except SpeechError as exc:
                self._error(exc.code, str(exc), cmd.id or "listen.update")
                return
        if cmd.hints is not None:
            self.listen_hints = list(cmd.hints)
        if cmd.patience is not None:
            self.patience = cmd.patience
        self._out.append(
            fx.UpdateEars(
                language=self.listen_language if cmd.language is not None else None,
                hints=list(cmd.hints) if cmd.hints is not None else None,
                patience=cmd.patience,
            )
        )

    # -- the carrier ----------------------------------------------------------------------------
    def on_carrier_dtmf(self, digit: str) -> list[fx.Effect]:
        """A keypress: to the app whenever a session is open, on hold too
        (docs/protocol-session-v1.md, "Call control")."""
        if self.life.state is CallState.ACTIVE:
            return [fx.SendEvent(sv1.DtmfEvent(digit=digit))]
        return []

    def on_carrier_hangup(self, *, handed_over: bool) -> list[fx.Effect]:
        """The carrier's side is gone. After a transfer that the carrier carried out, that is
        the transfer's end (``session.end`` ``transfer``, with its id); else the caller hung up."""
        if handed_over:
            return [fx.EndCall("transfer", self.control.transfer_id, carrier_gone=True)]
        return [fx.EndCall("caller_hangup", carrier_gone=True)]

    # -- output events --------------------------------------------------------------------------
    def on_output_events(self, events: list[OutputEvent]) -> list[fx.Effect]:
        """The output queue's events of a tick (``Call._feed``)."""
        self._emit(events)
        return self._take()

    def on_tick(self, tick: int) -> list[fx.Effect]:
        """Events held for the carrier's lead go once the caller heard what they report."""
        ready = self.heard.advance(tick)
        if ready:
            self._send(ready)
        return self._take()

    def _emit(self, events: list[OutputEvent]) -> None:
        if not events:
            return
        ready = self.heard.hold(events, self._services.unplayed_frames())
        if ready:
            self._send(ready)

    def _send(self, events: Sequence[OutputEvent]) -> None:
        fallback = self.life.state is CallState.FALLBACK
        self._out.extend(to_app(events, self._marks, self._internal_items, fallback=fallback))


#: Each command's handler, by its decoded type.
_HANDLERS: Final[dict[type, Callable[[CallCore, Any], None]]] = {
    sv1.Speak: CallCore._speak,
    sv1.Play: CallCore._play,
    sv1.MarkCommand: CallCore._mark,
    sv1.Clear: CallCore._clear_command,
    sv1.Hangup: CallCore._hangup,
    sv1.Subscribe: CallCore._subscribe,
    sv1.ListenUpdate: CallCore._listen_update,
    sv1.DtmfSend: CallCore._dtmf_send,
    sv1.Hold: CallCore._hold,
    sv1.Resume: CallCore._resume,
    sv1.Handoff: CallCore._handoff,
    sv1.Transfer: CallCore._transfer,
    sv1.TransferComplete: CallCore._transfer_complete,
}
