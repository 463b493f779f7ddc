"""The ``deepgram`` provider: the catalog, Aura TTS over REST, and what STT shares with it.

Live STT is in :mod:`appbridge.speech.providers.deepgram_stt`. Wire formats, as Deepgram
documents them (developers.deepgram.com):

* **TTS**, "Text to Speech REST" (``/docs/text-to-speech``, ``/docs/tts-media-output-settings``):
  ``POST {base}/v1/speak?model=aura-2-thalia-en&encoding=linear16&sample_rate=24000&
  container=none``, ``Authorization: Token <key>``, JSON body ``{"text": ...}``. The answer
  streams raw 16-bit PCM; an error is 4xx/5xx with ``{"err_code", "err_msg", "request_id"}``
  (``/reference/errors``).
* **Why REST and not the TTS WebSocket** (``wss://.../v1/speak``, Speak/Flush/Clear/Close): the
  session protocol hands us whole ``speak`` texts, not LLM tokens, so there is nothing to stream
  *in*; one request per item turns a ``clear`` into closing that request, with no ``Clear`` round
  trip on a shared socket whose next audio might still belong to the cleared item; and the pooled
  HTTP/1.1 connection lets every request after the first skip TCP and TLS set-up, which was the
  WebSocket's only latency advantage. Aura takes at most 2000 characters per request, so a longer
  text is spoken as consecutive requests, split after sentence ends.

Failures become session-protocol errors (docs/protocol-session-v1.md, "Errors"), never a switch to
another provider: ``ProviderUnavailable`` (refused connection, 401/403, 402/429, 5xx, a broken
stream), ``ProviderTimeout`` (no first audio within ``first_byte_timeout_s``, a stalled transfer)
and ``FeatureNotSupported`` (a language the voice does not speak, a 400 from Deepgram). Messages
never contain the API key.

heardText: Aura REST returns no word timings, so :func:`estimate_word_timings` spreads the words
over the audio by their length in characters (plus a pause after punctuation). The words of a
request are known once its audio is complete, and they ride on its last chunk. Aura sends audio
much faster than real time, so that is normally long before playback reaches them; a cut that
comes earlier reports the words of the requests already complete (none for a short text).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import TYPE_CHECKING, Final

import httpx

from appbridge.config.model import DEEPGRAM_AURA_VOICES as AURA_VOICES
from appbridge.protocol import json_bounds
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

if TYPE_CHECKING:
    from appbridge.config import DeepgramConfig

PROVIDER_NAME: Final = "deepgram"
DEFAULT_BASE_URL: Final = "https://api.deepgram.com"
TTS_RATE_HZ: Final = 24000  # Aura's default; linear16 also offers 8000/16000/32000/48000
TTS_MAX_CHARS: Final = 2000  # Aura REST's limit per request

# Aura's English voices are American; the others are named by language only (several accents).
_AURA_LANGUAGE_TAGS: Final = {"en": "en-US"}


# ---------------------------------------------------------------------------------------------
# Catalog


def voice_info(model: str) -> VoiceInfo:
    """The catalog entry of an Aura model; its language is the model name's last part."""
    suffix = model.rsplit("-", 1)[-1]
    name = model.split("-")[-2].capitalize() if model.count("-") >= 2 else model
    return VoiceInfo(
        id=f"{PROVIDER_NAME}/{model}",
        provider=PROVIDER_NAME,
        name=f"{name} (Deepgram Aura)",
        languages=(_AURA_LANGUAGE_TAGS.get(suffix, suffix),),
        rate_hz=TTS_RATE_HZ,
    )


def _models(default_model: str, extra: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([default_model, *AURA_VOICES, *extra]))


def deepgram_voice_ids(config: DeepgramConfig) -> list[str]:
    """The catalog ids that ``[speech.deepgram]`` offers (the config checks app voices)."""
    return config.voice_ids()


# ---------------------------------------------------------------------------------------------
# Sans-I/O helpers: text splitting, the heardText estimate, error bodies

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
_TOKEN = re.compile(r"\S+")


def split_text(text: str, max_chars: int = TTS_MAX_CHARS) -> list[str]:
    """Pieces of at most ``max_chars`` characters, cut after sentence ends where possible, then
    at spaces, and inside a word only when one word is longer than a whole piece."""
    text = text.strip()
    if len(text) <= max_chars:
        return [text] if text else []
    units: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        while len(sentence) > max_chars:
            cut = sentence.rfind(" ", 0, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            units.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            units.append(sentence)
    pieces: list[str] = []
    for unit in units:
        if pieces and len(pieces[-1]) + 1 + len(unit) <= max_chars:
            pieces[-1] = f"{pieces[-1]} {unit}"
        else:
            pieces.append(unit)
    return pieces


def estimate_word_timings(text: str, duration_ms: int, offset_ms: int = 0) -> list[WordTiming]:
    """Spread the whitespace-separated words of ``text`` over ``duration_ms`` of audio.

    Each word weighs its characters plus one (the gap after it), plus 2 after ``,;:`` and 4
    after ``.!?`` where a voice pauses. Times are integers, increasing, offset by ``offset_ms``,
    and the last word ends exactly at the end of the audio, so a text heard to its end is
    reported whole and a cut reports only the words that (by this estimate) had finished.
    """
    tokens = _TOKEN.findall(text)
    if not tokens or duration_ms <= 0:
        return []

    def weight(token: str) -> int:
        pause = 4 if token[-1] in ".!?" else 2 if token[-1] in ",;:" else 0
        return len(token) + 1 + pause

    weights = [weight(t) for t in tokens]
    total = sum(weights)
    words: list[WordTiming] = []
    done = 0
    start_ms = offset_ms
    for token, w in zip(tokens, weights, strict=True):
        done += w
        end_ms = offset_ms + duration_ms * done // total
        words.append(WordTiming(start_ms, end_ms, token))
        start_ms = end_ms
    return words


def error_from_http(status: int, body: bytes, what: str) -> SpeechError:
    """A refused request (REST or WebSocket handshake) as the session-protocol error the app gets.

    ``err_msg`` comes from Deepgram, is shortened, and never contains our key; 400 means the
    request asked for something the model cannot do.
    """
    detail = ""
    try:
        parsed = json_bounds.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        code = parsed.get("err_code") or parsed.get("category")
        message = parsed.get("err_msg") or parsed.get("message")
        parts = [str(p)[:120] for p in (code, message) if isinstance(p, str) and p]
        detail = ": " + " ".join(parts) if parts else ""
    if status in (401, 403):
        return ProviderUnavailable(f"Deepgram {what} refused the API key (HTTP {status}){detail}")
    if status == 400:
        return FeatureNotSupported(f"Deepgram {what} refused the request (HTTP 400){detail}")
    if status == 402:
        return ProviderUnavailable(f"Deepgram {what}: the account is out of credit (HTTP 402)")
    if status == 429:
        return ProviderUnavailable(f"Deepgram {what}: rate limited (HTTP 429)")
    return ProviderUnavailable(f"Deepgram {what} failed (HTTP {status}){detail}")


class _PcmChunker:
    """Groups streamed bytes into whole-sample chunks; the newest ``hold_bytes`` are always kept
    back, so the request's last chunk has audio to carry the estimated words."""

    def __init__(self, rate_hz: int, first_chunk_ms: int, chunk_ms: int, hold_ms: int) -> None:
        self._first_bytes = max(2, rate_hz * first_chunk_ms // 1000 * 2)
        self._chunk_bytes = max(2, rate_hz * chunk_ms // 1000 * 2)
        self._hold_bytes = max(2, rate_hz * hold_ms // 1000 * 2)
        self._buffer = bytearray()
        self._sent_any = False
        self.total_bytes = 0

    def push(self, data: bytes) -> bytes | None:
        self._buffer += data
        self.total_bytes += len(data)
        threshold = self._chunk_bytes if self._sent_any else self._first_bytes
        if len(self._buffer) < threshold + self._hold_bytes:
            return None
        cut = (len(self._buffer) - self._hold_bytes) & ~1
        chunk = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        self._sent_any = True
        return chunk

    def finish(self) -> bytes:
        """The rest, cut to whole samples (a stray last byte is not a sample)."""
        rest = bytes(self._buffer[: len(self._buffer) & ~1])
        self._buffer.clear()
        self.total_bytes &= ~1
        return rest


# ---------------------------------------------------------------------------------------------
# TTS


class DeepgramTtsProvider:
    """TTS provider ``deepgram``: Aura voices as 16-bit PCM at 24 kHz (module docstring).

    One pooled :class:`httpx.AsyncClient` (made here, connected on first use; ``aclose()`` it at
    shutdown, after which a new one is made on demand). ``first_byte_timeout_s`` bounds connect,
    request and first audio; ``stall_timeout_s`` bounds every later wait for data.
    """

    name: str = PROVIDER_NAME

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        default_model: str = "aura-2-thalia-en",
        models: Sequence[str] = (),
        rate_hz: int = TTS_RATE_HZ,
        first_byte_timeout_s: float = 5.0,
        stall_timeout_s: float = 5.0,
        chunk_ms: int = 100,
    ) -> None:
        self._api_key = api_key
        self._speak_url = base_url.rstrip("/") + "/v1/speak"
        self._rate_hz = rate_hz
        self._first_byte_timeout_s = first_byte_timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._chunk_ms = chunk_ms
        infos = [voice_info(m) for m in _models(default_model, models)]
        self._voices = tuple(
            VoiceInfo(v.id, v.provider, v.name, v.languages, rate_hz) for v in infos
        )
        self._models = {v.id: v.id.split("/", 1)[1] for v in self._voices}
        self._client: httpx.AsyncClient | None = None
        self._http()  # made now: its TLS context costs ~40 ms, which no caller should wait for

    @classmethod
    def from_config(cls, config: DeepgramConfig) -> DeepgramTtsProvider:
        return cls(
            config.api_key,
            base_url=config.base_url,
            default_model=config.tts_model,
            models=config.voices,
        )

    def voices(self) -> Sequence[VoiceInfo]:
        return self._voices

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self._stall_timeout_s, connect=self._first_byte_timeout_s)
            self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        return self._client

    async def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]:
        """Speak ``text``; see :class:`appbridge.speech.base.TtsProvider`."""
        model = self._models.get(voice.id)
        if model is None:
            raise InvalidCatalogId("voice", voice.id)
        primary = language.split("-", 1)[0].lower()
        if all(tag.split("-", 1)[0].lower() != primary for tag in voice.languages):
            raise FeatureNotSupported(f"voice {voice.id} does not speak {language[:128]}")
        offset_ms = 0
        for piece in split_text(text.replace("\x00", " ")):
            chunker = _PcmChunker(self._rate_hz, 20, self._chunk_ms, 20)
            async with contextlib.aclosing(self._stream(model, piece)) as stream:
                async for data in stream:
                    pcm16 = chunker.push(data)
                    if pcm16:
                        yield TtsChunk(pcm16, self._rate_hz)
            rest = chunker.finish()
            if not chunker.total_bytes:
                raise ProviderUnavailable("Deepgram TTS returned no audio")
            duration_ms = chunker.total_bytes * 1000 // (2 * self._rate_hz)
            words = estimate_word_timings(piece, duration_ms, offset_ms)
            offset_ms += duration_ms
            yield TtsChunk(rest, self._rate_hz, words)

    async def _stream(self, model: str, text: str) -> AsyncGenerator[bytes, None]:
        """The audio bytes of one request, as they arrive; errors mapped (module docstring)."""
        params = {
            "model": model,
            "encoding": "linear16",
            "sample_rate": str(self._rate_hz),
            "container": "none",
        }
        client = self._http()
        request = client.build_request(
            "POST",
            self._speak_url,
            params=params,
            json={"text": text},
            headers={"Authorization": f"Token {self._api_key}"},
        )
        response: httpx.Response | None = None
        first = True
        try:
            async with asyncio.timeout(self._first_byte_timeout_s) as first_byte:
                response = await client.send(request, stream=True)
                if response.status_code != 200:
                    body = await _read_bounded(response, 16 * 1024)
                    raise error_from_http(response.status_code, body, "TTS")
                async for data in response.aiter_raw():
                    if first:
                        first_byte.reschedule(None)  # the bound was for the first audio only
                        first = False
                    yield data
        except TimeoutError:
            raise ProviderTimeout(
                f"Deepgram TTS gave no audio within {self._first_byte_timeout_s:g} s"
            ) from None
        except httpx.TimeoutException:
            raise ProviderTimeout("Deepgram TTS stalled") from None
        except httpx.ConnectError:
            raise ProviderUnavailable("Deepgram TTS is unreachable (connection failed)") from None
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"Deepgram TTS failed ({type(exc).__name__})") from None
        finally:
            if response is not None:
                await response.aclose()


async def _read_bounded(response: httpx.Response, limit_bytes: int) -> bytes:
    body = bytearray()
    async for data in response.aiter_raw():
        body += data
        if len(body) >= limit_bytes:
            break
    return bytes(body[:limit_bytes])
