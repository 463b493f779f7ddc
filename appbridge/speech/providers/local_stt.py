"""The offline ``local`` STT provider: Whisper tiny.en on CTranslate2, with a VAD endpointer.

docs/turn-taking.md, "The offline `local` STT": the embedded default needs speech recognition with
nothing downloaded at run time. We chose Whisper tiny.en over pocketsphinx 5 (whose wheel ships
its own en-us model and streams partials) on measurement: on telephone-band synthesised sentences
(eSpeak NG -> 8 kHz µ-law -> back) Whisper tiny.en had a word error rate of about 0.2 where
pocketsphinx had 0.86 (docs/turn-taking.md, "Choosing it"). The model and its decoding are
:mod:`appbridge.speech.providers.whisper_engine`'s; this module holds the streams.

Theory of operation: Whisper is not a streaming recogniser: it transcribes a whole window of
audio. So each stream runs its own endpointer (:class:`appbridge.turn.vad.Segmenter`, sans-I/O):
the WebRTC VAD cuts the caller's audio into utterances. While an utterance grows, every
``partial_every_ms`` of speech asks for a partial transcript of the audio so far;
``endpoint_ms`` of silence closes it and asks for the final one. Every utterance gets exactly one
final transcript, empty when the model heard no words (the turn detector relies on that to tell a
cough from a word; docs/turn-taking.md, "The rules"). ``finals_owed`` counts the finals still to
come, so that a turn on a loaded machine ends with its final's text and not with a preview's.
Opening a stream costs nothing: the engine is the process's.

Back-pressure (the media path never waits on a decoder): a stream has at most one decode in flight.
Finals queue behind it (they are never dropped; when four are waiting, consecutive ones are
merged into one decode, counted in ``finals_coalesced``); a newer partial replaces a waiting one
(``partials_coalesced``); a partial is dropped when the pool's queue holds at least twice as many
decodes as it has workers (``partials_dropped``) or when its utterance is already final. A
provider's streams share one :class:`SttStats`, which ``/metrics`` reads with the engine's own.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import Future
from typing import Final, Protocol

from appbridge.media.resample import RatecvState, ratecv
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderUnavailable,
    SpeechError,
    Transcript,
)
from appbridge.speech.catalog import normalize_language_tag, primary_language
from appbridge.speech.providers.log_mel import MODEL_RATE_HZ, log_mel
from appbridge.speech.providers.whisper_engine import (
    Recognition,
    WhisperEngine,
    shared_whisper_engine,
)
from appbridge.speech.stt_stats import SttStats
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

PROVIDER_NAME: Final = "local"
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
        # When each final not yet yielded by results() had its utterance closed, oldest first.
        self._owed_since: deque[float] = deque()
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
        return 0 if self._closed or self._failed else len(self._owed_since)

    def owed_for_s(self) -> float:
        """How long the oldest final still owed has waited since its utterance closed; 0 when
        none is owed. Admission control reads it (docs/configuration.md, "Admission control")."""
        if self._closed or self._failed or not self._owed_since:
            return 0.0
        return max(0.0, self._loop.time() - self._owed_since[0])

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
            if item.is_final and self._owed_since:
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
        self._streams: weakref.WeakSet[LocalSttStream] = weakref.WeakSet()

    def lag_s(self) -> float:
        """How far behind the recogniser is: the longest any live stream's oldest owed final
        has waited (0 when nothing is owed). One pass over the streams; read per call offer."""
        return max((stream.owed_for_s() for stream in self._streams), default=0.0)

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
        stream = LocalSttStream(engine, loop, tag, rate_hz, hint_ids, segmenter, stats=self.stats)
        self._streams.add(stream)
        return stream
