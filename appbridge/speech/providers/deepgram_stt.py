"""The ``deepgram`` provider's live speech-to-text: Nova over the ``/v1/listen`` WebSocket.

Wire format, as Deepgram documents it ("Live Audio", ``/reference/speech-to-text/
listen-streaming``): a WebSocket to ``{wss base}/v1/listen?model=nova-3&encoding=linear16&
sample_rate=..&channels=1&interim_results=true&language=..&punctuate=true&smart_format=true&
endpointing=..``, plus ``keyterm=`` (Nova-3) or ``keywords=`` (older models) once per hint, with
``Authorization: Token <key>``. Binary frames carry audio; the server answers with JSON
``Results`` (``is_final``, ``speech_final``, ``from_finalize``), ``Metadata``, ``UtteranceEnd``
and ``SpeechStarted``. The client sends ``KeepAlive`` ("every 3-5 seconds", ``/docs/audio-keep-
alive``: with no audio and no KeepAlive for 10 s the server closes with 1011 ``NET-0001``),
``Finalize`` (``/docs/finalize``) and ``CloseStream`` (``/docs/close-stream``, answered with the
last results and a ``Metadata`` summary before the close). A refused handshake is an HTTP
4xx/5xx with the ``{"err_code", "err_msg", "request_id"}`` body; a failure mid-stream is a close
frame 1008 ``DATA-0000`` (undecodable audio) or 1011 ``NET-0000`` / ``NET-0001`` (timeouts)
("STT Troubleshooting WebSocket, NET, and DATA Errors").

Errors (docs/protocol-session-v1.md, "Errors"; never a switch to another provider):
``ProviderUnavailable`` for a refused connection, 401/403, 402/429, 5xx, a malformed message or a
close we did not ask for; ``ProviderTimeout`` for a handshake that does not finish within
``open_timeout_s``, results that stop coming while audio goes out, and ``NET-*`` closes;
``FeatureNotSupported`` for a language or sample rate the model does not take, or a 400.

Layout: :class:`ListenSession` holds every decision and no I/O (time is an argument); the
asyncio shell :class:`DeepgramSttStream` owns the socket, one writer task and one reader task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from appbridge.clock import Clock, SystemClock
from appbridge.protocol import json_bounds
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderTimeout,
    ProviderUnavailable,
    SpeechError,
    Transcript,
)
from appbridge.speech.catalog import normalize_language_tag
from appbridge.speech.providers.deepgram import DEFAULT_BASE_URL, PROVIDER_NAME, error_from_http

if TYPE_CHECKING:
    from appbridge.config import DeepgramConfig

log = logging.getLogger(__name__)

STT_RATES_HZ: Final = frozenset({8000, 16000, 22050, 24000, 32000, 44100, 48000})
MAX_HINTS: Final = 100
MAX_HINT_CHARS: Final = 100

# Nova-3 streaming languages (/docs/models-languages-overview and its changelog). Other models
# are not checked here; Deepgram answers an unsupported one with 400 (feature_not_supported).
NOVA3_LANGUAGES: Final = (
    "multi", "en", "en-US", "en-AU", "en-GB", "en-IN", "en-NZ", "es", "es-419", "fr", "fr-CA",
    "pt", "pt-BR", "pt-PT", "de", "de-CH", "nl", "nl-BE", "sv", "sv-SE", "da", "da-DK", "it",
    "tr", "no", "id", "bg", "cs", "fi", "hi", "hu", "ja", "ko", "ko-KR", "pl", "ru", "uk", "vi",
    "ca", "et", "el", "lv", "lt", "ms", "ro", "sk", "zh", "zh-CN", "zh-TW", "zh-Hans", "zh-Hant",
    "hr", "gu", "gu-IN", "mr", "be",
)  # fmt: skip
_NOVA3_BY_LOWER: Final = {tag.lower(): tag for tag in NOVA3_LANGUAGES}

KEEPALIVE: Final = '{"type":"KeepAlive"}'
FINALIZE: Final = '{"type":"Finalize"}'
CLOSE_STREAM: Final = '{"type":"CloseStream"}'


# ---------------------------------------------------------------------------------------------
# The sans-I/O session core


@dataclass(frozen=True, slots=True)
class DeepgramTranscript(Transcript):
    """A ``Results`` message: :class:`Transcript` plus Deepgram's endpointing flags.

    ``speech_final``: Deepgram's endpointing saw the speaker pause; ``from_finalize``: the
    result answers our ``Finalize``.
    """

    speech_final: bool = False
    from_finalize: bool = False


@dataclass(frozen=True, slots=True)
class ListenOptions:
    """The query of one ``/v1/listen`` connection ("Live Audio" reference)."""

    model: str
    language: str
    rate_hz: int
    hints: tuple[str, ...] = ()
    endpointing_ms: int | None = 300
    utterance_end_ms: int | None = None
    vad_events: bool = False

    def query(self) -> str:
        params: list[tuple[str, str]] = [
            ("model", self.model),
            ("encoding", "linear16"),
            ("sample_rate", str(self.rate_hz)),
            ("channels", "1"),
            ("interim_results", "true"),
            ("language", self.language),
            ("punctuate", "true"),
            ("smart_format", "true"),
            ("endpointing", "false" if self.endpointing_ms is None else str(self.endpointing_ms)),
        ]
        if self.utterance_end_ms is not None:
            params.append(("utterance_end_ms", str(self.utterance_end_ms)))
        if self.vad_events:
            params.append(("vad_events", "true"))
        # Nova-3 takes keyterm prompting; earlier models take keywords (/docs/keyterm).
        hint_key = "keyterm" if self.model.startswith("nova-3") else "keywords"
        params.extend((hint_key, hint) for hint in self.hints)
        return urlencode(params)


def clean_hints(hints: Iterable[str]) -> tuple[str, ...]:
    """Non-blank, de-duplicated hints, each at most 100 characters, at most 100 of them."""
    seen = dict.fromkeys(h.strip()[:MAX_HINT_CHARS] for h in hints if h and h.strip())
    return tuple(seen)[:MAX_HINTS]


class ListenSession:
    """One live transcription session, without I/O.

    The shell calls :meth:`feed`, :meth:`finalize` and :meth:`close` as the call asks, sends what
    :meth:`data_to_send` returns, passes every server text frame to :meth:`receive_text`, and wakes
    at :meth:`next_deadline` to call :meth:`check_timeout`. Audio waits in a bounded buffer, so
    feeding never waits on the network: past ``max_buffered_bytes`` new audio is dropped and
    counted, so a slow Deepgram never stalls the media path. A ``KeepAlive`` goes out when nothing
    was sent for ``keepalive_interval_s``. If audio went out and no server message came for
    ``response_timeout_s``, the session has stalled (:class:`ProviderTimeout`).
    """

    def __init__(
        self,
        language: str,
        *,
        now: float,
        keepalive_interval_s: float = 4.0,
        response_timeout_s: float = 20.0,
        max_buffered_bytes: int = 320_000,
    ) -> None:
        self.language = language
        self._keepalive_interval_s = keepalive_interval_s
        self._response_timeout_s = response_timeout_s
        self._max_buffered_bytes = max_buffered_bytes
        self._outbox: deque[bytes | str] = deque()
        self._buffered_bytes = 0
        self._last_sent_s = now
        self._waiting_since_s: float | None = None
        self.closing = False
        self.dropped_bytes = 0
        self.keepalives_sent = 0
        self.request_id: str | None = None
        self.last_utterance_end_s: float | None = None
        self.last_speech_started_s: float | None = None

    def feed(self, pcm16: bytes) -> None:
        if self.closing or not pcm16:  # an empty binary frame would end the stream
            return
        if self._buffered_bytes + len(pcm16) > self._max_buffered_bytes:
            self.dropped_bytes += len(pcm16)
            return
        if self._outbox and isinstance(self._outbox[-1], bytes):
            self._outbox[-1] += pcm16
        else:
            self._outbox.append(pcm16)
        self._buffered_bytes += len(pcm16)

    def finalize(self) -> None:
        """Ask for the final result of the audio sent so far (``Finalize``)."""
        if not self.closing:
            self._outbox.append(FINALIZE)

    def close(self) -> None:
        """Flush and end (``CloseStream``): the server answers what is left, then closes."""
        if not self.closing:
            self.closing = True
            self._outbox.append(CLOSE_STREAM)

    def data_to_send(self, now: float) -> list[bytes | str]:
        out = list(self._outbox)
        self._outbox.clear()
        self._buffered_bytes = 0
        if any(isinstance(item, bytes) for item in out) and self._waiting_since_s is None:
            self._waiting_since_s = now
        if not out and not self.closing and now - self._last_sent_s >= self._keepalive_interval_s:
            out.append(KEEPALIVE)
            self.keepalives_sent += 1
        if out:
            self._last_sent_s = now
        return out

    def next_deadline(self) -> float:
        deadline = self._last_sent_s + self._keepalive_interval_s
        if self._waiting_since_s is not None:
            deadline = min(deadline, self._waiting_since_s + self._response_timeout_s)
        return deadline

    def check_timeout(self, now: float) -> None:
        if (
            self._waiting_since_s is not None
            and now - self._waiting_since_s >= self._response_timeout_s
        ):
            raise ProviderTimeout(
                f"Deepgram STT sent nothing for {self._response_timeout_s:g} s of audio"
            )

    def receive_text(self, text: str) -> DeepgramTranscript | None:
        """One server message; a transcript, or None for the other kinds. Unknown types are
        skipped (Deepgram adds types); a message that is not what the docs say is an error."""
        self._waiting_since_s = None
        try:
            message = json_bounds.loads(text)
        except ValueError:
            raise ProviderUnavailable("Deepgram STT sent a malformed message") from None
        if not isinstance(message, dict):
            raise ProviderUnavailable("Deepgram STT sent a malformed message")
        kind = message.get("type")
        if kind == "Results":
            return self._results(message)
        if kind == "Metadata":
            request_id = message.get("request_id")
            self.request_id = request_id if isinstance(request_id, str) else None
        elif kind == "UtteranceEnd":
            self.last_utterance_end_s = _number(message, "last_word_end")
        elif kind == "SpeechStarted":
            self.last_speech_started_s = _number(message, "timestamp")
        elif kind == "Error":
            description = message.get("description") or message.get("message") or ""
            raise ProviderUnavailable(f"Deepgram STT error: {str(description)[:120]}")
        return None

    def _results(self, message: dict[str, Any]) -> DeepgramTranscript:
        try:
            alternative = message["channel"]["alternatives"][0]
            text = alternative["transcript"]
            confidence = float(alternative.get("confidence", 0.0))
            start_s = float(message["start"])
            duration_s = float(message["duration"])
            languages = alternative.get("languages") or [self.language]
            if not isinstance(text, str) or not isinstance(languages[0], str):
                raise TypeError
        except (KeyError, IndexError, TypeError, ValueError):
            raise ProviderUnavailable("Deepgram STT sent a malformed Results message") from None
        return DeepgramTranscript(
            text=text,
            language=languages[0],
            confidence=min(max(confidence, 0.0), 1.0) if text else 0.0,
            is_final=message.get("is_final") is True,
            start_ms=round(start_s * 1000),
            end_ms=round((start_s + duration_s) * 1000),
            speech_final=message.get("speech_final") is True,
            from_finalize=message.get("from_finalize") is True,
        )

    def close_error(self, code: int | None, reason: str) -> SpeechError | None:
        """How the server's close frame ends the session (None: a clean end we asked for)."""
        if "NET-0000" in reason or "NET-0001" in reason:
            return ProviderTimeout(f"Deepgram STT closed the stream on a timeout ({reason[:8]})")
        if "DATA-0000" in reason:
            return ProviderUnavailable("Deepgram STT could not decode the audio (DATA-0000)")
        if code in (1000, 1001) and self.closing:
            return None
        return ProviderUnavailable(f"Deepgram STT closed the stream ({code})")


def _number(message: dict[str, Any], key: str) -> float | None:
    value = message.get(key)
    return float(value) if isinstance(value, int | float) else None


# ---------------------------------------------------------------------------------------------
# The asyncio shell


@dataclass(slots=True)
class _End:
    error: SpeechError | None = None


@dataclass(slots=True)
class _Pending:
    items: asyncio.Queue[DeepgramTranscript | _End] = field(default_factory=asyncio.Queue)
    ended: bool = False

    def end(self, error: SpeechError | None) -> None:
        if not self.ended:
            self.ended = True
            self.items.put_nowait(_End(error))


class DeepgramSttStream:
    """One open ``/v1/listen`` socket for a call (:class:`appbridge.speech.base.SttStream`).

    A writer task sends what the :class:`ListenSession` has (audio, control, KeepAlive) and a
    reader task turns server messages into transcripts. ``results()`` yields them and raises the
    :class:`SpeechError` that ended the stream, if any; it is meant for one consumer. A send
    that Deepgram does not take within ``send_timeout_s`` (it stopped reading) is a timeout too:
    every write is bounded, so the gateway never waits on a peer.
    """

    def __init__(
        self,
        ws: ClientConnection,
        session: ListenSession,
        *,
        clock: Clock,
        close_timeout_s: float = 2.0,
        send_timeout_s: float = 10.0,
    ) -> None:
        self._ws = ws
        self.session = session
        self._clock = clock
        self._close_timeout_s = close_timeout_s
        self._send_timeout_s = send_timeout_s
        self._pending = _Pending()
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write(), name="deepgram-stt-writer")
        self._reader = asyncio.create_task(self._read(), name="deepgram-stt-reader")

    @property
    def finals_owed(self) -> int:
        """Deepgram endpoints on its side, so the gateway cannot know a final is coming."""
        return 0

    def feed(self, pcm16: bytes) -> None:
        self.session.feed(pcm16)
        self._wake.set()

    def finalize(self) -> None:
        """Ask Deepgram to finalise what it heard now (e.g. when the turn detector ends a turn)."""
        self.session.finalize()
        self._wake.set()

    async def results(self) -> AsyncGenerator[Transcript, None]:
        while True:
            item = await self._pending.items.get()
            if isinstance(item, _End):
                self._pending.items.put_nowait(_End())  # later calls end at once
                if item.error is not None:
                    raise item.error
                return
            yield item

    async def aclose(self) -> None:
        """Send ``CloseStream``, give the server ``close_timeout_s`` to flush, then close."""
        if not self._reader.done():
            self.session.close()
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._close_timeout_s):
                    await asyncio.shield(self._reader)
        for task in (self._writer, self._reader):
            task.cancel()
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)
        await self._ws.close()
        self._pending.end(None)

    async def _write(self) -> None:
        try:
            while True:
                self._wake.clear()
                now = self._clock.now()
                self.session.check_timeout(now)
                try:
                    async with asyncio.timeout(self._send_timeout_s):
                        for item in self.session.data_to_send(now):
                            await self._ws.send(item)
                except TimeoutError:
                    raise ProviderTimeout("Deepgram STT stopped taking audio") from None
                delay_s = max(0.0, self.session.next_deadline() - self._clock.now())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await self._wake.wait()
        except SpeechError as exc:
            self._pending.end(exc)
            await self._ws.close()
        except ConnectionClosed:
            return  # the reader reports how it ended
        except Exception:  # the task's boundary: the call must learn that STT is gone
            log.exception("Deepgram STT writer failed")
            self._pending.end(ProviderUnavailable("Deepgram STT failed"))
            await self._ws.close()

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if isinstance(message, str):
                    transcript = self.session.receive_text(message)
                    if transcript is not None:
                        self._pending.items.put_nowait(transcript)
        except SpeechError as exc:
            self._pending.end(exc)
            await self._ws.close()
            return
        except ConnectionClosed:
            pass
        except Exception:  # the task's boundary, as in _write
            log.exception("Deepgram STT reader failed")
            self._pending.end(ProviderUnavailable("Deepgram STT failed"))
            await self._ws.close()
            return
        reason = self._ws.close_reason or ""
        self._pending.end(self.session.close_error(self._ws.close_code, reason))


class DeepgramSttProvider:
    """STT provider ``deepgram``: Nova live transcription (:class:`SttProvider`)."""

    name: str = PROVIDER_NAME

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        model: str = "nova-3",
        endpointing_ms: int | None = 300,
        open_timeout_s: float = 5.0,
        keepalive_interval_s: float = 4.0,
        response_timeout_s: float = 20.0,
        close_timeout_s: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        scheme, rest = base_url.rstrip("/").split("://", 1)
        self._listen_url = ("wss" if scheme == "https" else "ws") + "://" + rest + "/v1/listen"
        self._api_key = api_key
        self.model = model
        self._endpointing_ms = endpointing_ms
        self._open_timeout_s = open_timeout_s
        self._keepalive_interval_s = keepalive_interval_s
        self._response_timeout_s = response_timeout_s
        self._close_timeout_s = close_timeout_s
        self._clock = clock or SystemClock()

    @classmethod
    def from_config(cls, config: DeepgramConfig, **options: Any) -> DeepgramSttProvider:
        return cls(config.api_key, base_url=config.base_url, model=config.stt_model, **options)

    def languages(self) -> Sequence[str]:
        """Nova-3's language codes; empty for a model whose list is not kept here (any
        well-formed tag is then tried, and Deepgram's 400 becomes ``feature_not_supported``)."""
        return NOVA3_LANGUAGES if self.model.startswith("nova-3") else ()

    def resolve_language(self, language: str) -> str:
        """The ``language`` parameter for a normalised BCP-47 tag: the exact code the model
        lists, else its primary language; for models without a list here, the tag itself."""
        if not self.model.startswith("nova-3"):
            return language
        exact = _NOVA3_BY_LOWER.get(language.lower())
        if exact is not None:
            return exact
        primary = _NOVA3_BY_LOWER.get(language.split("-", 1)[0].lower())
        if primary is None:
            raise FeatureNotSupported(f"Deepgram {self.model} does not transcribe {language[:64]}")
        return primary

    async def open_stream(
        self, language: str, rate_hz: int, hints: Sequence[str]
    ) -> DeepgramSttStream:
        """Connect now (so the first turn pays no set-up) and return the running stream.

        Transcripts carry ``language`` as asked (normalised), unless Deepgram reports the
        language it detected (``multi``).
        """
        tag = normalize_language_tag(language)
        if tag is None:
            raise InvalidCatalogId("language", language)
        if rate_hz not in STT_RATES_HZ:
            raise FeatureNotSupported(f"Deepgram STT does not take audio at {rate_hz} Hz")
        options = ListenOptions(
            self.model,
            self.resolve_language(tag),
            rate_hz,
            clean_hints(hints),
            self._endpointing_ms,
        )
        url = f"{self._listen_url}?{options.query()}"
        try:
            ws = await connect(
                url,
                additional_headers={"Authorization": f"Token {self._api_key}"},
                open_timeout=self._open_timeout_s,
                max_size=1 << 20,
                close_timeout=self._close_timeout_s,
            )
        except InvalidStatus as exc:
            body = bytes(exc.response.body or b"")
            raise error_from_http(exc.response.status_code, body, "STT") from None
        except TimeoutError:
            raise ProviderTimeout(
                f"Deepgram STT did not connect within {self._open_timeout_s:g} s"
            ) from None
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            raise ProviderUnavailable(
                f"Deepgram STT is unreachable ({type(exc).__name__})"
            ) from None
        session = ListenSession(
            tag,
            now=self._clock.now(),
            keepalive_interval_s=self._keepalive_interval_s,
            response_timeout_s=self._response_timeout_s,
        )
        return DeepgramSttStream(
            ws, session, clock=self._clock, close_timeout_s=self._close_timeout_s
        )
