"""What every speech provider promises, and the errors it may raise.

docs/protocol-session-v1.md (``speak``, "Errors") and docs/speech.md ("Catalog ids") fix the
outside: an app names a voice and a language by catalog id (``provider/voice`` and a BCP-47 tag),
the gateway speaks ``speak`` text through that provider, and a provider failure is reported to the
app as an ``error`` whose code is one of ``provider_unavailable``, ``provider_timeout``,
``invalid_catalog_id`` or ``feature_not_supported``. "AppBridge never switches providers on failure;
it reports the error", so the exceptions below carry exactly that code and nothing here retries
elsewhere.

Why an async generator of chunks: the output queue must start playing as soon as the first audio
exists (the caller is waiting), and ``output.interrupted`` must report ``heardText``, so every chunk
carries the word timings that are known by then. Timings are relative to the first sample of the
whole utterance, so the queue can compare them with its own count of samples played.

Streaming STT (docs/protocol-session-v1.md, "Turn and transcript events"): a call opens one
:class:`SttStream` when it starts (so the first turn pays no set-up), feeds it the caller's audio
frame by frame, and reads partial and final :class:`Transcript` results, which drive the turn
detector (:mod:`appbridge.turn.detector`) and ``transcript.partial``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

# The output queue owns WordTiming (it computes heardText from it); providers produce it.
from appbridge.media.output_queue import WordTiming

__all__ = [
    "FeatureNotSupported",
    "InvalidCatalogId",
    "ProviderTimeout",
    "ProviderUnavailable",
    "SpeechError",
    "SttProvider",
    "SttStream",
    "Transcript",
    "TtsChunk",
    "TtsProvider",
    "VoiceInfo",
    "WordTiming",
]


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """One entry of the speech catalog.

    ``id`` is the catalog id the app sends (``local/en-US``); ``languages`` are the BCP-47 tags the
    voice speaks, normalised (RFC 5646 section 2.1.1 case), best first; ``rate_hz`` is the sample
    rate of the PCM the provider yields for it.
    """

    id: str
    provider: str
    name: str
    languages: tuple[str, ...]
    rate_hz: int


@dataclass(slots=True)
class TtsChunk:
    """A piece of one utterance: signed 16-bit little-endian mono PCM at ``rate_hz``.

    ``words`` holds the words whose timing became known with this chunk; their ``start_ms`` and
    ``end_ms`` count from the first sample of the utterance's first chunk, not of this chunk. A word
    may arrive in a chunk after the one holding its first sample (its end is only known once the
    next word starts), but always before the utterance's last chunk ends.
    """

    pcm16: bytes
    rate_hz: int
    words: list[WordTiming] = field(default_factory=list)


class TtsProvider(Protocol):
    """A text-to-speech engine behind one catalog prefix (``local``, later ``deepgram``).

    ``synthesize`` is an async generator: the first chunk comes as soon as the engine has audio, and
    closing the generator (``aclose()``, or cancelling the task that iterates it) stops the engine's
    work promptly, since a ``clear`` or ``preempt`` (docs/protocol-session-v1.md) throws the rest
    away. It raises :class:`SpeechError` subclasses only; an empty or blank text yields nothing. Use
    it as ``async with contextlib.aclosing(p.synthesize(...)) as chunks``.
    """

    name: str

    def voices(self) -> Sequence[VoiceInfo]:
        """The provider's voices. Must be cheap: no engine is loaded to answer it."""
        ...

    def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]: ...


@dataclass(frozen=True, slots=True)
class Transcript:
    """A recognition result of a streaming STT session.

    ``is_final`` results are the provider's last word on a stretch of audio: the text of a turn
    is the sequence of its finals. Partial results (``is_final`` False) are interim guesses at the
    audio after the last final, each replacing the one before. ``confidence`` is 0 to 1 (0 for an
    empty text). ``start_ms`` and ``end_ms`` count from the stream's first fed sample, in audio
    time. A provider that endpoints utterances itself (``local``) sends exactly one final per
    utterance, with empty text when it heard no words.
    """

    text: str
    language: str
    confidence: float
    is_final: bool
    start_ms: int
    end_ms: int


class SttStream(Protocol):
    """One streaming recognition session, open for the length of a call.

    ``feed`` takes signed 16-bit little-endian mono PCM at the rate the stream was opened with,
    in pieces of any length, and returns at once: it never waits on the network or on a decoder
    (the provider buffers, coalesces or drops, and counts it, so a slow peer never stalls the
    media path). ``results()`` yields transcripts in order and ends after ``aclose()``; a provider
    failure is raised from it as a :class:`SpeechError` (``provider_unavailable`` or
    ``provider_timeout``), after which the stream yields nothing more. Changing language or hints
    (``listen.update``) means opening a new stream.

    ``finals_owed`` counts the final transcripts of audio already fed that ``results()`` has not
    yet yielded (an utterance closed and being decoded); a provider that cannot know says 0. The
    turn detector waits for an owed final rather than end a turn on a preview's text
    (docs/turn-taking.md, "The rules", 5).
    """

    @property
    def finals_owed(self) -> int: ...

    def feed(self, pcm16: bytes) -> None: ...

    def results(self) -> AsyncGenerator[Transcript, None]: ...

    async def aclose(self) -> None: ...


class SttProvider(Protocol):
    """A speech-to-text engine behind one catalog prefix (``local``, ``deepgram``).

    ``open_stream`` raises :class:`InvalidCatalogId` for a malformed language tag,
    :class:`FeatureNotSupported` for a tag the provider cannot recognise (or a rate it cannot
    take), and :class:`ProviderUnavailable` when the engine is missing. ``hints`` are words to
    favour (names, jargon). ``languages()`` lists the BCP-47 tags (or primary subtags) it
    recognises.
    """

    name: str

    def languages(self) -> Sequence[str]: ...

    async def open_stream(self, language: str, rate_hz: int, hints: Sequence[str]) -> SttStream: ...


class SpeechError(Exception):
    """Base of every speech failure. ``code`` is the session-protocol error code the app receives,
    and ``str(exc)`` is safe to send as the error's ``message`` (it never holds secrets)."""

    code: str = "internal"


class InvalidCatalogId(SpeechError):
    """A voice or language the catalog does not hold (docs/speech.md, "Catalog ids")."""

    code = "invalid_catalog_id"

    def __init__(self, kind: Literal["voice", "language"], value: str) -> None:
        self.kind: Literal["voice", "language"] = kind
        self.value = value
        super().__init__(f"unknown {kind} {value[:128]!r}")


class ProviderUnavailable(SpeechError):
    """The provider failed (engine missing, crashed, refused the request)."""

    code = "provider_unavailable"


class ProviderTimeout(SpeechError):
    """The provider did not answer in time."""

    code = "provider_timeout"


class FeatureNotSupported(SpeechError):
    """The provider cannot do what was asked (for example, a voice asked for a language it does
    not speak)."""

    code = "feature_not_supported"
