"""The Deepgram provider (TTS over REST, live STT over a WebSocket) against the loopback fake.

Pure parts (text splitting, the heardText estimate, error mapping, the listen session core) are
tested directly, the core in virtual time; the clients run for real against
:class:`appbridge.testing.fake_deepgram.FakeDeepgram`, fed good, bad and failing answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tomllib
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

import pytest

from appbridge.clock import VirtualClock
from appbridge.config import DeepgramConfig, SpeechConfig, default_config, parse_config
from appbridge.speech.base import (
    FeatureNotSupported,
    InvalidCatalogId,
    ProviderTimeout,
    ProviderUnavailable,
    SpeechError,
    Transcript,
    TtsChunk,
    VoiceInfo,
)
from appbridge.speech.cache import CachingTtsProvider
from appbridge.speech.catalog import build_catalog, default_catalog
from appbridge.speech.providers.deepgram import (
    DeepgramTtsProvider,
    deepgram_voice_ids,
    error_from_http,
    estimate_word_timings,
    split_text,
    voice_info,
)
from appbridge.speech.providers.deepgram_stt import (
    CLOSE_STREAM,
    FINALIZE,
    KEEPALIVE,
    DeepgramSttProvider,
    DeepgramSttStream,
    DeepgramTranscript,
    ListenOptions,
    ListenSession,
    clean_hints,
)
from appbridge.testing.fake_deepgram import FakeDeepgram, closed_port_base_url

KEY = "dg-secret-key-0123456789"
RATE_HZ = 16000
FRAME_BYTES = RATE_HZ // 50 * 2  # 20 ms of 16-bit mono


@pytest.fixture
async def fake() -> AsyncIterator[FakeDeepgram]:
    async with FakeDeepgram(api_key=KEY, script=["Hello there, how are you?"]) as dg:
        yield dg


@pytest.fixture
async def tts(fake: FakeDeepgram) -> AsyncIterator[DeepgramTtsProvider]:
    provider = DeepgramTtsProvider(
        KEY, base_url=fake.base_url, first_byte_timeout_s=0.5, stall_timeout_s=0.5
    )
    yield provider
    await provider.aclose()


def stt_provider(fake: FakeDeepgram, **options: object) -> DeepgramSttProvider:
    settings: dict[str, object] = {"open_timeout_s": 2.0, "close_timeout_s": 1.0}
    settings.update(options)
    return DeepgramSttProvider(KEY, base_url=fake.base_url, **settings)  # type: ignore[arg-type]


def thalia(provider: DeepgramTtsProvider) -> VoiceInfo:
    return next(v for v in provider.voices() if v.id == "deepgram/aura-2-thalia-en")


async def speak(
    provider: DeepgramTtsProvider, text: str, language: str = "en-US"
) -> list[TtsChunk]:
    async with contextlib.aclosing(provider.synthesize(text, thalia(provider), language)) as gen:
        return [chunk async for chunk in gen]


def feed_audio(stream: DeepgramSttStream, pcm16: bytes) -> None:
    for i in range(0, len(pcm16), FRAME_BYTES):
        stream.feed(pcm16[i : i + FRAME_BYTES])


async def collect(stream: DeepgramSttStream, *, until_final: bool) -> list[Transcript]:
    found: list[Transcript] = []
    async with asyncio.timeout(5):
        async for transcript in stream.results():
            found.append(transcript)
            if until_final and transcript.is_final and transcript.text:
                break
    return found


async def failure_of(stream: DeepgramSttStream) -> SpeechError:
    with pytest.raises(SpeechError) as info:
        await collect(stream, until_final=False)
    return info.value


SPEECH = FakeDeepgram.tone(1000, RATE_HZ)
SILENCE = bytes(RATE_HZ // 2 * 2)  # 500 ms


# -- pure parts ----------------------------------------------------------------------------------


def test_split_text_keeps_short_text_whole() -> None:
    assert split_text("  Hello there.  ") == ["Hello there."]
    assert split_text("   ") == []


def test_split_text_cuts_after_sentences_within_the_limit() -> None:
    sentence = "This is sentence number one of many. "
    text = sentence * 120  # 4440 characters
    pieces = split_text(text, 2000)
    assert len(pieces) == 3
    assert all(len(p) <= 2000 and p.endswith(".") for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_split_text_cuts_long_sentences_at_spaces_and_long_words_anywhere() -> None:
    text = "word " * 30 + "x" * 25
    pieces = split_text(text, 20)
    assert all(len(p) <= 20 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")


def test_word_estimate_spreads_by_characters_and_pauses() -> None:
    words = estimate_word_timings("Hi, wonderful world.", 2000, offset_ms=500)
    assert [w.text for w in words] == ["Hi,", "wonderful", "world."]
    # weights: "Hi," 3+1+2 = 6, "wonderful" 9+1 = 10, "world." 6+1+4 = 11; total 27
    assert [(w.start_ms, w.end_ms) for w in words] == [(500, 944), (944, 1685), (1685, 2500)]
    assert estimate_word_timings("", 1000) == []
    assert estimate_word_timings("hello", 0) == []


def test_word_estimate_is_monotonic_and_ends_with_the_audio() -> None:
    text = "one two three four five six seven eight nine ten " * 3
    words = estimate_word_timings(text, 7777)
    assert " ".join(w.text for w in words) == text.strip()
    assert words[0].start_ms == 0 and words[-1].end_ms == 7777
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(words))
    assert all(w.start_ms <= w.end_ms for w in words)


@pytest.mark.parametrize(
    ("status", "kind", "fragment"),
    [
        (401, ProviderUnavailable, "refused the API key (HTTP 401): INVALID_AUTH"),
        (403, ProviderUnavailable, "refused the API key (HTTP 403)"),
        (400, FeatureNotSupported, "HTTP 400"),
        (402, ProviderUnavailable, "out of credit"),
        (429, ProviderUnavailable, "rate limited"),
        (500, ProviderUnavailable, "failed (HTTP 500)"),
        (503, ProviderUnavailable, "failed (HTTP 503)"),
    ],
)
def test_http_errors_map_to_session_error_codes(
    status: int, kind: type[SpeechError], fragment: str
) -> None:
    body = b'{"err_code":"INVALID_AUTH","err_msg":"Invalid credentials.","request_id":"r"}'
    error = error_from_http(status, body, "TTS")
    assert type(error) is kind
    assert fragment in str(error)


def test_http_error_with_a_body_that_is_not_json() -> None:
    error = error_from_http(502, b"<html>bad gateway</html>", "STT")
    assert isinstance(error, ProviderUnavailable)
    assert str(error) == "Deepgram STT failed (HTTP 502)"


def test_voices_and_their_languages() -> None:
    assert voice_info("aura-2-thalia-en") == VoiceInfo(
        "deepgram/aura-2-thalia-en", "deepgram", "Thalia (Deepgram Aura)", ("en-US",), 24000
    )
    assert voice_info("aura-2-celeste-es").languages == ("es",)
    config = DeepgramConfig("k", tts_model="aura-2-zeus-en", voices=("aura-2-newvoice-fr",))
    ids = deepgram_voice_ids(config)
    assert ids[0] == "deepgram/aura-2-zeus-en"  # the configured default comes first
    assert "deepgram/aura-2-newvoice-fr" in ids and "deepgram/aura-2-thalia-en" in ids
    assert len(ids) == len(set(ids))


def test_build_catalog_adds_deepgram_voices_only_when_configured() -> None:
    plain = default_config()
    assert [v.id for v in build_catalog(plain).voices()] == [
        v.id for v in default_catalog().voices()
    ]
    config = parse_config(
        tomllib.loads(
            '[speech.deepgram]\napi_key = "${DEEPGRAM_API_KEY}"\n'
            '[[apps]]\nref = "a"\nurl = "wss://app.example.com/s"\n'
            'speech = { voice = "deepgram/aura-2-thalia-en" }\n'
        ),
        {"DEEPGRAM_API_KEY": KEY},
        known_voice=default_catalog().is_known_voice,
    )
    catalog = build_catalog(config)
    assert catalog.default_voice_id == "local/en-US"
    provider, voice, language = catalog.voice_for("deepgram/aura-2-thalia-en", "en-GB")
    assert isinstance(provider, CachingTtsProvider)  # [speech] tts_cache_mb defaults to 32
    assert isinstance(provider.inner, DeepgramTtsProvider)
    assert (voice.rate_hz, language) == (24000, "en-GB")
    with pytest.raises(FeatureNotSupported):
        catalog.voice_for("deepgram/aura-2-thalia-en", "fr-FR")


def test_listen_query_follows_the_live_audio_reference() -> None:
    options = ListenOptions("nova-3", "en-US", 8000, ("Fonoster", "AppBridge"), 300)
    assert parse_qs(options.query()) == {
        "model": ["nova-3"],
        "encoding": ["linear16"],
        "sample_rate": ["8000"],
        "channels": ["1"],
        "interim_results": ["true"],
        "language": ["en-US"],
        "punctuate": ["true"],
        "smart_format": ["true"],
        "endpointing": ["300"],
        "keyterm": ["Fonoster", "AppBridge"],
    }
    older = ListenOptions("nova-2", "es", 16000, ("hola",), None, utterance_end_ms=1000)
    query = parse_qs(older.query())
    assert query["keywords"] == ["hola"] and "keyterm" not in query
    assert query["endpointing"] == ["false"] and query["utterance_end_ms"] == ["1000"]


def test_hints_are_cleaned_and_bounded() -> None:
    assert clean_hints([" Fonoster ", "", "  ", "Fonoster", "x" * 300]) == ("Fonoster", "x" * 100)
    assert len(clean_hints(f"w{i}" for i in range(500))) == 100


def test_language_resolution_for_nova_3() -> None:
    provider = DeepgramSttProvider(KEY)
    assert provider.resolve_language("en-us") == "en-US"
    assert provider.resolve_language("en-AU") == "en-AU"
    assert provider.resolve_language("en-ZA") == "en"  # the primary language is spoken
    assert provider.resolve_language("zh-hant") == "zh-Hant"
    with pytest.raises(FeatureNotSupported, match="does not transcribe xx-YY"):
        provider.resolve_language("xx-YY")
    assert "es-419" in provider.languages()
    other = DeepgramSttProvider(KEY, model="nova-2-phonecall")
    assert other.resolve_language("en-US") == "en-US" and other.languages() == ()


# -- the listen session core, in virtual time ----------------------------------------------------


def session(clock: VirtualClock, **options: object) -> ListenSession:
    return ListenSession("en-US", now=clock.now(), **options)  # type: ignore[arg-type]


def test_keepalive_goes_out_after_the_interval_without_traffic() -> None:
    clock = VirtualClock()
    core = session(clock, keepalive_interval_s=4.0)
    assert core.data_to_send(clock.now()) == []
    assert core.next_deadline() == clock.now() + 4.0
    clock.advance(3.999)
    assert core.data_to_send(clock.now()) == []
    clock.advance(0.001)
    assert core.data_to_send(clock.now()) == [KEEPALIVE]
    assert core.next_deadline() == pytest.approx(clock.now() + 4.0)
    assert core.keepalives_sent == 1


def test_audio_postpones_the_keepalive_and_is_coalesced() -> None:
    clock = VirtualClock()
    core = session(clock, keepalive_interval_s=4.0, response_timeout_s=60.0)
    for _ in range(100):  # two seconds of audio, sent as it comes
        clock.advance(0.02)
        core.feed(b"\x01\x00" * 160)
        assert core.data_to_send(clock.now()) == [b"\x01\x00" * 160]
    clock.advance(3.9)
    assert core.data_to_send(clock.now()) == []
    core.feed(b"ab")
    core.feed(b"cd")
    assert core.data_to_send(clock.now()) == [b"abcd"]
    core.feed(b"")  # an empty frame would end a Deepgram stream: never sent
    assert core.data_to_send(clock.now()) == []


def test_control_messages_keep_their_place_among_audio() -> None:
    clock = VirtualClock()
    core = session(clock)
    core.feed(b"aa")
    core.finalize()
    core.feed(b"bb")
    core.close()
    core.feed(b"cc")  # after CloseStream nothing more is sent
    core.finalize()
    assert core.data_to_send(clock.now()) == [b"aa", FINALIZE, b"bb", CLOSE_STREAM]
    clock.advance(60)
    assert core.data_to_send(clock.now()) == []  # no KeepAlive while closing


def test_feed_never_blocks_and_drops_past_the_buffer_bound() -> None:
    clock = VirtualClock()
    core = session(clock, max_buffered_bytes=1000)
    for _ in range(5):
        core.feed(b"\x00" * 300)
    assert core.dropped_bytes == 600
    assert core.data_to_send(clock.now()) == [b"\x00" * 900]
    core.feed(b"\x00" * 300)  # room again once sent
    assert core.dropped_bytes == 600


def test_results_that_stop_coming_are_a_timeout() -> None:
    clock = VirtualClock()
    core = session(clock, keepalive_interval_s=4.0, response_timeout_s=10.0)
    core.feed(b"aa")
    core.data_to_send(clock.now())
    start = clock.now()
    assert core.next_deadline() == start + 4.0
    clock.advance(5.0)
    core.feed(b"bb")
    core.data_to_send(clock.now())
    assert core.next_deadline() == start + 9.0  # the KeepAlive comes first
    clock.advance(4.0)
    assert core.data_to_send(clock.now()) == [KEEPALIVE]
    assert core.next_deadline() == start + 10.0  # counted from the first unanswered audio
    clock.advance(0.999)
    core.check_timeout(clock.now())
    core.receive_text('{"type":"Metadata","request_id":"r-1"}')  # any message is an answer
    assert core.request_id == "r-1"
    clock.advance(60.0)
    core.check_timeout(clock.now())  # nothing sent since: nothing awaited (a caller on hold)
    core.feed(b"cc")
    core.data_to_send(clock.now())
    clock.advance(10.0)
    with pytest.raises(ProviderTimeout, match="sent nothing for 10 s"):
        core.check_timeout(clock.now())


def results_message(**overrides: object) -> str:
    import json

    message: dict[str, object] = {
        "type": "Results",
        "channel_index": [0, 1],
        "duration": 1.25,
        "start": 2.5,
        "is_final": True,
        "speech_final": True,
        "channel": {
            "alternatives": [
                {
                    "transcript": "Hello there.",
                    "confidence": 0.91,
                    "words": [
                        {
                            "word": "hello",
                            "start": 2.6,
                            "end": 2.9,
                            "confidence": 0.9,
                            "punctuated_word": "Hello",
                        }
                    ],
                }
            ]
        },
        "metadata": {"request_id": "r", "model_info": {"name": "n", "version": "v", "arch": "a"}},
        "from_finalize": False,
    }
    message.update(overrides)
    return json.dumps(message)


def test_results_become_transcripts() -> None:
    core = session(VirtualClock())
    transcript = core.receive_text(results_message())
    assert transcript == DeepgramTranscript(
        text="Hello there.",
        language="en-US",
        confidence=0.91,
        is_final=True,
        start_ms=2500,
        end_ms=3750,
        speech_final=True,
        from_finalize=False,
    )
    interim = core.receive_text(results_message(is_final=False, speech_final=False))
    assert interim is not None and not interim.is_final
    finalized = core.receive_text(results_message(from_finalize=True, speech_final=False))
    assert finalized is not None and finalized.from_finalize and not finalized.speech_final


def test_other_messages_are_recorded_or_skipped() -> None:
    core = session(VirtualClock())
    assert core.receive_text('{"type":"SpeechStarted","channel":[0],"timestamp":1.5}') is None
    assert core.receive_text('{"type":"UtteranceEnd","channel":[0,1],"last_word_end":2.4}') is None
    assert core.receive_text('{"type":"SomethingNew","x":1}') is None
    assert (core.last_speech_started_s, core.last_utterance_end_s) == (1.5, 2.4)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        results_message(channel={"alternatives": []}),
        results_message(start="soon"),
        results_message(channel={"alternatives": [{"transcript": 7}]}),
    ],
)
def test_malformed_messages_are_provider_failures(text: str) -> None:
    with pytest.raises(ProviderUnavailable, match="malformed"):
        session(VirtualClock()).receive_text(text)


def test_close_frames_map_to_errors() -> None:
    core = session(VirtualClock())
    assert isinstance(core.close_error(1011, "NET-0001"), ProviderTimeout)
    assert isinstance(core.close_error(1011, "NET-0000"), ProviderTimeout)
    data = core.close_error(1008, "DATA-0000")
    assert isinstance(data, ProviderUnavailable) and "decode" in str(data)
    assert isinstance(core.close_error(1011, "something else"), ProviderUnavailable)
    assert isinstance(core.close_error(1000, ""), ProviderUnavailable)  # we did not ask to end
    assert isinstance(core.close_error(1006, ""), ProviderUnavailable)
    core.close()
    assert core.close_error(1000, "") is None


# -- TTS against the fake --------------------------------------------------------------------------


async def test_tts_streams_audio_with_estimated_words(
    fake: FakeDeepgram, tts: DeepgramTtsProvider
) -> None:
    text = "Thank you for calling, how can I help you today?"
    chunks = await speak(tts, text)
    assert len(chunks) > 3  # streamed, not one blob
    assert all(c.rate_hz == 24000 and len(c.pcm16) % 2 == 0 and c.pcm16 for c in chunks)
    audio = b"".join(c.pcm16 for c in chunks)
    assert audio == FakeDeepgram.tone(len(text) * fake.ms_per_char, 24000)
    assert all(not c.words for c in chunks[:-1])
    words = chunks[-1].words
    assert " ".join(w.text for w in words) == text
    assert words[-1].end_ms == len(text) * fake.ms_per_char
    (request,) = fake.speak_requests
    assert request.params == {
        "model": "aura-2-thalia-en",
        "encoding": "linear16",
        "sample_rate": "24000",
        "container": "none",
    }
    assert request.text == text and request.authorized and request.completed


async def test_tts_long_text_is_spoken_in_consecutive_requests(
    fake: FakeDeepgram, tts: DeepgramTtsProvider
) -> None:
    fake.ms_per_char = 1
    text = "A sentence that is fifty characters long, or so!! " * 50  # 2500 characters
    chunks = await speak(tts, text)
    assert len(fake.speak_requests) == 2
    assert all(len(r.text or "") <= 2000 for r in fake.speak_requests)
    words = [w for c in chunks for w in c.words]
    assert " ".join(w.text for w in words) == text.strip()
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(words))
    total_ms = len(b"".join(c.pcm16 for c in chunks)) * 1000 // (2 * 24000)
    assert words[-1].end_ms == total_ms


async def test_tts_closing_the_generator_abandons_the_request(
    fake: FakeDeepgram, tts: DeepgramTtsProvider
) -> None:
    text = "word " * 390  # about two minutes of fake audio
    async with contextlib.aclosing(tts.synthesize(text, thalia(tts), "en-US")) as chunks:
        async for _ in chunks:
            break
    (request,) = fake.speak_requests
    assert not request.completed
    assert request.bytes_sent < len(text) * fake.ms_per_char * 48  # far from all of it


async def test_tts_blank_text_makes_no_request(
    fake: FakeDeepgram, tts: DeepgramTtsProvider
) -> None:
    assert await speak(tts, "  \n ") == []
    assert fake.speak_requests == []


async def test_tts_refuses_voices_and_languages_it_cannot_do(
    fake: FakeDeepgram, tts: DeepgramTtsProvider
) -> None:
    with pytest.raises(FeatureNotSupported, match="does not speak fr-FR"):
        await speak(tts, "Bonjour", "fr-FR")
    local = default_catalog().resolve_voice("local/en-US")[1]
    with pytest.raises(InvalidCatalogId):
        async with contextlib.aclosing(tts.synthesize("Hi", local, "en-US")) as gen:
            async for _ in gen:
                pass
    assert fake.speak_requests == []


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("unauthorized", "refused the API key (HTTP 401): INVALID_AUTH"),
        ("forbidden", "refused the API key (HTTP 403)"),
        ("payment_required", "out of credit (HTTP 402)"),
        ("rate_limited", "rate limited (HTTP 429)"),
        ("server_error", "failed (HTTP 500): INTERNAL_SERVER_ERROR"),
    ],
)
async def test_tts_refusals_are_provider_unavailable(
    fake: FakeDeepgram, tts: DeepgramTtsProvider, failure: str, message: str
) -> None:
    fake.speak_failure = failure  # type: ignore[assignment]
    with pytest.raises(ProviderUnavailable) as info:
        await speak(tts, "Hello")
    assert message in str(info.value)
    assert KEY not in str(info.value)


async def test_tts_wrong_key_is_provider_unavailable_without_the_key(fake: FakeDeepgram) -> None:
    provider = DeepgramTtsProvider("wrong-key-abc", base_url=fake.base_url)
    try:
        with pytest.raises(ProviderUnavailable, match="HTTP 401") as info:
            await speak(provider, "Hello")
    finally:
        await provider.aclose()
    assert "wrong-key-abc" not in str(info.value)
    assert not fake.speak_requests[0].authorized


async def test_tts_refused_connection_is_provider_unavailable() -> None:
    provider = DeepgramTtsProvider(KEY, base_url=closed_port_base_url())
    try:
        with pytest.raises(ProviderUnavailable, match="unreachable"):
            await speak(provider, "Hello")
    finally:
        await provider.aclose()


async def test_tts_no_first_audio_in_time_is_provider_timeout(fake: FakeDeepgram) -> None:
    fake.speak_failure = "stall"
    provider = DeepgramTtsProvider(KEY, base_url=fake.base_url, first_byte_timeout_s=0.1)
    try:
        with pytest.raises(ProviderTimeout, match=r"no audio within 0\.1 s"):
            await speak(provider, "Hello")
    finally:
        await provider.aclose()


async def test_tts_stall_after_the_first_audio_is_provider_timeout(fake: FakeDeepgram) -> None:
    fake.speak_failure = "stall_mid_stream"
    provider = DeepgramTtsProvider(KEY, base_url=fake.base_url, stall_timeout_s=0.1)
    got: list[TtsChunk] = []
    try:
        with pytest.raises(ProviderTimeout, match="stalled"):
            async with contextlib.aclosing(
                provider.synthesize("Hello world, " * 20, thalia(provider), "en-US")
            ) as gen:
                async for chunk in gen:
                    got.append(chunk)
    finally:
        await provider.aclose()
    assert got and not any(c.words for c in got)  # audio played so far had no complete words


# -- STT against the fake --------------------------------------------------------------------------


async def test_stt_partials_then_a_speech_final_transcript(fake: FakeDeepgram) -> None:
    stream = await stt_provider(fake).open_stream("en-us", RATE_HZ, ["Fonoster", "Fonoster"])
    try:
        feed_audio(stream, SPEECH + SILENCE)
        found = await collect(stream, until_final=True)
    finally:
        await stream.aclose()
    partials = [t for t in found if not t.is_final]
    assert [t.text for t in partials] == ["Hello", "Hello there,", "Hello there, how"]
    final = found[-1]
    assert isinstance(final, DeepgramTranscript)
    assert (final.text, final.language, final.is_final, final.speech_final) == (
        "Hello there, how are you?",
        "en-US",
        True,
        True,
    )
    assert final.start_ms == 0 and 1300 <= final.end_ms <= 1400
    (record,) = fake.listen_sessions
    assert record.authorized and record.audio_bytes == len(SPEECH + SILENCE)
    assert record.params["keyterm"] == ["Fonoster"]
    assert (record.param("model"), record.param("language")) == ("nova-3", "en-US")
    assert (record.param("encoding"), record.param("sample_rate")) == ("linear16", "16000")
    assert record.close_streams == 1 and record.close_code == 1000  # aclose sent CloseStream


async def test_stt_finalize_flushes_the_pending_words(fake: FakeDeepgram) -> None:
    stream = await stt_provider(fake).open_stream("en-za", RATE_HZ, [])
    try:
        feed_audio(stream, SPEECH)  # still talking: no endpoint yet
        stream.finalize()
        found = await collect(stream, until_final=True)
    finally:
        await stream.aclose()
    final = found[-1]
    assert isinstance(final, DeepgramTranscript)
    assert final.from_finalize and not final.speech_final
    assert final.text == "Hello there, how are you?"
    assert final.language == "en-ZA"  # as asked; Deepgram was sent its primary language
    assert fake.listen_sessions[0].param("language") == "en"
    assert fake.listen_sessions[0].finalizes == 1


async def test_stt_results_end_cleanly_after_aclose(fake: FakeDeepgram) -> None:
    stream = await stt_provider(fake).open_stream("en-US", RATE_HZ, [])
    feed_audio(stream, SPEECH)
    await fake.listen_sessions[0].audio_seen.wait()
    await stream.aclose()  # CloseStream: the server flushes the pending words, then Metadata
    found = [t async for t in stream.results()]
    assert found and found[-1].is_final and found[-1].text == "Hello there, how are you?"
    assert stream.session.request_id is not None
    assert [t async for t in stream.results()] == []  # ended stays ended


async def test_stt_keepalive_holds_an_idle_stream_open(fake: FakeDeepgram) -> None:
    fake.idle_timeout_s = 0.5
    stream = await stt_provider(fake, keepalive_interval_s=0.02).open_stream("en-US", RATE_HZ, [])
    record = fake.listen_sessions[0]
    try:
        async with asyncio.timeout(5):
            while record.keepalives < 30:  # more than 0.5 s without audio has passed
                record.keepalive_seen.clear()
                await record.keepalive_seen.wait()
        assert not record.ended.is_set() and record.audio_bytes == 0
    finally:
        await stream.aclose()


async def test_stt_idle_close_net_0001_is_provider_timeout(fake: FakeDeepgram) -> None:
    fake.idle_timeout_s = 0.05
    stream = await stt_provider(fake, keepalive_interval_s=60.0).open_stream("en-US", RATE_HZ, [])
    try:
        error = await failure_of(stream)
    finally:
        await stream.aclose()
    assert isinstance(error, ProviderTimeout) and "NET-0001" in str(error)
    assert fake.listen_sessions[0].close_code == 1011


@pytest.mark.parametrize(
    ("failure", "kind", "fragment"),
    [
        ("close_1011", ProviderTimeout, "NET-0000"),
        ("net_0001", ProviderTimeout, "NET-0001"),
        ("data_0000", ProviderUnavailable, "DATA-0000"),
        ("malformed_json", ProviderUnavailable, "malformed"),
    ],
)
async def test_stt_failures_mid_stream(
    fake: FakeDeepgram, failure: str, kind: type[SpeechError], fragment: str
) -> None:
    fake.listen_failure = failure  # type: ignore[assignment]
    stream = await stt_provider(fake).open_stream("en-US", RATE_HZ, [])
    try:
        feed_audio(stream, SPEECH)
        error = await failure_of(stream)
        assert [t async for t in stream.results()] == []  # raised once, then nothing more
    finally:
        await stream.aclose()
    assert type(error) is kind and fragment in str(error)


async def test_stt_results_that_never_come_are_provider_timeout(fake: FakeDeepgram) -> None:
    fake.listen_failure = "stall_results"
    provider = stt_provider(fake, response_timeout_s=0.1)
    stream = await provider.open_stream("en-US", RATE_HZ, [])
    try:
        feed_audio(stream, SPEECH)
        error = await failure_of(stream)
    finally:
        await stream.aclose()
    assert isinstance(error, ProviderTimeout) and "sent nothing for 0.1 s" in str(error)


async def test_stt_stalled_handshake_is_provider_timeout(fake: FakeDeepgram) -> None:
    fake.listen_failure = "stall_handshake"
    with pytest.raises(ProviderTimeout, match=r"did not connect within 0\.1 s"):
        await stt_provider(fake, open_timeout_s=0.1).open_stream("en-US", RATE_HZ, [])


@pytest.mark.parametrize(
    ("failure", "fragment"),
    [
        ("payment_required", "HTTP 402"),
        ("rate_limited", "HTTP 429"),
        ("server_error", "HTTP 500"),
    ],
)
async def test_stt_refused_handshakes_are_provider_unavailable(
    fake: FakeDeepgram, failure: str, fragment: str
) -> None:
    fake.listen_failure = failure  # type: ignore[assignment]
    with pytest.raises(ProviderUnavailable, match=fragment):
        await stt_provider(fake).open_stream("en-US", RATE_HZ, [])


async def test_stt_wrong_key_is_provider_unavailable_without_the_key(fake: FakeDeepgram) -> None:
    provider = DeepgramSttProvider("wrong-key-xyz", base_url=fake.base_url)
    with pytest.raises(ProviderUnavailable, match="refused the API key") as info:
        await provider.open_stream("en-US", RATE_HZ, [])
    assert "wrong-key-xyz" not in str(info.value) and KEY not in str(info.value)
    assert fake.listen_sessions[0].status == 401


async def test_stt_refused_connection_is_provider_unavailable() -> None:
    provider = DeepgramSttProvider(KEY, base_url=closed_port_base_url(), open_timeout_s=2.0)
    with pytest.raises(ProviderUnavailable, match="unreachable"):
        await provider.open_stream("en-US", RATE_HZ, [])


async def test_stt_what_the_model_cannot_do_is_feature_not_supported(fake: FakeDeepgram) -> None:
    provider = stt_provider(fake)
    with pytest.raises(FeatureNotSupported, match="does not transcribe xx"):
        await provider.open_stream("xx", RATE_HZ, [])
    with pytest.raises(FeatureNotSupported, match="11025 Hz"):
        await provider.open_stream("en-US", 11025, [])
    with pytest.raises(InvalidCatalogId, match="en_US"):
        await provider.open_stream("en_US", RATE_HZ, [])
    assert fake.listen_sessions == []  # refused before connecting
    unknown_model = stt_provider(fake, model="whisper-huge")
    with pytest.raises(FeatureNotSupported, match="HTTP 400"):  # Deepgram's own refusal
        await unknown_model.open_stream("en-US", RATE_HZ, [])


def test_speech_config_round_trip() -> None:
    config = SpeechConfig(DeepgramConfig(KEY, base_url="http://127.0.0.1:9"))
    provider = DeepgramSttProvider.from_config(config.deepgram)  # type: ignore[arg-type]
    assert provider.model == "nova-3"
    assert KEY not in repr(config)


class _StuckSocket:
    """A connection whose peer stopped reading: sends never complete, nothing arrives."""

    close_code: int | None = None
    close_reason: str | None = None

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def send(self, message: bytes | str) -> None:
        await asyncio.Event().wait()

    def __aiter__(self) -> DeepgramSttStream:
        return self  # type: ignore[return-value]

    async def __anext__(self) -> str:
        await self.closed.wait()
        raise StopAsyncIteration

    async def close(self) -> None:
        self.close_code = 1000
        self.closed.set()


async def test_stt_send_that_never_completes_is_provider_timeout() -> None:
    from appbridge.clock import SystemClock

    ws = _StuckSocket()
    clock = SystemClock()
    stream = DeepgramSttStream(
        ws,  # type: ignore[arg-type]
        ListenSession("en-US", now=clock.now()),
        clock=clock,
        close_timeout_s=0.05,
        send_timeout_s=0.05,
    )
    try:
        stream.feed(b"\x00\x01" * 160)
        error = await failure_of(stream)
    finally:
        await stream.aclose()
    assert isinstance(error, ProviderTimeout) and "stopped taking audio" in str(error)
    assert ws.closed.is_set()


def test_json_nested_too_deeply_from_deepgram_is_a_provider_error() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(ProviderUnavailable, match="malformed"):
        session(VirtualClock()).receive_text(deep)
    error = error_from_http(500, deep.encode(), "TTS")
    assert isinstance(error, ProviderUnavailable) and "HTTP 500" in str(error)
