"""Can the sound of an utterance's first 240 to 440 ms tell a sentence from an acknowledgment?

docs/turn-taking.md, "Barge-in": ``turn.user_started`` waits 0.7 s because the recogniser's words
from a fragment cannot tell "mm-hmm" from a sentence's start. This probe asks the question of the
sound itself. Whisper tiny.en's encoder (the local STT's model,
:meth:`WhisperEngine.encode`) turns the audio from 200 ms before the onset up to 240, 340 or 440
ms after it into one row per 20 ms; four segment means and the maximum over the rows make a
vector, and a logistic regression per cut says "sentence" or not. A clip counts as announced
early at the first cut whose score passes that cut's threshold, and otherwise at 720 ms, the
gateway's ``confirm_speech_s`` (the detector's 0.7 s after the 2-frame onset).

It learns from bench/onset_corpus.py, never from the clips it is tested on. Each voice built from
recordings that bench/speech_corpus.py has (Festival's slt, Flite's rms and awb) is held out in
turn: the model learns from eSpeak's variant voices and the other recorded voices, each
threshold is the score that 0.5 % of the acknowledgments of the voices it learned from pass
(scored by models that had not seen their voice), and the held-out voice's sentences and
acknowledgments are scored. A model that learned from every voice then scores the eSpeak clips
bench/bargein.py plays (two voices none of the variants is), the human prompts, and the digit
"oh" of the same recordings as a human acknowledgment. Nothing here asserts, and nothing of it
runs in the gateway: it prints a table (about 30 minutes on one core).

    python -m bench.onset_probe
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from appbridge.media.codecs import AudioFormat, Converter
from appbridge.speech.providers.local_stt import shared_whisper_engine
from appbridge.turn.vad import Vad
from bench.bargein import percentile
from bench.onset_corpus import RECORDED, espeak_samples, recorded_samples
from bench.speech_corpus import (
    ASTERISK_ACKNOWLEDGMENTS,
    Clip,
    asterisk_clips,
    backchannel_clips,
    recorded_backchannel_clips,
    recorded_voice_clips,
    sentence_clips,
    silence,
)

CUTS = (240, 340, 440)  # ms after the onset
CONFIRM_MS = 720  # when the detector announces a turn today
PREROLL_MS = 200
FALSE_START_RATE = 0.005
Matrix = npt.NDArray[np.float32]
Model = tuple[Matrix, Matrix, Matrix, float]


@dataclass(slots=True)
class Features:
    """One row per clip and cut, the labels, the voices and what encoding cost."""

    rows: dict[int, list[Matrix]] = field(default_factory=lambda: {c: [] for c in CUTS})
    labels: list[int] = field(default_factory=list)
    voices: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    encode_s: list[float] = field(default_factory=list)

    def add(self, pcm8: bytes, label: int, voice: str, name: str) -> None:
        vectors = clip_vectors(silence(400) + pcm8 + silence(300), self.encode_s)
        if vectors is None:
            return
        for cut, vector in vectors.items():
            self.rows[cut].append(vector)
        self.labels.append(label)
        self.voices.append(voice)
        self.names.append(name)

    def matrix(self, cut: int) -> Matrix:
        return np.array(self.rows[cut], dtype=np.float32)


def onset_frame(pcm8: bytes) -> int | None:
    """The first frame of the first two-speech-frame run: the detector's onset (rule 1)."""
    vad, previous = Vad(8000), False
    for k in range(len(pcm8) // 320):
        speech = vad.is_speech(pcm8[k * 320 : (k + 1) * 320])
        if speech and previous:
            return k - 1
        previous = speech
    return None


def clip_vectors(pcm8: bytes, encode_s: list[float]) -> dict[int, Matrix] | None:
    first = onset_frame(pcm8)
    if first is None:
        return None
    pcm16k = Converter(AudioFormat("pcm16", 8000), AudioFormat("pcm16", 16000)).convert(pcm8)
    engine, out = shared_whisper_engine(), {}
    for cut in CUTS:
        start, end = max(0, first * 20 - PREROLL_MS), first * 20 + cut
        began = time.perf_counter()
        rows = engine.encode(pcm16k[start * 32 : end * 32])[: (end - start) // 20]
        encode_s.append(time.perf_counter() - began)
        parts = [p.mean(0) for p in np.array_split(rows, 4)]
        out[cut] = np.concatenate([*parts, rows.max(0)]).astype(np.float32)
    return out


def fit(x: Matrix, y: npt.NDArray[np.int_], l2: float = 1e-2, steps: int = 600) -> Model:
    """A class-balanced, L2-regularised logistic regression on standardised rows, by Adam."""
    mu, sd = x.mean(0), x.std(0) + 1e-6
    z = (x - mu) / sd
    w, b = np.zeros(z.shape[1], dtype=np.float32), 0.0
    weight = np.where(y == 1, 0.5 / y.mean(), 0.5 / (1 - y.mean()))
    m, v, mb, vb = np.zeros_like(w), np.zeros_like(w), 0.0, 0.0
    for t in range(1, steps + 1):
        err = weight * (1 / (1 + np.exp(-(z @ w + b))) - y)
        g, gb = err @ z / len(y) + l2 * w, float(err.mean())
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        mb, vb = 0.9 * mb + 0.1 * gb, 0.999 * vb + 0.001 * gb * gb
        w -= 0.05 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        b -= 0.05 * (mb / (1 - 0.9**t)) / (np.sqrt(vb / (1 - 0.999**t)) + 1e-8)
    return mu, sd, w, b


def score(model: Model, x: Matrix) -> Matrix:
    mu, sd, w, b = model
    scores: Matrix = (((x - mu) / sd) @ w + b).astype(np.float32)
    return scores


def train(data: Features, keep: npt.NDArray[np.bool_]) -> dict[int, tuple[Model, float]]:
    """Per cut, a model of the kept rows and its threshold from held-out recorded voices."""
    y, voices = np.array(data.labels), np.array(data.voices)
    recorded = sorted({v for v in voices[keep] if not v.startswith("espeak:")})
    out = {}
    for cut in CUTS:
        x = data.matrix(cut)
        unseen = np.full(len(y), np.nan)
        for voice in recorded:
            test = keep & (voices == voice)
            unseen[test] = score(fit(x[keep & ~test], y[keep & ~test]), x[test])
        acks = np.sort(unseen[keep & (y == 0) & ~np.isnan(unseen)])
        threshold = float(acks[min(len(acks) - 1, int(len(acks) * (1 - FALSE_START_RATE)))])
        out[cut] = (fit(x[keep], y[keep]), threshold)
    return out


def decisions(models: dict[int, tuple[Model, float]], data: Features) -> list[int | None]:
    """The first cut at which each clip would be announced as a sentence, or None."""
    passed = {c: score(m, data.matrix(c)) > t for c, (m, t) in models.items()}
    return [next((c for c in CUTS if passed[c][i]), None) for i in range(len(data.labels))]


def clips(items: list[Clip], label: int, voice: str) -> Features:
    out = Features()
    for clip in items:
        out.add(clip.pcm16, label, voice, clip.name)
    return out


def row(name: str, sentences: list[int | None], acks: list[int | None], cost_ms: float) -> str:
    latency = sorted(CONFIRM_MS if d is None else d + cost_ms for d in sentences)
    p50 = percentile(latency, 0.5) if latency else float("nan")
    p95 = percentile(latency, 0.95) if latency else float("nan")
    by_cut = "/".join(str(sum(d == c for d in sentences)) for c in CUTS)
    early = sum(d is not None for d in acks)
    return (
        f"| {name} | {by_cut} of {len(sentences)} | {p50:.0f} / {p95:.0f} | "
        f"{early} of {len(acks)} |"
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    data = Features()
    samples = itertools.chain(espeak_samples(), *(recorded_samples(v) for v in RECORDED))
    for sample in samples:
        data.add(sample.pcm16, sample.label, sample.voice, sample.text)
    cost_ms = 1000 * float(np.mean(data.encode_s))
    print(f"{len(data.labels)} training clips; an encode takes {cost_ms:.0f} ms on average")
    print("| tested on | sentences announced at 240/340/440 ms | p50 / p95 ms | acks announced |")
    print("| --- | --- | --- | --- |")
    voices = np.array(data.voices)
    tested = {"festival-slt-hts": "festival", "flite-rms": "rms", "flite-awb": "awb"}
    spoken = recorded_voice_clips()
    every: tuple[list[int | None], list[int | None]] = ([], [])
    for name, voice in tested.items():
        if name not in spoken:
            continue
        models = train(data, voices != voice)
        sentences = decisions(models, clips(spoken[name], 1, voice))
        acks_clips = [c for c in recorded_backchannel_clips() if c.name.endswith("@" + name)]
        acks = decisions(models, clips(acks_clips, 0, voice))
        every[0].extend(sentences)
        every[1].extend(acks)
        print(row(f"{name} (held out)", sentences, acks, cost_ms), flush=True)
    print(row("the three held out, together", *every, cost_ms))
    models = train(data, np.ones(len(voices), dtype=bool))
    espeak = decisions(models, clips(sentence_clips(), 1, "espeak"))
    print(
        row(
            "eSpeak en-US, en-GB",
            espeak,
            decisions(models, clips(backchannel_clips(), 0, "")),
            cost_ms,
        )
    )
    human = clips(asterisk_clips(), 1, "")
    passed = decisions(models, human)
    print(row("human prompts; the digit oh", passed, decisions(models, human_acks()), cost_ms))
    late = [n for n, d in zip(human.names, passed, strict=True) if d is None]
    print("human prompts not passed by 440 ms:", ", ".join(late))


def human_acks() -> Features:
    return clips(asterisk_clips(ASTERISK_ACKNOWLEDGMENTS), 0, "")


if __name__ == "__main__":
    main()
