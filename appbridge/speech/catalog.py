"""The speech catalog: which voice and language ids exist, and which voice speaks an item.

docs/speech.md, "Catalog ids": voices are catalog ids ``provider/voice``, languages BCP-47 tags, and
an id not in the catalog is answered with ``error invalid_catalog_id`` (docs/protocol-session-v1.md,
"Errors"). The catalog raises :class:`InvalidCatalogId`; the caller turns it into that error.

Choosing a voice for a ``speak`` (docs/protocol-session-v1.md, ``speak``: ``voice`` and ``language``
override the app's defaults for one item):

* both given: that voice, and it must speak that language (else ``feature_not_supported``: the
  ids exist, the provider just cannot do it);
* only ``voice``: that voice, in the app's default language if it speaks it, else its own;
* only ``language``: the app's default voice if it speaks exactly that tag; else another voice of
  the *same provider* with exactly that tag; else the default voice if it speaks the primary
  language; else the provider's first voice speaking the primary language; else
  ``invalid_catalog_id``. The provider never changes ("AppBridge never switches providers");
* neither: the app's defaults.

"Speaks" means the exact tag, or the same primary language subtag (``en-AU`` is spoken by an
``en-US`` voice: an accent is better than an error on a phone call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from appbridge.config import SpeechConfig
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    TtsProvider,
    VoiceInfo,
)
from appbridge.speech.cache import CachingTtsProvider, TtsCache
from appbridge.speech.providers.local import LocalTtsProvider

if TYPE_CHECKING:
    from appbridge.config import Config

# The session protocol caps every id at 128 characters; a longer "tag" is not worth parsing.
MAX_LANGUAGE_TAG_CHARS = 128


def normalize_language_tag(tag: str) -> str | None:
    """Check ``tag`` is a well-formed BCP-47 language tag; return it in canonical case, else None.

    RFC 5646 section 2.1 syntax (``langtag`` only: private-use-only and grandfathered tags name no
    voice anywhere) and section 2.1.1 case: language and extlang lower case, script title case,
    region upper case, everything after the first singleton lower case.
    """
    if not tag or len(tag) > MAX_LANGUAGE_TAG_CHARS or not tag.isascii():
        return None
    subtags = tag.split("-")
    if any(not s or not s.isalnum() for s in subtags):
        return None
    out: list[str] = []
    i = 0
    n = len(subtags)

    # language = 2*3ALPHA ["-" extlang] / 4ALPHA / 5*8ALPHA ; extlang = 3ALPHA *2("-" 3ALPHA)
    lang = subtags[0]
    if not (lang.isalpha() and 2 <= len(lang) <= 8):
        return None
    out.append(lang.lower())
    i = 1
    if len(lang) <= 3:
        extlangs = 0
        while i < n and extlangs < 3 and len(subtags[i]) == 3 and subtags[i].isalpha():
            out.append(subtags[i].lower())
            i += 1
            extlangs += 1
    # script = 4ALPHA
    if i < n and len(subtags[i]) == 4 and subtags[i].isalpha():
        out.append(subtags[i].title())
        i += 1
    # region = 2ALPHA / 3DIGIT
    if i < n and (
        (len(subtags[i]) == 2 and subtags[i].isalpha())
        or (len(subtags[i]) == 3 and subtags[i].isdigit())
    ):
        out.append(subtags[i].upper())
        i += 1
    # variant = 5*8alphanum / (DIGIT 3alphanum)
    while i < n and (
        5 <= len(subtags[i]) <= 8 or (len(subtags[i]) == 4 and subtags[i][0].isdigit())
    ):
        out.append(subtags[i].lower())
        i += 1
    # extension = singleton 1*("-" (2*8alphanum)), singleton any alphanumeric but "x"
    while i < n and len(subtags[i]) == 1 and subtags[i].lower() != "x":
        out.append(subtags[i].lower())
        i += 1
        start = i
        while i < n and 2 <= len(subtags[i]) <= 8:
            out.append(subtags[i].lower())
            i += 1
        if i == start:
            return None
    # privateuse = "x" 1*("-" (1*8alphanum))
    if i < n and subtags[i].lower() == "x":
        out.append("x")
        i += 1
        if i == n:
            return None
        while i < n and 1 <= len(subtags[i]) <= 8:
            out.append(subtags[i].lower())
            i += 1
    if i != n:
        return None
    return "-".join(out)


def primary_language(tag: str) -> str:
    """The primary language subtag of a normalised tag (``en`` of ``en-US``)."""
    return tag.split("-", 1)[0]


def speaks_exactly(voice: VoiceInfo, tag: str) -> bool:
    return tag in voice.languages


def speaks(voice: VoiceInfo, tag: str) -> bool:
    """The voice speaks ``tag`` by exact tag or by primary language subtag."""
    primary = primary_language(tag)
    return any(t == tag or primary_language(t) == primary for t in voice.languages)


class SpeechDefaultsLike(Protocol):
    """Anything with an app's speech defaults (the ``speech`` table of an ``[[apps]]`` entry)."""

    @property
    def voice(self) -> str | None: ...

    @property
    def language(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SpeechDefaults:
    """An app's default voice and language; None means the catalog's default."""

    voice: str | None = None
    language: str | None = None


class SpeechCatalog:
    """Every voice of the configured providers, looked up by catalog id.

    Built once at start-up from ``provider.voices()`` (cheap by contract, so no engine loads).
    """

    def __init__(
        self,
        providers: Sequence[TtsProvider],
        default_voice: str | None = None,
        tts_cache: TtsCache | None = None,
    ) -> None:
        self.tts_cache = tts_cache  # what the providers' CachingTtsProvider wrappers share
        self._providers: dict[str, TtsProvider] = {}
        self._voices: dict[str, tuple[TtsProvider, VoiceInfo]] = {}
        self._by_provider: dict[str, list[VoiceInfo]] = {}
        for provider in providers:
            if provider.name in self._providers:
                raise ValueError(f"two speech providers named {provider.name!r}")
            self._providers[provider.name] = provider
            listed = self._by_provider.setdefault(provider.name, [])
            for voice in provider.voices():
                if not voice.id.startswith(provider.name + "/"):
                    raise ValueError(f"voice {voice.id!r} is not under {provider.name}/")
                if voice.id in self._voices:
                    raise ValueError(f"voice {voice.id!r} listed twice")
                self._voices[voice.id] = (provider, voice)
                listed.append(voice)
        if not self._voices:
            raise ValueError("a speech catalog needs at least one voice")
        if default_voice is None:
            default_voice = next(iter(self._voices))
        self._default_voice_id = self.resolve_voice(default_voice)[1].id

    @property
    def default_voice_id(self) -> str:
        return self._default_voice_id

    def voices(self) -> list[VoiceInfo]:
        """Every voice, in provider order then each provider's own order."""
        return [voice for _, voice in self._voices.values()]

    def providers(self) -> list[TtsProvider]:
        return list(self._providers.values())

    def is_known_voice(self, voice_id: str) -> bool:
        return voice_id in self._voices

    def resolve_voice(self, voice_id: str) -> tuple[TtsProvider, VoiceInfo]:
        """The provider and voice of a catalog id; ids are case-sensitive."""
        try:
            return self._voices[voice_id]
        except KeyError:
            raise InvalidCatalogId("voice", voice_id) from None

    def check_language(self, tag: str) -> str:
        """``tag`` normalised, if it is well-formed and some voice speaks it (exact tag or primary
        subtag); else :class:`InvalidCatalogId`."""
        normalized = normalize_language_tag(tag)
        if normalized is None or not any(speaks(v, normalized) for _, v in self._voices.values()):
            raise InvalidCatalogId("language", tag)
        return normalized

    def voice_for(
        self,
        voice_id: str | None,
        language: str | None,
        defaults: SpeechDefaultsLike | None = None,
    ) -> tuple[TtsProvider, VoiceInfo, str]:
        """The provider, voice and normalised language to speak one item with (rules above)."""
        default_voice_id = (defaults.voice if defaults else None) or self._default_voice_id
        default_language = defaults.language if defaults else None

        if voice_id is not None:
            provider, voice = self.resolve_voice(voice_id)
            if language is not None:
                tag = self.check_language(language)
                if not speaks(voice, tag):
                    raise FeatureNotSupported(f"voice {voice.id} does not speak {tag}")
                return provider, voice, tag
            if default_language is not None:
                tag = self.check_language(default_language)
                if speaks(voice, tag):
                    return provider, voice, tag
            return provider, voice, voice.languages[0]

        provider, default = self.resolve_voice(default_voice_id)
        if language is None:
            if default_language is None:
                return provider, default, default.languages[0]
            tag = self.check_language(default_language)
            if not speaks(default, tag):
                raise FeatureNotSupported(f"voice {default.id} does not speak {tag}")
            return provider, default, tag

        tag = self.check_language(language)
        candidates = self._by_provider[provider.name]
        for match in (speaks_exactly, speaks):
            if match(default, tag):
                return provider, default, tag
            for voice in candidates:
                if match(voice, tag):
                    return provider, voice, tag
        raise InvalidCatalogId("language", language)


def default_catalog() -> SpeechCatalog:
    """The embedded default's catalog (docs/configuration.md, "The embedded default"): the offline
    ``local`` provider.

    Cheap: constructing the provider loads no engine, so ``appbridge check-config`` stays fast;
    eSpeak NG is loaded on the first synthesis.
    """
    return SpeechCatalog([LocalTtsProvider()], default_voice="local/en-US")


def build_catalog(config: Config) -> SpeechCatalog:
    """The catalog of a configuration: ``local`` always, then each configured cloud provider.

    ``[speech.deepgram]`` adds ``deepgram/<aura model>`` voices (docs/speech.md, "Catalog ids"),
    e.g. ``deepgram/aura-2-thalia-en``. The default voice stays ``local/en-US``: an app picks a
    cloud voice by naming it, so a missing key or an outage never changes what other apps sound
    like. Cheap, like :func:`default_catalog`: no connection is made until the first synthesis. The
    caller owns the Deepgram provider's HTTP client: ``await provider.aclose()`` at shutdown.
    """
    providers: list[TtsProvider] = [LocalTtsProvider()]
    speech = config.speech or SpeechConfig()
    if speech.deepgram is not None:
        from appbridge.speech.providers.deepgram import DeepgramTtsProvider

        providers.append(DeepgramTtsProvider.from_config(speech.deepgram))
    if speech.tts_cache_mb <= 0:
        return SpeechCatalog(providers, default_voice="local/en-US")
    cache = TtsCache(speech.tts_cache_mb * 1024 * 1024)
    cached: list[TtsProvider] = [CachingTtsProvider(p, cache) for p in providers]
    return SpeechCatalog(cached, default_voice="local/en-US", tts_cache=cache)
