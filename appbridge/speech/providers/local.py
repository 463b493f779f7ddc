"""The offline ``local`` TTS provider: eSpeak NG, bundled by the ``espeakng-loader`` wheel.

docs/speech.md, "The `local` provider": the embedded default speaks with a provider named ``local``
whose default voice is ``local/en-US``, with nothing downloaded at run time. eSpeak NG fits: the
wheel carries ``libespeak-ng.so`` and its data directory, it synthesises several hundred times
faster than real time on one core, and it reports WORD events, from which ``heardText`` is computed.

Theory of operation
-------------------
eSpeak NG's API (``speak_lib.h``) is one global engine and is not thread-safe, so every request
runs on ONE worker thread, owned by a process-wide :class:`EspeakEngine` (a per-provider thread
would let two providers drive the same global engine at once). Requests are serialised by that
thread's queue. The engine runs in ``AUDIO_OUTPUT_SYNCHRONOUS`` mode: ``espeak_Synth`` returns when
the text is done, and meanwhile calls our synth callback, on the worker thread, with a buffer of
about 60 ms of samples and the events that fall in it. The callback hands each buffer to a
:class:`ChunkAssembler`, and finished chunks go to the event loop with
``loop.call_soon_threadsafe`` into the request's ``asyncio.Queue``; the first audio reaches the
caller long before a long text is finished. ``ctypes`` releases the GIL during ``espeak_Synth``,
so the event loop keeps running.

Cancelling: closing the async generator sets the request's flag; the callback sees it on the next
buffer and returns 1, which aborts the synthesis (``speak_lib.h``: "Callback returns: 0=continue
synthesis, 1=abort synthesis"). A request still queued behind others is skipped when its turn
comes.

Word timings: a WORD event carries ``audio_position`` (ms from the start of this message's audio)
and ``text_position``, which eSpeak NG 1.52 counts in *characters* (code points) from 1, not in
UTF-8 bytes (checked: in "Café déjà vu, naïve", "naïve" is reported at 15, its byte offset is 18).
Positions are approximate: a number ("1234") yields one event per spoken word, all inside one
token, and a phrase from the dictionary ("déjà vu") yields events inside its first word. So
:class:`WordAligner` maps events onto the text's whitespace-separated tokens, never backwards, and
folds tokens that got no event of their own into the word before them; the words of an utterance
played to its end join back into the whole text.
"""

from __future__ import annotations

import array
import asyncio
import bisect
import ctypes
import logging
import re
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderTimeout,
    ProviderUnavailable,
    SpeechError,
    TtsChunk,
    VoiceInfo,
    WordTiming,
)
from appbridge.speech.workers import SpeechWorkers

log = logging.getLogger(__name__)

PROVIDER_NAME = "local"
DEFAULT_VOICE_ID = "local/en-US"
# What espeak_Initialize reports for the bundled data (all its voices share it). Checked again
# when the engine loads; chunks always carry the rate the engine actually reported.
ESPEAK_RATE_HZ = 22050


@dataclass(frozen=True, slots=True)
class _LocalVoice:
    info: VoiceInfo
    espeak_identifier: str  # path under espeak-ng-data/lang/, as espeak_SetVoiceByName takes it


def _voice(tag: str, name: str, identifier: str, *more_tags: str) -> _LocalVoice:
    info = VoiceInfo(
        id=f"{PROVIDER_NAME}/{tag}",
        provider=PROVIDER_NAME,
        name=f"{name} (eSpeak NG)",
        languages=(tag, *more_tags),
        rate_hz=ESPEAK_RATE_HZ,
    )
    return _LocalVoice(info, identifier)


# Each identifier is a voice file of the bundled data (tests/unit/test_local_tts.py checks).
_VOICES: tuple[_LocalVoice, ...] = (
    _voice("en-US", "English (America)", "gmw/en-US"),
    _voice("en-GB", "English (Great Britain)", "gmw/en"),
    _voice("es-ES", "Spanish (Spain)", "roa/es"),
    _voice("es-419", "Spanish (Latin America)", "roa/es-419", "es-MX"),
    _voice("fr-FR", "French (France)", "roa/fr"),
    _voice("de-DE", "German", "gmw/de"),
    _voice("it-IT", "Italian", "roa/it"),
    _voice("pt-BR", "Portuguese (Brazil)", "roa/pt-BR"),
    _voice("pt-PT", "Portuguese (Portugal)", "roa/pt"),
    _voice("nl-NL", "Dutch", "gmw/nl"),
)
_VOICES_BY_ID: dict[str, _LocalVoice] = {v.info.id: v for v in _VOICES}


# ---------------------------------------------------------------------------------------------
# speak_lib.h, as laid out on 64-bit Linux (API revision 12)

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # without it a missing data dir calls exit() in the library
_POS_CHARACTER = 1
_CHARS_UTF8 = 1  # no espeakSSML, no espeakPHONEMES: app text is never markup
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_PARAM_RATE = 1
_EE_OK = 0
_BUFFER_MS = 60


class _EspeakEventId(ctypes.Union):
    _fields_ = [
        ("number", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("string", ctypes.c_char * 8),
    ]


class _EspeakEvent(ctypes.Structure):
    # type (enum, int), unique_identifier (unsigned), text_position, length, audio_position (ms),
    # sample (ints), then user_data (a pointer, aligned to 8 at offset 24) and the id union:
    # 40 bytes on LP64.
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EspeakEventId),
    ]


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)


def _bind(lib: ctypes.CDLL) -> None:
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
    lib.espeak_SetSynthCallback.restype = None
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_SetParameter.restype = ctypes.c_int
    lib.espeak_Synth.argtypes = [
        ctypes.c_void_p,  # text
        ctypes.c_size_t,  # size
        ctypes.c_uint,  # position
        ctypes.c_int,  # position_type
        ctypes.c_uint,  # end_position
        ctypes.c_uint,  # flags
        ctypes.c_void_p,  # unique_identifier
        ctypes.c_void_p,  # user_data
    ]
    lib.espeak_Synth.restype = ctypes.c_int


# ---------------------------------------------------------------------------------------------
# Sans-I/O: engine output -> chunks with word timings


class WordAligner:
    """Turns eSpeak WORD events into :class:`WordTiming` s of the text's whitespace tokens.

    A word's end is the next word's start, or the end of the audio; so a word is complete only
    when the next event (or :meth:`finish`) arrives, and that is when it is returned.
    """

    _TOKEN = re.compile(r"\S+")

    def __init__(self, text: str) -> None:
        matches = list(self._TOKEN.finditer(text))
        self._tokens = [m.group() for m in matches]
        self._token_ends = [m.end() for m in matches]
        self._anchor = -1  # token the current word's event pointed at; -1 before the first event
        self._first = 0  # first token folded into the current word
        self._start_ms = 0
        self._last_end_ms = 0

    def on_word(self, text_position: int, audio_ms: int) -> list[WordTiming]:
        """A WORD event (``text_position`` counts characters from 1). Returns finished words."""
        if not self._tokens:
            return []
        index = bisect.bisect_right(self._token_ends, max(text_position - 1, 0))
        index = min(index, len(self._tokens) - 1)
        if index <= self._anchor:
            return []  # another spoken word inside the same token (a number, a phrase)
        start_ms = max(audio_ms, self._last_end_ms)
        if self._anchor < 0:
            self._anchor, self._start_ms = index, start_ms  # tokens before it join this word
            return []
        done = self._word(self._first, index, start_ms)
        self._anchor = self._first = index
        self._start_ms = start_ms
        return [done]

    def finish(self, end_ms: int) -> list[WordTiming]:
        """The audio ended at ``end_ms``: the word being spoken, and every token after it."""
        if self._anchor < 0 or self._first >= len(self._tokens):
            return []
        done = self._word(self._first, len(self._tokens), max(end_ms, self._start_ms))
        self._anchor = self._first = len(self._tokens)
        return [done]

    def _word(self, first: int, stop: int, end_ms: int) -> WordTiming:
        self._last_end_ms = end_ms
        return WordTiming(self._start_ms, end_ms, " ".join(self._tokens[first:stop]))


class ChunkAssembler:
    """Groups engine buffers into :class:`TtsChunk` s and attaches the finished words.

    The newest buffer is always held back, so that the utterance's last chunk has audio to carry
    the last word (whose end is the end of the audio); the first chunk goes out as soon as a second
    buffer exists, later ones once ``chunk_ms`` of audio is waiting, to keep the event loop's
    wake-ups few.
    """

    def __init__(self, text: str, rate_hz: int, chunk_ms: int) -> None:
        self._aligner = WordAligner(text)
        self._rate_hz = rate_hz
        self._chunk_bytes = max(2, rate_hz * chunk_ms // 1000 * 2)
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._words: list[WordTiming] = []
        self._sent_any = False
        self._total_samples = 0

    def feed(self, pcm16: bytes, word_events: Sequence[tuple[int, int]]) -> TtsChunk | None:
        """One engine buffer: its samples and its WORD events as (text_position, audio_ms)."""
        for text_position, audio_ms in word_events:
            self._words.extend(self._aligner.on_word(text_position, audio_ms))
        if not pcm16:
            return None
        self._held.append(pcm16)
        self._held_bytes += len(pcm16)
        self._total_samples += len(pcm16) // 2
        older_bytes = self._held_bytes - len(pcm16)
        if older_bytes < (self._chunk_bytes if self._sent_any else 2):
            return None
        chunk = TtsChunk(b"".join(self._held[:-1]), self._rate_hz, self._words)
        self._held = [pcm16]
        self._held_bytes = len(pcm16)
        self._words = []
        self._sent_any = True
        return chunk

    def finish(self) -> TtsChunk | None:
        """The engine is done: the held audio with every remaining word, or None if no audio."""
        end_ms = self._total_samples * 1000 // self._rate_hz
        self._words.extend(self._aligner.finish(end_ms))
        if not self._held:
            return None
        chunk = TtsChunk(b"".join(self._held), self._rate_hz, self._words)
        self._held, self._held_bytes, self._words = [], 0, []
        return chunk


def _pcm16_le(wav: ctypes._Pointer[ctypes.c_short], samples: int) -> bytes:
    data = ctypes.string_at(wav, samples * 2)
    if sys.byteorder == "big":  # the wire is little-endian PCM; eSpeak writes native shorts
        swapped = array.array("h", data)
        swapped.byteswap()
        data = swapped.tobytes()
    return data


# ---------------------------------------------------------------------------------------------
# The worker thread


class _End:
    """Sentinel: the request finished."""


_END = _End()
_Item = TtsChunk | SpeechError | _End


class _SynthJob:
    """One request, shared by the event loop (which reads its queue) and the worker thread."""

    def __init__(
        self,
        text: str,
        espeak_identifier: str,
        rate_wpm: int,
        chunk_ms: int,
        post: Callable[[_Item], None],
    ) -> None:
        self.text = text
        self.espeak_identifier = espeak_identifier
        self.rate_wpm = rate_wpm
        self.chunk_ms = chunk_ms
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self._post_to_loop = post
        self._assembler: ChunkAssembler | None = None

    def start(self, rate_hz: int) -> None:
        self._assembler = ChunkAssembler(self.text, rate_hz, self.chunk_ms)

    def feed(self, pcm16: bytes, word_events: Sequence[tuple[int, int]]) -> None:
        assert self._assembler is not None
        chunk = self._assembler.feed(pcm16, word_events)
        if chunk is not None:
            self.post(chunk)

    def finish(self) -> None:
        if self._assembler is not None and not self.cancelled.is_set():
            chunk = self._assembler.finish()
            if chunk is not None:
                self.post(chunk)
        self.post(_END)

    def post(self, item: _Item) -> None:
        if self.cancelled.is_set():
            return
        try:
            self._post_to_loop(item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()


@dataclass(slots=True)
class EngineStats:
    """Counters of the worker thread (written there only), for metrics and tests."""

    requests: int = 0  # requests that reached the worker
    aborted: int = 0  # cancelled before or during synthesis
    samples: int = 0  # samples produced, aborted requests' included


class EspeakEngine:
    """The process's one eSpeak NG instance and the one thread that may touch it.

    Nothing is loaded until the first request runs (``appbridge check-config`` must stay fast);
    the library is then loaded and initialised on the worker thread itself.
    """

    def __init__(self, library_path: str | None = None, data_path: str | None = None) -> None:
        self._library_path = library_path
        self._data_path = data_path
        self._lock = threading.Lock()
        self._executor: SpeechWorkers | None = None
        self._lib: ctypes.CDLL | None = None
        self._rate_hz = 0
        self._voice: str | None = None
        self._rate_wpm: int | None = None
        self._current: _SynthJob | None = None
        self._callback = _SynthCallback(self._on_synth)  # kept alive as long as the engine
        self.stats = EngineStats()

    @property
    def loaded(self) -> bool:
        return self._lib is not None

    def submit(self, job: _SynthJob) -> None:
        with self._lock:
            if self._executor is None:
                self._executor = SpeechWorkers(1, "appbridge-espeak")
            try:
                self._executor.submit(self._run, job)
            except RuntimeError as exc:  # interpreter shutting down
                raise ProviderUnavailable("the local speech engine is shut down") from exc

    def _load(self) -> ctypes.CDLL:
        if self._lib is not None:
            return self._lib
        try:
            import espeakng_loader

            library_path = self._library_path or espeakng_loader.get_library_path()
            data_path = self._data_path or espeakng_loader.get_data_path()
            lib = ctypes.CDLL(library_path)
            _bind(lib)
        except (ImportError, OSError, RuntimeError, AttributeError) as exc:
            raise ProviderUnavailable("the local speech engine (eSpeak NG) is missing") from exc
        rate_hz = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, data_path.encode(), _INITIALIZE_DONT_EXIT
        )
        if rate_hz <= 0:
            raise ProviderUnavailable("the local speech engine (eSpeak NG) could not start")
        if rate_hz != ESPEAK_RATE_HZ:
            log.warning("eSpeak NG reports %d Hz, the catalog says %d Hz", rate_hz, ESPEAK_RATE_HZ)
        lib.espeak_SetSynthCallback(self._callback)
        self._lib, self._rate_hz = lib, rate_hz
        return lib

    def _configure(self, lib: ctypes.CDLL, job: _SynthJob) -> None:
        if job.espeak_identifier != self._voice:
            if lib.espeak_SetVoiceByName(job.espeak_identifier.encode()) != _EE_OK:
                self._voice = None
                raise ProviderUnavailable(f"eSpeak NG has no voice {job.espeak_identifier}")
            self._voice = job.espeak_identifier
            self._rate_wpm = None  # a voice change resets the rate
        if job.rate_wpm != self._rate_wpm:
            lib.espeak_SetParameter(_PARAM_RATE, job.rate_wpm, 0)
            self._rate_wpm = job.rate_wpm

    def _run(self, job: _SynthJob) -> None:
        """One request, on the worker thread. This is the thread's boundary: whatever goes wrong
        is posted to the waiting coroutine, which would otherwise wait for its timeout."""
        self.stats.requests += 1
        if job.cancelled.is_set():
            self.stats.aborted += 1
            return
        try:
            lib = self._load()
            self._configure(lib, job)
            job.start(self._rate_hz)
            data = job.text.encode("utf-8")
            self._current = job
            try:
                result = lib.espeak_Synth(
                    data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
            finally:
                self._current = None
            if job.cancelled.is_set():
                self.stats.aborted += 1
                return
            if job.error is not None:
                raise job.error
            if result != _EE_OK:
                raise ProviderUnavailable(f"eSpeak NG synthesis failed ({result})")
            job.finish()
        except SpeechError as exc:
            job.post(exc)
        except Exception as exc:
            log.exception("local TTS failed")
            job.post(ProviderUnavailable(f"local TTS failed: {type(exc).__name__}"))

    def _on_synth(
        self,
        wav: ctypes._Pointer[ctypes.c_short],
        samples: int,
        events: ctypes._Pointer[_EspeakEvent],
    ) -> int:
        """eSpeak's synth callback (worker thread). Returns 1 to abort. Must never raise: an
        exception cannot cross into C, so it is kept on the job and re-raised after the synth."""
        job = self._current
        if job is None or job.cancelled.is_set():
            return 1
        try:
            word_events: list[tuple[int, int]] = []
            if events:
                i = 0
                while events[i].type != _EVENT_LIST_TERMINATED:
                    event = events[i]
                    if event.type == _EVENT_WORD:
                        word_events.append((event.text_position, event.audio_position))
                    i += 1
            pcm16 = _pcm16_le(wav, samples) if wav and samples > 0 else b""
            self.stats.samples += len(pcm16) // 2
            job.feed(pcm16, word_events)
        except Exception as exc:
            job.error = exc
            return 1
        return 1 if job.cancelled.is_set() else 0


_shared_engine: EspeakEngine | None = None
_shared_engine_lock = threading.Lock()


def shared_engine() -> EspeakEngine:
    """The process-wide engine (eSpeak NG has global state: one engine per process)."""
    global _shared_engine
    with _shared_engine_lock:
        if _shared_engine is None:
            _shared_engine = EspeakEngine()
        return _shared_engine


# ---------------------------------------------------------------------------------------------
# The provider


class LocalTtsProvider:
    """TTS provider ``local``: eSpeak NG voices, 16-bit mono PCM at 22050 Hz.

    ``rate_wpm`` is eSpeak's speaking rate (80 to 450 words per minute, 175 its default);
    ``timeout_s`` bounds the wait for each chunk, queueing behind other requests included
    (``provider_timeout``).
    """

    name: str = PROVIDER_NAME

    def __init__(
        self,
        *,
        rate_wpm: int = 175,
        chunk_ms: int = 250,
        timeout_s: float = 10.0,
        engine: EspeakEngine | None = None,
    ) -> None:
        if not 80 <= rate_wpm <= 450:
            raise ValueError("rate_wpm must be within 80..450 (speak_lib.h espeakRATE)")
        self._rate_wpm = rate_wpm
        self._chunk_ms = chunk_ms
        self._timeout_s = timeout_s
        self._engine = engine or shared_engine()

    def voices(self) -> Sequence[VoiceInfo]:
        return tuple(v.info for v in _VOICES)

    def espeak_identifier(self, voice_id: str) -> str:
        """The bundled eSpeak NG voice file behind a catalog id."""
        try:
            return _VOICES_BY_ID[voice_id].espeak_identifier
        except KeyError:
            raise InvalidCatalogId("voice", voice_id) from None

    async def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]:
        """Speak ``text``; see :class:`appbridge.speech.base.TtsProvider`."""
        identifier = self.espeak_identifier(voice.id)
        primary = language.split("-", 1)[0].lower()
        if all(tag.split("-", 1)[0].lower() != primary for tag in voice.languages):
            raise FeatureNotSupported(f"voice {voice.id} does not speak {language[:128]}")
        text = text.replace("\x00", " ")
        if not text.strip():
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue()

        def post(item: _Item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        job = _SynthJob(text, identifier, self._rate_wpm, self._chunk_ms, post)
        self._engine.submit(job)
        try:
            while True:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        item = await queue.get()
                except TimeoutError:
                    raise ProviderTimeout(
                        f"local TTS gave no audio within {self._timeout_s:g} s"
                    ) from None
                if isinstance(item, _End):
                    return
                if isinstance(item, SpeechError):
                    raise item
                yield item
        finally:
            job.cancelled.set()
