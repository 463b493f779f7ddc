"""Reader of ``[speech]`` and ``[speech.deepgram]``: the utterance cache and cloud providers.

Without ``[speech]`` only the offline ``local`` provider exists (docs/configuration.md,
``[speech]`` and ``[speech.deepgram]``; docs/speech.md). The Deepgram voices an app may name come
from the model (:meth:`DeepgramConfig.voice_ids`), so validating a file never imports a provider.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from appbridge.config.model import (
    DEEPGRAM_BASE_URL,
    DEEPGRAM_STT_MODEL,
    DEEPGRAM_TTS_MODEL,
    DEFAULT_TTS_CACHE_MB,
    MAX_TTS_CACHE_MB,
    DeepgramConfig,
    SpeechConfig,
)
from appbridge.config.schema import Reader, check_http_base_url, describe, item_path, key_path
from appbridge.net.plaintext import check_plaintext

# Deepgram model names: lower-case words joined by '-' (nova-3, nova-2-phonecall). Aura voices
# end in their language (aura-2-thalia-en), which is where the catalog reads the language from.
_MODEL_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_AURA_RE = re.compile(r"aura(?:-[a-z0-9]+)+-[a-z]{2,3}")


def parse_speech_providers(reader: Reader, data: Mapping[str, Any]) -> SpeechConfig | None:
    """``[speech]`` and its ``[speech.deepgram]`` table; ``None`` when the section is absent."""
    table = reader.table(data, "speech", "speech")
    if table is None:
        return None
    reader.check_keys("speech", table, ("deepgram", "tts_cache_mb"))
    cache_mb = reader.integer(
        table,
        "tts_cache_mb",
        "speech.tts_cache_mb",
        default=DEFAULT_TTS_CACHE_MB,
        low=0,
        high=MAX_TTS_CACHE_MB,
    )
    return SpeechConfig(deepgram=_parse_deepgram(reader, table), tts_cache_mb=cache_mb)


def _parse_deepgram(reader: Reader, parent: Mapping[str, Any]) -> DeepgramConfig | None:
    path = "speech.deepgram"
    table = reader.table(parent, "deepgram", path)
    if table is None:
        return None
    reader.check_keys(path, table, ("api_key", "base_url", "tts_model", "stt_model", "voices"))
    api_key = reader.string(table, "api_key", key_path(path, "api_key"), required=True, secret=True)
    base_url = reader.string(table, "base_url", key_path(path, "base_url")) or DEEPGRAM_BASE_URL
    message = check_http_base_url(base_url)
    if message is not None:
        reader.problem(key_path(path, "base_url"), message)
    elif base_url.startswith("http://"):
        verdict = check_plaintext("ws://" + base_url.split("://", 1)[1])
        if not verdict.allowed:
            reader.warn(
                f"{path}.base_url is plain http:// to a public host: the API key and the "
                "callers' audio cross the network unencrypted"
            )
    tts_model = _model(reader, table, "tts_model", path, DEEPGRAM_TTS_MODEL, aura=True)
    stt_model = _model(reader, table, "stt_model", path, DEEPGRAM_STT_MODEL, aura=False)
    voices: list[str] = []
    for index, name in enumerate(reader.strings(table, "voices", key_path(path, "voices")) or []):
        at = item_path(key_path(path, "voices"), index)
        if _AURA_RE.fullmatch(name) is None:
            reader.problem(
                at, f"expected an Aura model such as aura-2-thalia-en, got {describe(name)}"
            )
        elif name in voices:
            reader.problem(at, f"duplicate entry {describe(name)}")
        else:
            voices.append(name)
    if api_key is None:
        return None
    return DeepgramConfig(api_key, base_url, tts_model, stt_model, tuple(voices))


def _model(
    reader: Reader, table: Mapping[str, Any], key: str, path: str, default: str, *, aura: bool
) -> str:
    at = key_path(path, key)
    value = reader.string(table, key, at, max_chars=128)
    if value is None:
        return default
    if aura and _AURA_RE.fullmatch(value) is None:
        reader.problem(
            at,
            "expected an Aura model ending in its language, such as aura-2-thalia-en, "
            f"got {describe(value)}",
        )
        return default
    if not aura and _MODEL_RE.fullmatch(value) is None:
        reader.problem(at, f"expected a Deepgram model name such as nova-3, got {describe(value)}")
        return default
    return value


def with_provider_voices(
    known_voice: Callable[[str], bool] | None, speech: SpeechConfig | None
) -> Callable[[str], bool] | None:
    """Extend the caller's voice check (the default catalog's) with the configured providers'
    voices, so an app may name ``deepgram/aura-2-thalia-en`` once ``[speech.deepgram]`` is set."""
    if known_voice is None or speech is None or speech.deepgram is None:
        return known_voice
    cloud = frozenset(speech.deepgram.voice_ids())
    check = known_voice
    return lambda voice: voice in cloud or check(voice)
