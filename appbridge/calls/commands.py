"""The shell of the call core: it carries out the effects that ``calls/core.py`` decides.

Everything here does I/O or waits: synthesis and fetches run as tasks of the call and hand their
audio back to the core as it arrives, so nothing blocks the loop and the queue keeps the order of
the commands; events go to the app, keypresses and clears to the carrier leg, and hold,
transfers and handoffs to the call. No decision about what a command means is made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from appbridge.calls.effects import (
    CancelTransfer,
    ClearLeg,
    CompleteTransfer,
    Effect,
    EndCall,
    FetchAudio,
    OpenSession,
    ReportBadMessage,
    SendDtmf,
    SendError,
    SendEvent,
    SpeakText,
    StartHandoff,
    StartHold,
    StartTransfer,
    StartTts,
    StopHold,
    StopTts,
    UpdateEars,
    Utterance,
)
from appbridge.calls.transfer import MUSIC_MAX_MS, TransferFlow, begin_transfer, music_queue
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.fetch import FetchError, convert_for_call, fetch_audio
from appbridge.media.output_queue import OutputQueue, QueueFull, WordTiming
from appbridge.speech.base import SpeechError
from appbridge.speech.pauses import pause_to_add_ms, tail_bytes, trailing_silence_ms
from appbridge.weakable import WeakTo

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.calls.core import CallCore

log = logging.getLogger(__name__)

# Streamed text is synthesised a sentence at a time (better prosody than token by token); a run
# of text without punctuation is cut at a word boundary past this many characters.
SENTENCE_SOFT_LIMIT_CHARS: Final = 160
_SENTENCE_END = re.compile(r"[.!?;:](?:[\"')\]]*)\s")


class _Synth:
    """The shell's side of one utterance: the text still to synthesise, and whether to stop."""

    __slots__ = ("last", "pending", "stopped", "wake")

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.last = False
        self.stopped = False
        self.wake = asyncio.Event()


class CommandShell:
    def __init__(self, call: Call) -> None:
        # The call owns this shell: a weak reference back (through its anchor, appbridge/
        # weakable.py), so that the two form no reference cycle and an ended call is freed by
        # reference counting alone (media/gc_pacer.py).
        self._call = WeakTo(call.anchor)
        self._synths: dict[Utterance, _Synth] = {}

    @property
    def call(self) -> Call:
        call = self._call()
        if call is None:
            raise ReferenceError("the call this shell served is gone")
        return call

    @property
    def core(self) -> CallCore:
        return self.call.core

    def run(self, effects: Sequence[Effect]) -> None:
        """Carry out ``effects`` in order."""
        for effect in effects:
            _RUNNERS[type(effect)](self, effect)

    # -- to the app and the carrier ---------------------------------------------------------------
    def _send_event(self, e: SendEvent) -> None:
        self.call.send_event(e.event)

    def _send_error(self, e: SendError) -> None:
        self.call.send_error(e.code, e.message, e.relates_to)  # type: ignore[arg-type]

    def _bad_message(self, e: ReportBadMessage) -> None:
        call = self.call
        call.gw.metrics.app_bad_messages += 1
        log.warning("call %s: bad message from a Twilio-dialect app: %s", call.call_ref, e.message)

    def _end_call(self, e: EndCall) -> None:
        call = self.call
        name = _END_TASKS.get(e.reason, "end-fallback")
        call.spawn(call.end(e.reason, e.command_id, carrier_gone=e.carrier_gone), name)

    def _open_session(self, e: OpenSession) -> None:
        self.call.start_session(handoff=e.handoff)

    def _clear_leg(self, e: ClearLeg) -> None:
        leg = self.call.active_leg()
        if leg is not None:
            leg.clear_output()

    def _send_dtmf(self, e: SendDtmf) -> None:
        leg = self.call.active_leg()
        if leg is not None and not leg.send_dtmf(e.digits):
            self.run(self.core.queue_tones(e.digits, e.relates_to))

    # -- speech -----------------------------------------------------------------------------------
    def _start_tts(self, e: StartTts) -> None:
        utt = e.utterance
        synth = self._synths[utt] = _Synth()
        self.call.spawn(self._synthesise(utt, synth), f"tts:{utt.item_id}")

    def _speak_text(self, e: SpeakText) -> None:
        synth = self._synths.get(e.utterance)
        if synth is None:
            return
        synth.pending.append(e.text)
        if e.last:
            synth.last = True
        synth.wake.set()

    def _stop_tts(self, e: StopTts) -> None:
        synth = self._synths.get(e.utterance)
        if synth is not None:
            synth.stopped = True
            synth.wake.set()

    async def _synthesise(self, utt: Utterance, synth: _Synth) -> None:
        """Synthesise ``utt`` a sentence at a time as its text arrives, handing each chunk to
        the core in the leg's format, with the pause between sentences kept (speech/pauses.py)."""
        core = self.core
        out_format = core.out_format
        assert out_format is not None
        offset_ms = 0.0
        conv: Converter | None = None
        carry = ""
        pause_ms = 0  # silence owed before the next sentence synthesised apart
        try:
            while True:
                if not synth.pending and not synth.last:
                    synth.wake.clear()
                    await synth.wake.wait()
                if synth.stopped:
                    return
                text = carry + "".join(synth.pending)
                synth.pending.clear()
                final = synth.last
                ready, carry = (text, "") if final else _split_sentences(text)
                if ready.strip():
                    if pause_ms:
                        self.run(core.tts_audio(utt, out_format.silence(pause_ms), []))
                        offset_ms += pause_ms
                    tail = b""
                    stream = utt.provider.synthesize(ready, utt.voice, utt.language)
                    async with contextlib.aclosing(stream):
                        async for chunk in stream:
                            if conv is None or chunk.rate_hz != conv.src.rate_hz:
                                conv = Converter(AudioFormat("pcm16", chunk.rate_hz), out_format)
                            words = _shift(chunk.words, offset_ms) if chunk.words else []
                            self.run(core.tts_audio(utt, conv.convert(chunk.pcm16), words))
                            if synth.stopped:
                                return  # cleared, preempted or failed: drop the rest
                            tail = (tail + chunk.pcm16)[-tail_bytes(chunk.rate_hz) :]
                    length = core.item_audio_ms(utt.item_id)
                    offset_ms = float(length) if length is not None else offset_ms
                    ended_sentence = _SENTENCE_END.search(ready[-4:] + " ") is not None
                    rate = conv.src.rate_hz if conv is not None else 0
                    pause_ms = (
                        pause_to_add_ms(trailing_silence_ms(tail, rate)) if ended_sentence else 0
                    )
                if final and not carry:
                    self.run(core.tts_finished(utt))
                    return
        except SpeechError as exc:
            self.run(core.tts_failed(utt, exc.code, str(exc)))
        finally:
            core.tts_over(utt)
            if self._synths.get(utt) is synth:
                del self._synths[utt]

    # -- files and music --------------------------------------------------------------------------
    def _fetch_audio(self, e: FetchAudio) -> None:
        self.call.spawn(self._fetch_and_queue(e), f"play:{e.item_id}")

    async def _fetch_and_queue(self, e: FetchAudio) -> None:
        call, core = self.call, self.core
        out_format = core.out_format
        assert out_format is not None
        try:
            audio = await fetch_audio(call.gw.http, e.url, call.config.media)
        except FetchError as exc:
            self.run(core.fetch_failed(e.item_id, f"play {e.url}: {exc}", e.relates_to))
            return
        pcm = await convert_for_call(audio, out_format)
        self.run(core.fetched(e.item_id, pcm, e.relates_to))

    def _start_hold(self, e: StartHold) -> None:
        out_format = self.core.out_format
        assert out_format is not None
        music = music_queue(out_format)
        call = self.call
        call.start_hold(music)
        if e.music:
            call.spawn(self.fetch_music(music, e.music, e.command_id), "hold-music")

    async def fetch_music(self, music: OutputQueue, url: str, command_id: str | None) -> None:
        """Fetch ``url`` into ``music`` as one looped item (hold, a transfer's waiting), through
        the gateway's music store: calls on hold to the same track share one fetch and one
        copy of it (media/music.py)."""
        out_format = self.core.out_format
        assert out_format is not None
        call = self.call
        gw = call.gw
        try:
            data = await gw.music.get(gw.http, url, call.config.media, out_format)
        except FetchError as exc:
            call.send_error("play_fetch_failed", f"hold music {url}: {exc}", command_id or "hold")
            return
        music.add_item("music", loop=True)
        try:
            music.append_audio("music", data)
        except QueueFull:
            call.send_error(
                "queue_full",
                f"hold music is longer than {MUSIC_MAX_MS // 60_000} minutes",
                command_id or "hold",
            )
            return
        music.close_item("music")

    # -- call control -----------------------------------------------------------------------------
    def _stop_hold(self, e: StopHold) -> None:
        self.call.stop_hold()

    def _cancel_transfer(self, e: CancelTransfer) -> None:
        transfer = self.call.transfer
        if transfer is not None:
            transfer.cancel("resume")

    def _start_transfer(self, e: StartTransfer) -> None:
        call = self.call
        begin_transfer(call, TransferFlow(call, e.command))

    def _complete_transfer(self, e: CompleteTransfer) -> None:
        call = self.call
        transfer = call.transfer
        refused = (
            transfer.complete(e.command_id)
            if transfer is not None
            else ("bad_message", "transfer.complete: no warm transfer is under way")
        )
        if refused is not None:
            call.send_error(refused[0], refused[1], e.command_id)

    def _start_handoff(self, e: StartHandoff) -> None:
        call = self.call
        call.spawn(call.handoff(e.app, e.payload, e.command_id), "handoff")

    def _update_ears(self, e: UpdateEars) -> None:
        ears = self.call.ears
        if ears is not None:
            ears.update(language=e.language, hints=e.hints, patience=e.patience)


#: The names of the tasks that end a call, by reason (they name the task in logs).
_END_TASKS: Final = {
    "app_hangup": "hangup",
    "transfer": "end-transferred",
    "caller_hangup": "end-caller-hangup",
}

#: What carries out each effect, by its type.
_RUNNERS: Final[dict[type, Callable[[CommandShell, Any], None]]] = {
    SendEvent: CommandShell._send_event,
    OpenSession: CommandShell._open_session,
    SendError: CommandShell._send_error,
    ReportBadMessage: CommandShell._bad_message,
    EndCall: CommandShell._end_call,
    StartTts: CommandShell._start_tts,
    SpeakText: CommandShell._speak_text,
    StopTts: CommandShell._stop_tts,
    FetchAudio: CommandShell._fetch_audio,
    ClearLeg: CommandShell._clear_leg,
    SendDtmf: CommandShell._send_dtmf,
    StartHold: CommandShell._start_hold,
    StopHold: CommandShell._stop_hold,
    CancelTransfer: CommandShell._cancel_transfer,
    StartTransfer: CommandShell._start_transfer,
    CompleteTransfer: CommandShell._complete_transfer,
    StartHandoff: CommandShell._start_handoff,
    UpdateEars: CommandShell._update_ears,
}


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
