"""Word error rate and CPU of the offline recogniser candidates.

docs/turn-taking.md, "Choosing it", has the table this prints.

Each clip of bench/speech_corpus.py (the sentences in eSpeak NG and in the installed voices built
from recordings, and human telephone prompts, all through 8 kHz µ-law) goes through the stream's
own endpointer (``Segmenter``, at 16 kHz) and every final utterance is decoded by
:class:`WhisperEngine` with the candidate's model and decoding. CPU is the
process's CPU time (all threads) spent in decodes, divided by the seconds of audio decoded.

    python -m bench.stt_eval                       # every candidate that is installed
    python -m bench.stt_eval --model tiny.en=DIR   # a model directory of your own
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from appbridge.media.codecs import AudioFormat, Converter
from appbridge.speech.providers.local_stt import WhisperEngine
from appbridge.speech.providers.whisper_models import (
    WhisperModel,
    packaged_base_model,
    packaged_tiny_model,
)
from appbridge.turn.vad import Segmenter
from bench.speech_corpus import (
    Clip,
    asterisk_clips,
    recorded_voice_clips,
    sentence_clips,
    silence,
    word_error_rate,
)


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    engine: WhisperEngine


@dataclass(slots=True)
class Score:
    wers: list[tuple[str, float, str]]
    cpu_s: float
    audio_s: float


def transcribe(engine: WhisperEngine, clip: Clip) -> str:
    up = Converter(AudioFormat("pcm16", 8000), AudioFormat("pcm16", 16000))
    seg = Segmenter()
    utterances = seg.feed(up.convert(silence(300) + clip.pcm16 + silence(600))) + seg.flush()
    texts = [engine.submit(u.pcm16, []).result().text for u in utterances if u.final]
    return " ".join(t for t in texts if t)


def score(engine: WhisperEngine, clips: list[Clip]) -> Score:
    engine.load().result()
    transcribe(engine, clips[0])  # warm up
    audio_before = engine.audio_s
    cpu_before = time.process_time()
    wers = []
    for clip in clips:
        text = transcribe(engine, clip)
        wers.append((clip.name, word_error_rate(clip.text, text), text))
    return Score(wers, time.process_time() - cpu_before, engine.audio_s - audio_before)


def engine(model: WhisperModel | Path, beam_size: int, ack_prompt_below_s: float) -> WhisperEngine:
    built = WhisperEngine(model, workers=1, beam_size=beam_size)
    built.ack_prompt_below_s = ack_prompt_below_s
    return built


def candidates(extra: list[str]) -> list[Candidate]:
    """Today's decoding (greedy, no acknowledgment prompt) and the gateway's, per model."""
    models: list[tuple[str, WhisperModel | Path]] = []
    for found in (packaged_tiny_model(), packaged_base_model()):
        if found is not None and found.available:
            models.append((found.name, found))
    for item in extra:
        name, _, folder = item.partition("=")
        models.append((name, Path(folder)))
    out = []
    for name, model in models:
        out.append(Candidate(f"{name} greedy", engine(model, 1, 0.0)))
        out.append(Candidate(f"{name} beam 5", engine(model, 5, 0.0)))
        out.append(Candidate(f"{name} beam 5 + ack prompt", engine(model, 5, 1.5)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="WER and CPU of the local STT candidates")
    parser.add_argument("--model", action="append", default=[], help="NAME=model directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="every clip's text")
    parser.add_argument("--only", help="run only the candidates whose name has this")
    args = parser.parse_args()
    sets = {"eSpeak": sentence_clips(), **recorded_voice_clips(), "human": asterisk_clips()}
    print(", ".join(f"{name}: {len(clips)} clips" for name, clips in sets.items()))
    print(
        "| candidate | "
        + " | ".join(f"mean WER ({n}) | worst" for n in sets)
        + " | CPU s per audio s |"
    )
    print("| --- " * (2 * len(sets) + 2) + "|")
    for cand in candidates(args.model):
        if args.only and args.only not in cand.name:
            continue
        print("| " + " | ".join(_row(cand, sets, verbose=args.verbose)) + " |", flush=True)


def _row(cand: Candidate, sets: dict[str, list[Clip]], *, verbose: bool) -> list[str]:
    row = [cand.name]
    cpu = audio = 0.0
    for clips in sets.values():
        if not clips:
            row += ["-", "-"]
            continue
        result = score(cand.engine, clips)
        cpu += result.cpu_s
        audio += result.audio_s
        row.append(f"{statistics.mean(w for _, w, _ in result.wers):.3f}")
        row.append(f"{max(w for _, w, _ in result.wers):.2f}")
        if verbose:
            for name, wer, text in result.wers:
                print(f"    {name}: {wer:.2f} {text!r}")
    row.append(f"{cpu / max(audio, 1e-9):.3f}")
    return row


if __name__ == "__main__":
    main()
