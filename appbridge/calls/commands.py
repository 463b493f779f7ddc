"""What the app's messages do to a call (seed 004, "Speech", "Audio", "Call control").

One ``CommandHandler`` per call. It owns the output side: the utterances being synthesised, the
files being fetched, the marks, and the translation of output-queue events into ``output.*`` and
``mark`` events, each sent once the caller heard what it reports (``media/pacing.py``,
``HeardLine``: a carrier's lead delays them, ``clear`` settles them). Nothing here waits: TTS
and fetches run as tasks of the call and write into the output queue when their audio arrives,
so the order of the queue is the order the commands came in (INTERFACES §6: ``preempt`` plays
first, items behind stay queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from appbridge.calls.state import CallState
from appbridge.calls.transfer import MUSIC_MAX_MS, TransferFlow, music_queue
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.dtmf import dtmf_pcm16
from appbridge.media.fetch import FetchError, fetch_audio
from appbridge.media.output_queue import (
    MarkReached,
    OutputDone,
    OutputEvent,
    OutputInterrupted,
    OutputQueue,
    OutputStarted,
    QueueFull,
    WordTiming,
)
from appbridge.media.pacing import HeardLine
from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.twilio_streams import (
    TwilioBadMessage,
    TwilioClear,
    TwilioMark,
    TwilioMedia,
    decode_twilio,
)
from appbridge.speech.base import SpeechError, TtsProvider, VoiceInfo

if TYPE_CHECKING:
    from appbridge.calls.call import Call

log = logging.getLogger(__name__)

MAX_AUDIO_FRAME_BYTES: Final = 1024 * 1024
# Streamed text is synthesised a sentence at a time (better prosody than token by token); a run
# of text without punctuation is cut at a word boundary past this many characters.
SENTENCE_SOFT_LIMIT_CHARS: Final = 160
_SENTENCE_END = re.compile(r"[.!?;:](?:[\"')\]]*)\s")

_E164 = re.compile(r"^\+[1-9][0-9]{1,14}$")


@dataclass
class Utterance:
    """One ``speak`` item, possibly streamed in ``last: false`` pieces (seed 004, ``speak``)."""

    item_id: str
    provider: TtsProvider
    voice: VoiceInfo
    language: str
    relates_to: str  # an error's ``relatesTo``: the command's id, else "speak" (INTERFACES §6)
    pending: list[str] = field(default_factory=list)
    last_seen: bool = False
    wake: Any = None  # asyncio.Event, created on the loop


class CommandHandler:
    def __init__(self, call: Call) -> None:
        # The call owns this handler: a weak reference back, so that the two form no reference
        # cycle and an ended call is freed by reference counting alone (media/gc_pacer.py).
        # Commands are the control path, so the indirection costs nothing that shows.
        self._call = weakref.ref(call)
        self.queue: OutputQueue | None = None
        self.out_format: AudioFormat | None = None
        self._raw_conv: Converter | None = None
        self._utterances: dict[str, Utterance] = {}
        self._cleared_streams: set[str] = set()  # ids whose remaining pieces must be dropped
        self._marks: dict[str, tuple[str, str | None]] = {}
        self._mark_seq = 0
        self.heard = HeardLine()
        self._internal_items: set[str] = set()
        self._raw_full_reported = False
        self._hold_audio_reported = False
        self.subscriptions: set[str] = set()
        self.listen_language: str | None = None
        self.listen_hints: list[str] = []
        self.patience = "normal"

    @property
    def call(self) -> Call:
        call = self._call()
        if call is None:
            raise ReferenceError("the call this command handler served is gone")
        return call

    # -- set-up -------------------------------------------------------------------------------
    def on_queue_ready(self, queue: OutputQueue, out_format: AudioFormat) -> None:
        self.queue = queue
        self.out_format = out_format
        self.heard.frame_ms = queue.frame_ms
        self._raw_conv = Converter(self.call.session_format, out_format)

    def on_session_format(self, session_format: AudioFormat) -> None:
        """A handoff brought an app with another audio format."""
        if self.out_format is not None:
            self._raw_conv = Converter(session_format, self.out_format)

    def reset_output(self) -> None:
        """A handoff: the old app's output is dropped, its events go nowhere."""
        if self.queue is not None:
            self.queue.clear()
            if self.call.leg is not None:
                self.call.leg.clear_output()
        self.shutdown()
        self._cleared_streams.clear()
        self._marks.clear()

    def reset_listening(self) -> None:
        """A handoff: ``subscribe`` and ``listen.update`` were the old app's choices."""
        self.subscriptions.clear()
        self.listen_language = None
        self.listen_hints = []
        self.patience = "normal"

    def shutdown(self) -> None:
        self.heard.drop()
        for utt in self._utterances.values():
            if utt.wake is not None:
                utt.wake.set()
        self._utterances.clear()

    # -- inbound frames ---------------------------------------------------------------------------
    def on_text(self, data: bytes) -> None:
        msg = sv1.decode_command(data)
        if isinstance(msg, sv1.BadMessage):
            self.call.send_error("bad_message", msg.message, msg.relates_to)
            return
        if isinstance(msg, sv1.Ignored):
            log.debug("call %s: ignoring message type %r", self.call.call_ref, msg.type)
            return
        self.dispatch(msg)

    def on_twilio_text(self, data: bytes) -> None:
        """A Twilio-dialect app's message (seed 004, "Twilio protocol"): ``media``, ``mark`` and
        ``clear``; everything else is ignored, and malformed input is logged (that dialect has
        no error message)."""
        msg = decode_twilio(data, sender="app")
        if isinstance(msg, TwilioMedia):
            self.on_audio(msg.media.payload)
        elif isinstance(msg, TwilioMark):
            self._add_mark(msg.mark.name, None)
        elif isinstance(msg, TwilioClear):
            self.clear()
        elif isinstance(msg, TwilioBadMessage):
            self.call.gw.metrics.app_bad_messages += 1
            log.warning(
                "call %s: bad message from a Twilio-dialect app: %s",
                self.call.call_ref,
                msg.message,
            )
        else:
            log.debug("call %s: ignoring %r from a Twilio-dialect app", self.call.call_ref, msg)

    def on_audio(self, data: bytes) -> None:
        """App binary audio joins the output queue (seed 004, "Audio"). No ``output.*`` events."""
        queue, conv = self.queue, self._raw_conv
        if queue is None or conv is None:
            return
        if len(data) > MAX_AUDIO_FRAME_BYTES:
            self.call.send_error(
                "bad_message",
                f"binary frame of {len(data)} bytes is over the {MAX_AUDIO_FRAME_BYTES}-byte limit",
                "audio",
            )
            return
        if self.call.control.on_hold:
            if not self._hold_audio_reported:
                self._hold_audio_reported = True
                self.call.send_error(
                    "on_hold", "audio is dropped while the caller is on hold", "audio"
                )
            return
        try:
            queue.append_raw(conv.convert(data))
        except QueueFull:
            if not self._raw_full_reported:
                self._raw_full_reported = True
                self.call.send_error("queue_full", "more than 120 s of output is queued", "audio")
            return
        self._raw_full_reported = False

    # -- commands ----------------------------------------------------------------------------------
    def dispatch(self, cmd: sv1.Command) -> None:
        kind = str(cmd.__struct_config__.tag)
        refused = self.call.control.gate(kind)
        if refused is not None:
            code, message = refused
            self.call.send_error(code, message, cmd.id or kind)  # type: ignore[arg-type]
            return
        if isinstance(cmd, sv1.Speak):
            self._speak(cmd)
        elif isinstance(cmd, sv1.Play):
            self._play(cmd)
        elif isinstance(cmd, sv1.MarkCommand):
            self._mark(cmd)
        elif isinstance(cmd, sv1.Clear):
            self.clear()
        elif isinstance(cmd, sv1.Hangup):
            self.call.spawn(self.call.end("app_hangup", cmd.id), "hangup")
        elif isinstance(cmd, sv1.Subscribe):
            self.subscriptions.update(cmd.events)
        elif isinstance(cmd, sv1.ListenUpdate):
            self._listen_update(cmd)
        elif isinstance(cmd, sv1.DtmfSend):
            self._dtmf_send(cmd)
        elif isinstance(cmd, sv1.Hold):
            self._hold(cmd)
        elif isinstance(cmd, sv1.Resume):
            transfer = self.call.transfer
            if transfer is not None and transfer.mode == "warm":
                transfer.cancel("resume")
            elif self.call.control.resume():
                self._hold_audio_reported = False
                self.call.stop_hold()
        elif isinstance(cmd, sv1.Handoff):
            self.call.spawn(self.call.handoff(cmd.app, cmd.payload, cmd.id), "handoff")
        elif isinstance(cmd, sv1.Transfer):
            self._transfer(cmd)
        elif isinstance(cmd, sv1.TransferComplete):
            transfer = self.call.transfer
            refused = (
                transfer.complete(cmd.id)
                if transfer is not None
                else ("bad_message", "transfer.complete: no warm transfer is under way")
            )
            if refused is not None:
                self.call.send_error(refused[0], refused[1], cmd.id)

    def _speak(self, cmd: sv1.Speak) -> None:
        queue = self.queue
        if queue is None:
            return
        if cmd.id is not None and cmd.id in self._cleared_streams:
            # The rest of an utterance that ``clear`` dropped: never play it.
            if cmd.last:
                self._cleared_streams.discard(cmd.id)
            return
        item_id = cmd.id if cmd.id is not None else self._new_id()
        relates_to = cmd.id if cmd.id is not None else "speak"
        utt = self._utterances.get(item_id)
        if utt is None:
            if queue.has_item(item_id):
                self.call.send_error(
                    "bad_message", f"speak: id {item_id!r} is still playing and complete", item_id
                )
                return
            try:
                provider, voice, language = self.call.gw.catalog.voice_for(
                    cmd.voice, cmd.language, self.call.app.speech
                )
            except SpeechError as exc:
                self.call.send_error(exc.code, str(exc), relates_to)  # type: ignore[arg-type]
                return
            self._add_item(item_id, preempt=cmd.preempt)
            utt = Utterance(item_id, provider, voice, language, relates_to)
            self._utterances[item_id] = utt
            self.call.spawn(self._synthesise(utt), f"tts:{item_id}")
        utt.pending.append(cmd.text)
        if cmd.last:
            utt.last_seen = True
        if utt.wake is not None:
            utt.wake.set()

    def speak_fallback(self, text: str) -> None:
        """The app could not be reached: say the configured message, then hang up."""
        queue = self.queue
        if queue is None:
            return
        try:
            provider, voice, language = self.call.gw.catalog.voice_for(
                None, None, self.call.app.speech
            )
        except SpeechError:
            log.exception("call %s: fallback voice unavailable", self.call.call_ref)
            self.call.spawn(self.call.end("error"), "end-fallback")
            return
        item_id = self._new_id()
        self._internal_items.add(item_id)
        queue.add_item(item_id)
        utt = Utterance(item_id, provider, voice, language, "speak", pending=[text], last_seen=True)
        self._utterances[item_id] = utt
        self.call.spawn(self._synthesise(utt), "tts:fallback")

    async def _synthesise(self, utt: Utterance) -> None:
        utt.wake = asyncio.Event()
        queue, out_format = self.queue, self.out_format
        assert queue is not None and out_format is not None
        offset_ms = 0.0
        conv: Converter | None = None
        conv_rate = 0
        carry = ""
        try:
            while True:
                if not utt.pending and not utt.last_seen:
                    utt.wake.clear()
                    await utt.wake.wait()
                    if utt.item_id not in self._utterances:
                        return
                text = carry + "".join(utt.pending)
                utt.pending.clear()
                final = utt.last_seen
                ready, carry = (text, "") if final else _split_sentences(text)
                if ready.strip():
                    stream = utt.provider.synthesize(ready, utt.voice, utt.language)
                    async with contextlib.aclosing(stream):
                        async for chunk in stream:
                            if conv is None or chunk.rate_hz != conv_rate:
                                conv = Converter(AudioFormat("pcm16", chunk.rate_hz), out_format)
                                conv_rate = chunk.rate_hz
                            if chunk.words:
                                queue.append_words(utt.item_id, _shift(chunk.words, offset_ms))
                            if not queue.append_audio(utt.item_id, conv.convert(chunk.pcm16)):
                                return  # cleared or preempted: drop the rest
                    length = queue.item_audio_ms(utt.item_id)
                    offset_ms = float(length) if length is not None else offset_ms
                if final and not carry:
                    self.emit(queue.close_item(utt.item_id))
                    return
        except QueueFull:
            self._fail_item(
                utt.item_id, "queue_full", "more than 120 s of output is queued", utt.relates_to
            )
        except SpeechError as exc:
            self._fail_item(utt.item_id, exc.code, str(exc), utt.relates_to)
        finally:
            if self._utterances.get(utt.item_id) is utt:
                del self._utterances[utt.item_id]

    def _play(self, cmd: sv1.Play) -> None:
        queue = self.queue
        if queue is None:
            return
        item_id = cmd.id if cmd.id is not None else self._new_id()
        if queue.has_item(item_id):
            self.call.send_error("bad_message", f"play: id {item_id!r} is in use", item_id)
            return
        self._add_item(item_id, loop=cmd.loop, preempt=cmd.preempt)
        relates_to = cmd.id if cmd.id is not None else "play"
        self.call.spawn(self._fetch_and_queue(item_id, cmd.url, relates_to), f"play:{item_id}")

    async def _fetch_and_queue(self, item_id: str, url: str, relates_to: str) -> None:
        queue, out_format = self.queue, self.out_format
        assert queue is not None and out_format is not None
        try:
            audio = await fetch_audio(self.call.gw.http, url, self.call.config.media)
        except FetchError as exc:
            self._fail_item(item_id, "play_fetch_failed", f"play {url}: {exc}", relates_to)
            return
        conv = Converter(AudioFormat("pcm16", audio.rate_hz), out_format)
        try:
            if queue.append_audio(item_id, conv.convert(audio.pcm16)):
                self.emit(queue.close_item(item_id))
        except QueueFull:
            self._fail_item(
                item_id, "queue_full", "more than 120 s of output is queued", relates_to
            )

    def _fail_item(self, item_id: str, code: Any, message: str, relates_to: str) -> None:
        queue = self.queue
        if queue is not None and queue.has_item(item_id):
            self.emit(queue.discard_item(item_id))
        if item_id not in self._internal_items:
            self.call.send_error(code, message, relates_to)
        elif self.call.state is CallState.FALLBACK:
            self.call.spawn(self.call.end("error"), "end-fallback")

    def _mark(self, cmd: sv1.MarkCommand) -> None:
        self._add_mark(cmd.name, cmd.id)

    def _add_mark(self, name: str, command_id: str | None) -> None:
        queue = self.queue
        if queue is None:
            return
        self._mark_seq += 1
        key = f"m{self._mark_seq}"
        self._marks[key] = (name, command_id)
        self.emit(queue.add_mark(key))

    def clear(self) -> None:
        """Seed 004 ``clear``: empty the queue; the caller hears silence within 40 ms."""
        queue = self.queue
        if queue is None:
            return
        leg = self.call.active_leg()
        heard = self.heard
        # The audio the far end has not played yet goes with the queue: not heard.
        unheard = heard.unheard_by_item(leg.unplayed_frames()) if leg is not None else {}
        events = queue.clear(unheard)
        if leg is not None:
            leg.clear_output()
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
        queue = self.queue
        assert queue is not None
        events = queue.add_item(item_id, loop=loop, preempt=preempt)
        for ev in events:
            if isinstance(ev, OutputInterrupted):
                self._end_stream(ev.item_id)
        self.emit(events)

    def _end_stream(self, item_id: str) -> None:
        """The item left the queue unfinished: stop synthesising it, and drop the pieces of it
        still to come (seed 004 ``speak``, ``last: false``)."""
        utt = self._utterances.pop(item_id, None)
        if utt is None:
            return
        if not utt.last_seen:
            self._cleared_streams.add(item_id)
        if utt.wake is not None:
            utt.wake.set()

    def _dtmf_send(self, cmd: sv1.DtmfSend) -> None:
        """Keypresses on the call: out of band where the carrier can, else in-band tones that
        take their place in the output queue (seed 004 ``dtmf.send``)."""
        leg, queue, out_format = self.call.active_leg(), self.queue, self.out_format
        if leg is None or queue is None or out_format is None:
            return
        if leg.send_dtmf(cmd.digits):
            return
        pcm = dtmf_pcm16(cmd.digits, 8000)
        audio = Converter(AudioFormat("pcm16", 8000), out_format).convert(pcm)
        item_id = self._new_id()
        self._internal_items.add(item_id)
        self.emit(queue.add_item(item_id))
        try:
            queue.append_audio(item_id, audio)
        except QueueFull:
            self.emit(queue.discard_item(item_id))  # internal: the command's error says it
            self.call.send_error(
                "queue_full", "more than 120 s of output is queued", cmd.id or "dtmf.send"
            )
            return
        self.emit(queue.close_item(item_id))

    def _hold(self, cmd: sv1.Hold) -> None:
        """The caller hears ``music`` (looped) or silence; the app's queue waits untouched."""
        out_format = self.out_format
        if out_format is None or not self.call.control.hold():
            return
        music = music_queue(out_format)
        self.call.start_hold(music)
        if cmd.music:
            self.call.spawn(self.fetch_music(music, cmd.music, cmd.id), "hold-music")

    async def fetch_music(self, music: OutputQueue, url: str, command_id: str | None) -> None:
        """Fetch ``url`` into ``music`` as one looped item (hold, a transfer's waiting), through
        the gateway's music store: calls on hold to the same track share one fetch and one
        copy of it (media/music.py)."""
        out_format = self.out_format
        assert out_format is not None
        gw = self.call.gw
        try:
            data = await gw.music.get(gw.http, url, self.call.config.media, out_format)
        except FetchError as exc:
            self.call.send_error(
                "play_fetch_failed", f"hold music {url}: {exc}", command_id or "hold"
            )
            return
        music.add_item("music", loop=True)
        try:
            music.append_audio("music", data)
        except QueueFull:
            self.call.send_error(
                "queue_full",
                f"hold music is longer than {MUSIC_MAX_MS // 60_000} minutes",
                command_id or "hold",
            )
            return
        music.close_item("music")

    def _transfer(self, cmd: sv1.Transfer) -> None:
        """Seed 004 ``transfer``; INTERFACES §6 "Transfer targets"; calls/transfer.py."""
        call = self.call
        if call.leg is None:
            return
        if cmd.mode == "warm" and cmd.id is None:
            # transfer.complete names the warm transfer by this id: without one the caller
            # would wait on hold with no way to be connected.
            call.send_error(
                "bad_message",
                "transfer: a warm transfer needs an id (transfer.complete names it)",
                "transfer",
            )
            return
        if not self._transfer_target_ok(cmd.to):
            call.send_error(
                "transfer_failed",
                f"transfer: {cmd.to!r} is neither an E.164 number "
                "nor a sip: URI of a configured trunk",
                cmd.id or "transfer",
            )
            return
        call.start_transfer(TransferFlow(call, cmd))

    def _transfer_target_ok(self, target: str) -> bool:
        if _E164.match(target):
            return True
        if target.startswith("sip:"):
            host = target[4:].split("@", 1)[-1].split(";", 1)[0].split("?", 1)[0]
            host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
            sip = self.call.config.sip
            return sip is not None and any(t.host == host for t in sip.trunks)
        return False

    def _listen_update(self, cmd: sv1.ListenUpdate) -> None:
        if cmd.language is not None:
            try:
                self.listen_language = self.call.gw.catalog.check_language(cmd.language)
            except SpeechError as exc:
                self.call.send_error(exc.code, str(exc), cmd.id or "listen.update")  # type: ignore[arg-type]
                return
        if cmd.hints is not None:
            self.listen_hints = list(cmd.hints)
        if cmd.patience is not None:
            self.patience = cmd.patience
        ears = self.call.ears
        if ears is not None:
            ears.update(
                language=self.listen_language if cmd.language is not None else None,
                hints=list(cmd.hints) if cmd.hints is not None else None,
                patience=cmd.patience,
            )

    # -- output events -----------------------------------------------------------------------------
    def on_output_events(self, events: list[OutputEvent]) -> None:
        self.emit(events)

    def on_tick(self, tick: int) -> None:
        """Events held for the carrier's lead go once the caller heard what they report."""
        ready = self.heard.advance(tick)
        if ready:
            self._send(ready)

    def emit(self, events: list[OutputEvent]) -> None:
        """Queue events, sent once what they report was heard (module doc)."""
        if not events:
            return
        leg = self.call.active_leg()
        ready = self.heard.hold(events, leg.unplayed_frames() if leg is not None else 0)
        if ready:
            self._send(ready)

    def _send(self, events: Sequence[OutputEvent]) -> None:
        call = self.call
        for ev in events:
            if isinstance(ev, MarkReached):
                name, mark_id = self._marks.pop(ev.name, (ev.name, None))
                call.send_event(sv1.MarkEvent(name=name, cleared=ev.cleared, id=mark_id))
                continue
            if ev.item_id in self._internal_items:
                if isinstance(ev, OutputDone | OutputInterrupted):
                    self._internal_items.discard(ev.item_id)
                    if call.state is CallState.FALLBACK:
                        call.spawn(call.end("error"), "end-fallback")
                continue
            if isinstance(ev, OutputStarted):
                call.send_event(sv1.OutputStarted(id=ev.item_id))
            elif isinstance(ev, OutputDone):
                call.send_event(sv1.OutputDone(id=ev.item_id, heard_ms=ev.heard_ms))
            elif isinstance(ev, OutputInterrupted):
                call.send_event(
                    sv1.OutputInterrupted(
                        id=ev.item_id, heard_text=ev.heard_text, heard_ms=ev.heard_ms
                    )
                )

    def _new_id(self) -> str:
        return f"ab-{uuid.uuid4().hex[:16]}"


def _split_sentences(text: str) -> tuple[str, str]:
    """Split streamed text into (complete sentences, the rest still being written)."""
    last_end = None
    for match in _SENTENCE_END.finditer(text):
        last_end = match.end()
    if last_end is not None:
        return text[:last_end], text[last_end:]
    if len(text) > SENTENCE_SOFT_LIMIT_CHARS:
        cut = text.rfind(" ", 0, len(text) - 1)
        if cut > 0:
            return text[: cut + 1], text[cut + 1 :]
    return "", text


def _shift(words: Sequence[WordTiming], offset_ms: float) -> list[WordTiming]:
    if not offset_ms:
        return list(words)
    off = round(offset_ms)
    return [WordTiming(w.start_ms + off, w.end_ms + off, w.text) for w in words]
