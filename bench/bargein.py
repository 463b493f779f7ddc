"""Barge-in latency: speech onset to ``turn.user_started``, and backchannel false starts.

docs/turn-taking.md, "Barge-in": each clip of bench/speech_corpus.py is played as a call plays
it, in virtual time. Every 20 ms frame (8 kHz pcm16 after µ-law) goes to the VAD and the turn
detector, and, upsampled to 16 kHz, to the local STT's endpointer; every utterance the endpointer
asks for is really decoded by the local model on one decoder (one decode in flight, finals first,
a newer partial replacing a waiting one, as :class:`LocalSttStream` does), and its transcript
reaches the detector when the decode would have finished: the measured decode time after the
frame that asked for it, or after the decode before it. The onset is the start of the first
frame of the detector's first speech run. Nothing here asserts: it prints a table.

    python -m bench.bargein           # the old settings, the gateway's, and the early designs
    python -m bench.bargein --early 200,400 -v
    python -m bench.bargein --recorded  # voices built from recordings in place of eSpeak's
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

from appbridge.media.codecs import AudioFormat, Converter
from appbridge.speech.base import Transcript
from appbridge.speech.providers.local_stt import WhisperEngine, shared_whisper_engine
from appbridge.turn.detector import Backchannel, TurnDetector, TurnEvent, TurnTiming, UserStarted
from appbridge.turn.vad import Segmenter, Utterance, Vad
from bench.speech_corpus import (
    Clip,
    asterisk_clips,
    backchannel_clips,
    recorded_backchannel_clips,
    recorded_voice_clips,
    sentence_clips,
    silence,
)

FRAME_S = 0.02
FRAME_BYTES = 320  # 20 ms of 8 kHz pcm16


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    early_ms: tuple[int, ...]
    timing: TurnTiming
    guard_prefixes: bool
    ack_prompt_below_s: float = 0.0
    partial_needs_speech: bool = False
    ack_prompt_partials: bool = False
    beam_size: int = 5


@dataclass(slots=True)
class Run:
    onset_s: float | None = None
    started_s: float | None = None
    backchannel: str | None = None
    events: list[tuple[float, str]] = field(default_factory=list)


class Decoder:
    """One decode at a time in virtual time, as a stream with one worker does."""

    def __init__(self, engine: WhisperEngine) -> None:
        self.engine = engine
        self.busy_until = 0.0
        self.waiting: list[tuple[float, Utterance]] = []  # finals first, one partial
        self.due: list[tuple[float, Transcript]] = []

    def ask(self, now: float, utt: Utterance) -> None:
        if not utt.final:
            self.waiting = [w for w in self.waiting if w[1].final]
        self.waiting.append((now, utt))
        self.waiting.sort(key=lambda w: not w[1].final)
        self.pump(now)

    def pump(self, now: float) -> None:
        while self.waiting and self.busy_until <= now + 1e-9:
            _, utt = self.waiting.pop(0)
            began = time.perf_counter()
            rec = self.engine.submit(utt.pcm16, [], final=utt.final).result()
            start = max(now, self.busy_until)
            self.busy_until = start + (time.perf_counter() - began)
            text = Transcript(
                rec.text, "en-US", rec.confidence, utt.final, utt.start_ms, utt.end_ms
            )
            if utt.final or rec.text:
                self.due.append((self.busy_until, text))


def play(clip: Clip, setting: Setting, engine: WhisperEngine) -> Run:
    audio = silence(400) + clip.pcm16 + silence(2500)
    det = TurnDetector(0.0, emit_estimates=False, timing=setting.timing)
    det.guard_prefixes = setting.guard_prefixes
    det.partial_needs_speech = setting.partial_needs_speech
    engine.ack_prompt_below_s = setting.ack_prompt_below_s
    engine.ack_prompt_partials = setting.ack_prompt_partials
    engine.beam_size = setting.beam_size
    vad = Vad(8000)
    seg = Segmenter(early_partials_ms=setting.early_ms)
    up = Converter(AudioFormat("pcm16", 8000), AudioFormat("pcm16", 16000))
    dec = Decoder(engine)
    run = Run()
    prev_speech = False

    def record(t: float, events: list[TurnEvent]) -> None:
        for e in events:
            run.events.append((t, type(e).__name__))
            if isinstance(e, UserStarted) and run.started_s is None:
                run.started_s = t
            if isinstance(e, Backchannel):
                run.backchannel = e.text

    for k in range(len(audio) // FRAME_BYTES):
        now = (k + 1) * FRAME_S
        while True:
            dec.pump(now)
            times = [t for t, _ in dec.due if t <= now]
            timer = det.next_deadline()
            if timer is not None and timer <= now:
                times.append(timer)
            if not times:
                break
            t = min(times)
            ready = [d for d in dec.due if d[0] == t]
            if ready:
                dec.due.remove(ready[0])
                record(t, det.on_transcript(t, ready[0][1]))
            else:
                record(t, det.on_timer(t))
        frame = audio[k * FRAME_BYTES : (k + 1) * FRAME_BYTES]
        speech = vad.is_speech(frame)
        if speech and prev_speech and run.onset_s is None:
            run.onset_s = now - 2 * FRAME_S  # the start of the run's first frame
        prev_speech = speech
        record(now, det.on_frame(now, speech))
        for utt in seg.feed(up.convert(frame)):
            dec.ask(now, utt)
    return run


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(
    setting: Setting, sentences: list[Clip], backchannels: list[Clip], verbose: bool
) -> str:
    engine = shared_whisper_engine()
    latencies, missed = [], 0
    for clip in sentences:
        run = play(clip, setting, engine)
        if run.started_s is None or run.onset_s is None:
            missed += 1
            continue
        latencies.append((run.started_s - run.onset_s) * 1000)
        if verbose:
            print(f"    {clip.name}: {latencies[-1]:.0f} ms")
    false_starts, announced = 0, 0
    for clip in backchannels:
        run = play(clip, setting, engine)
        false_starts += run.started_s is not None
        announced += run.backchannel is not None
        if verbose and (run.started_s is not None or run.backchannel is None):
            print(f"    {clip.name} ({clip.seconds:.2f} s): {run.events}")
    p50 = percentile(latencies, 0.5) if latencies else float("nan")
    p95 = percentile(latencies, 0.95) if latencies else float("nan")
    return (
        f"| {setting.name} | {p50:.0f} | {p95:.0f} | {missed} | "
        f"{false_starts}/{len(backchannels)} | {announced}/{len(backchannels)} |"
    )


def settings(early: tuple[int, ...] | None, only: int | None = None) -> list[Setting]:
    """The old settings first, then the designs compared with them."""
    if early is not None:
        return [Setting(f"early partials at {early} ms, prefix guard", early, TurnTiming(), True)]
    three = (200, 400, 600)
    t = TurnTiming()
    out = [
        Setting("old: greedy finals, no prefix guard", (), t, False, 0.0, beam_size=1),
        Setting("gateway: beam 5, ack prompt below 1.5 s, prefix guard", (), t, True, 1.5),
        Setting("early partials 200/400/600 ms", three, t, True, 1.5),
        Setting("early, partial needs the caller still speaking", three, t, True, 1.5, True),
        Setting("early, ack prompt on partials too", three, t, True, 1.5, True, True),
    ]
    if only is not None:
        return [out[only]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--early", help="ms of speech for early partials, e.g. 200,400")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--only", type=int, help="run only the setting with this row number")
    parser.add_argument(
        "--recorded", action="store_true", help="Festival and Flite voices in place of eSpeak's"
    )
    args = parser.parse_args()
    early = tuple(int(x) for x in args.early.split(",")) if args.early else None
    if args.recorded:
        voiced = [clip for clips in recorded_voice_clips().values() for clip in clips]
        sentences, backchannels = voiced + asterisk_clips(), recorded_backchannel_clips()
    else:
        sentences, backchannels = sentence_clips() + asterisk_clips(), backchannel_clips()
    lengths = sorted(c.seconds for c in backchannels)
    median = statistics.median(lengths)
    print(
        f"{len(sentences)} sentences, {len(backchannels)} backchannels "
        f"({lengths[0]:.2f} to {lengths[-1]:.2f} s of audio, median {median:.2f} s)"
    )
    print(
        "| setting | p50 ms | p95 ms | never started | backchannel false starts | as backchannel |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for setting in settings(early, args.only):
        print(measure(setting, sentences, backchannels, args.verbose), flush=True)


if __name__ == "__main__":
    main()
