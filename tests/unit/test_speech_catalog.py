"""The speech catalog: ids, BCP-47 tags and voice choice (docs/speech.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncGenerator, Sequence

import pytest

from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    SpeechError,
    TtsChunk,
    VoiceInfo,
)
from appbridge.speech.catalog import (
    SpeechCatalog,
    SpeechDefaults,
    default_catalog,
    normalize_language_tag,
)
from appbridge.speech.providers.local import LocalTtsProvider


class FakeProvider:
    """A provider that only lists voices; the catalog never synthesises."""

    def __init__(self, name: str, voices: Sequence[tuple[str, tuple[str, ...]]]) -> None:
        self.name = name
        self._voices = tuple(VoiceInfo(f"{name}/{v}", name, v, langs, 24000) for v, langs in voices)

    def voices(self) -> Sequence[VoiceInfo]:
        return self._voices

    async def synthesize(
        self, text: str, voice: VoiceInfo, language: str
    ) -> AsyncGenerator[TtsChunk, None]:
        raise AssertionError("the catalog must not synthesise")
        yield TtsChunk(b"", 24000)  # pragma: no cover


@pytest.fixture
def catalog() -> SpeechCatalog:
    return SpeechCatalog([LocalTtsProvider()])


@pytest.fixture
def two_providers() -> SpeechCatalog:
    cloud = FakeProvider(
        "cloud", [("aura-en", ("en-US",)), ("aura-en-gb", ("en-GB",)), ("aura-de", ("de-DE",))]
    )
    return SpeechCatalog([LocalTtsProvider(), cloud])


# --- BCP-47 (RFC 5646 section 2.1) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "normalized"),
    [
        ("en", "en"),
        ("EN", "en"),
        ("en-us", "en-US"),
        ("en-US", "en-US"),
        ("es-419", "es-419"),
        ("zh-hant-tw", "zh-Hant-TW"),
        ("sr-Latn-RS", "sr-Latn-RS"),
        ("zh-yue-HK", "zh-yue-HK"),
        ("sl-rozaj-biske", "sl-rozaj-biske"),
        ("de-CH-1901", "de-CH-1901"),
        ("en-US-u-CA-gregory", "en-US-u-ca-gregory"),
        ("en-a-bbb-x-a-ccc", "en-a-bbb-x-a-ccc"),
        ("de-x-Phonebk", "de-x-phonebk"),
        ("haw", "haw"),
    ],
)
def test_well_formed_tags_are_normalised(tag: str, normalized: str) -> None:
    assert normalize_language_tag(tag) == normalized


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "e",
        "en_US",
        "en-",
        "-en",
        "en--US",
        "en US",
        "en-US-x",
        "en-a",
        "en-a-x-b",
        "x-private",
        "i-klingon",
        "1en",
        "en-US-toolongvariant",
        "fr-\u00e9t\u00e9",
        "en-" + "a" * 130,
    ],
)
def test_malformed_tags_are_rejected(tag: str) -> None:
    assert normalize_language_tag(tag) is None


# --- Lookups -------------------------------------------------------------------------------------


def test_resolve_voice_returns_provider_and_voice(catalog: SpeechCatalog) -> None:
    provider, voice = catalog.resolve_voice("local/en-US")
    assert provider.name == "local"
    assert voice.id == "local/en-US"
    assert voice.provider == "local"
    assert voice.languages == ("en-US",)
    assert voice.rate_hz == 22050


@pytest.mark.parametrize("voice_id", ["local/xx-YY", "LOCAL/en-US", "en-US", "", "deepgram/x"])
def test_unknown_voice_is_invalid_catalog_id(catalog: SpeechCatalog, voice_id: str) -> None:
    with pytest.raises(InvalidCatalogId) as caught:
        catalog.resolve_voice(voice_id)
    assert caught.value.code == "invalid_catalog_id"
    assert caught.value.kind == "voice"
    assert caught.value.value == voice_id
    assert isinstance(caught.value, SpeechError)
    assert not catalog.is_known_voice(voice_id)


def test_known_voices_and_order(catalog: SpeechCatalog) -> None:
    ids = [v.id for v in catalog.voices()]
    assert ids[0] == "local/en-US"
    assert catalog.default_voice_id == "local/en-US"
    assert {"local/en-GB", "local/es-ES", "local/fr-FR", "local/de-DE", "local/pt-BR"} <= set(ids)
    assert all(catalog.is_known_voice(i) for i in ids)
    assert [p.name for p in catalog.providers()] == ["local"]


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("en-US", "en-US"),
        ("en-us", "en-US"),
        ("en", "en"),
        ("en-AU", "en-AU"),  # no en-AU voice: accepted by its primary subtag
        ("es-MX", "es-MX"),
        ("pt", "pt"),
        ("de-Latn-CH", "de-Latn-CH"),
    ],
)
def test_check_language_by_exact_tag_or_primary_subtag(
    catalog: SpeechCatalog, tag: str, expected: str
) -> None:
    assert catalog.check_language(tag) == expected


@pytest.mark.parametrize("tag", ["sw", "zz-ZZ", "en_US", "english", "", "x-en"])
def test_unknown_or_malformed_language_is_invalid_catalog_id(
    catalog: SpeechCatalog, tag: str
) -> None:
    with pytest.raises(InvalidCatalogId) as caught:
        catalog.check_language(tag)
    assert caught.value.code == "invalid_catalog_id"
    assert caught.value.kind == "language"
    assert caught.value.value == tag


# --- voice_for ------------------------------------------------------------------------------------


def test_voice_for_nothing_given_uses_catalog_default(catalog: SpeechCatalog) -> None:
    provider, voice, language = catalog.voice_for(None, None)
    assert (provider.name, voice.id, language) == ("local", "local/en-US", "en-US")


def test_voice_for_nothing_given_uses_app_defaults(catalog: SpeechCatalog) -> None:
    defaults = SpeechDefaults(voice="local/fr-FR", language="fr-CA")
    _, voice, language = catalog.voice_for(None, None, defaults)
    assert (voice.id, language) == ("local/fr-FR", "fr-CA")


def test_voice_for_default_language_the_default_voice_cannot_speak(
    catalog: SpeechCatalog,
) -> None:
    with pytest.raises(FeatureNotSupported) as caught:
        catalog.voice_for(None, None, SpeechDefaults(voice="local/en-US", language="de"))
    assert caught.value.code == "feature_not_supported"


def test_voice_for_voice_only_keeps_default_language_when_spoken(
    catalog: SpeechCatalog,
) -> None:
    defaults = SpeechDefaults(voice="local/en-US", language="en-US")
    _, voice, language = catalog.voice_for("local/en-GB", None, defaults)
    assert (voice.id, language) == ("local/en-GB", "en-US")


def test_voice_for_voice_only_falls_back_to_the_voices_language(catalog: SpeechCatalog) -> None:
    defaults = SpeechDefaults(voice="local/en-US", language="en-US")
    _, voice, language = catalog.voice_for("local/es-ES", None, defaults)
    assert (voice.id, language) == ("local/es-ES", "es-ES")


def test_voice_for_voice_and_language(catalog: SpeechCatalog) -> None:
    _, voice, language = catalog.voice_for("local/pt-BR", "pt-br")
    assert (voice.id, language) == ("local/pt-BR", "pt-BR")


def test_voice_for_voice_that_cannot_speak_the_language(catalog: SpeechCatalog) -> None:
    with pytest.raises(FeatureNotSupported) as caught:
        catalog.voice_for("local/en-US", "es-ES")
    assert caught.value.code == "feature_not_supported"


def test_voice_for_unknown_voice_or_language(catalog: SpeechCatalog) -> None:
    with pytest.raises(InvalidCatalogId) as caught:
        catalog.voice_for("local/klingon", None)
    assert caught.value.kind == "voice"
    with pytest.raises(InvalidCatalogId) as caught:
        catalog.voice_for(None, "tlh")
    assert caught.value.kind == "language"
    with pytest.raises(InvalidCatalogId) as caught:
        catalog.voice_for("local/en-US", "tlh")
    assert caught.value.kind == "language"


@pytest.mark.parametrize(
    ("language", "voice_id", "normalized"),
    [
        ("en-US", "local/en-US", "en-US"),  # the default speaks it exactly
        ("en", "local/en-US", "en"),  # the default speaks the primary language
        ("en-AU", "local/en-US", "en-AU"),  # nobody has en-AU: the default, by primary subtag
        ("en-GB", "local/en-GB", "en-GB"),  # an exact voice beats the default's primary match
        ("es", "local/es-ES", "es"),  # first voice of the provider with that primary language
        ("es-MX", "local/es-419", "es-MX"),  # exact on the voice's second tag
        ("es-AR", "local/es-ES", "es-AR"),
        ("de-de", "local/de-DE", "de-DE"),
    ],
)
def test_voice_for_language_only(
    catalog: SpeechCatalog, language: str, voice_id: str, normalized: str
) -> None:
    defaults = SpeechDefaults(voice="local/en-US", language="en-US")
    _, voice, got_language = catalog.voice_for(None, language, defaults)
    assert (voice.id, got_language) == (voice_id, normalized)


def test_voice_for_language_only_never_switches_provider(two_providers: SpeechCatalog) -> None:
    defaults = SpeechDefaults(voice="cloud/aura-en", language="en-US")
    # French exists in the catalog (local speaks it) but not at the default voice's provider.
    assert two_providers.check_language("fr") == "fr"
    with pytest.raises(InvalidCatalogId) as caught:
        two_providers.voice_for(None, "fr", defaults)
    assert caught.value.kind == "language"
    provider, voice, language = two_providers.voice_for(None, "en-GB", defaults)
    assert (provider.name, voice.id, language) == ("cloud", "cloud/aura-en-gb", "en-GB")
    provider, voice, _ = two_providers.voice_for(None, "de", defaults)
    assert (provider.name, voice.id) == ("cloud", "cloud/aura-de")


def test_voice_for_explicit_voice_of_another_provider(two_providers: SpeechCatalog) -> None:
    defaults = SpeechDefaults(voice="local/en-US", language="en-US")
    provider, voice, language = two_providers.voice_for("cloud/aura-de", None, defaults)
    assert (provider.name, voice.id, language) == ("cloud", "cloud/aura-de", "de-DE")


def test_voice_for_accepts_any_object_with_the_default_fields(catalog: SpeechCatalog) -> None:
    class AppSpeech:
        voice = "local/it-IT"
        language = None

    _, voice, language = catalog.voice_for(None, None, AppSpeech())
    assert (voice.id, language) == ("local/it-IT", "it-IT")


# --- Construction ---------------------------------------------------------------------------------


def test_catalog_rejects_inconsistent_providers() -> None:
    with pytest.raises(ValueError, match="two speech providers"):
        SpeechCatalog([FakeProvider("a", [("x", ("en",))]), FakeProvider("a", [("y", ("en",))])])
    bad = FakeProvider("a", [("x", ("en",))])
    bad._voices = (VoiceInfo("b/x", "b", "x", ("en",), 8000),)
    with pytest.raises(ValueError, match="not under"):
        SpeechCatalog([bad])
    with pytest.raises(ValueError, match="at least one voice"):
        SpeechCatalog([FakeProvider("a", [])])
    with pytest.raises(InvalidCatalogId):
        SpeechCatalog([FakeProvider("a", [("x", ("en",))])], default_voice="a/y")


def test_default_catalog_has_local_provider_and_default_voice() -> None:
    catalog = default_catalog()
    assert catalog.default_voice_id == "local/en-US"
    assert catalog.is_known_voice("local/en-US")
    assert [p.name for p in catalog.providers()] == ["local"]


def test_default_catalog_does_not_load_espeak() -> None:
    """check-config builds the catalog; eSpeak NG must load only on the first synthesis."""
    probe = (
        "from appbridge.speech.catalog import default_catalog\n"
        "from appbridge.speech.providers.local import shared_engine\n"
        "c = default_catalog()\n"
        "c.voice_for(None, 'es')\n"
        "maps = open('/proc/self/maps').read()\n"
        "import threading\n"
        "print(shared_engine().loaded, 'libespeak-ng' in maps,"
        " sum(t.name.startswith('appbridge-espeak') for t in threading.enumerate()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False", "0"]
