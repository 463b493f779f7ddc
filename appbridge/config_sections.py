"""Readers of ``[sip]``, ``[speech]``, ``[[apps]]`` and ``[[numbers]]`` (INTERFACES §4).

Split from :mod:`appbridge.config` to keep each module small; the dataclasses and the entry points
live there. Cross-references are checked here: a fallback must name another configured app, a
number must name an existing app, refs and numbers are unique, and every app or listener URL
obeys the plaintext ``ws://`` rule (seed 000, :mod:`appbridge.net.plaintext`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from appbridge.config import (
    DEEPGRAM_BASE_URL,
    DEEPGRAM_STT_MODEL,
    DEEPGRAM_TTS_MODEL,
    DEFAULT_TTS_CACHE_MB,
    MAX_TTS_CACHE_MB,
    AppConfig,
    AppProtocol,
    AudioConfig,
    Codec,
    DeepgramConfig,
    Fallback,
    ListenerConfig,
    ListenerTracks,
    NumberRoute,
    RateHz,
    SipConfig,
    SipTransport,
    SipTrunk,
    SpeechConfig,
    SpeechDefaults,
)
from appbridge.config_schema import (
    Reader,
    check_cidr,
    check_http_base_url,
    describe,
    is_bcp47,
    is_e164,
    is_host,
    item_path,
    key_path,
)
from appbridge.net.plaintext import check_plaintext, parse_authority

MAX_LISTENERS: Final = 4
"""Seed 004, "Listen-only sockets": up to 4 listeners per app."""
MAX_REF_CHARS: Final = 128
"""Seed 004: ids are at most 128 characters."""
MAX_FALLBACK_MESSAGE_CHARS: Final = 1000
AUDIO_RATES_HZ: Final = {"pcm16": (8000, 16000, 24000), "pcmu": (8000,)}
"""Seed 004, "Connecting": pcm16 at 8, 16 or 24 kHz, or pcmu at 8 kHz."""
DEFAULT_SIP_LISTEN: Final = ("udp:127.0.0.1:5060", "tcp:127.0.0.1:5060")
DEFAULT_RTP_PORTS: Final = (20000, 29999)

_REF_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_VOICE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*/\S{1,120}")
_LISTEN_RE = re.compile(r"(udp|tcp):(\[[^\]]*\]|[^:\[\]]+):([0-9]{1,5})")
# Deepgram model names: lower-case words joined by '-' (nova-3, nova-2-phonecall). Aura voices
# end in their language (aura-2-thalia-en), which is where the catalog reads the language from.
_MODEL_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_AURA_RE = re.compile(r"aura(?:-[a-z0-9]+)+-[a-z]{2,3}")

_APP_KEYS = (
    "ref",
    "url",
    "protocol",
    "signing_secret",
    "workspace_ref",
    "speech",
    "audio",
    "fallback",
    "listeners",
    "allow_insecure",
)


# -- [sip] -------------------------------------------------------------------------------------


def parse_sip(reader: Reader, data: Mapping[str, Any]) -> SipConfig | None:
    """``[sip]`` is validated now so a file written today keeps working when SIP lands."""
    table = reader.table(data, "sip", "sip")
    if table is None:
        return None
    reader.check_keys("sip", table, ("listen", "rtp_ports", "public_address", "trunks"))
    listen: tuple[str, ...] = DEFAULT_SIP_LISTEN
    if "listen" in table:
        entries = reader.strings(table, "listen", "sip.listen", _check_listen) or []
        if isinstance(table["listen"], list) and not table["listen"]:
            reader.problem("sip.listen", "must hold at least one entry")
        _report_duplicates(reader, "sip.listen", entries)
        listen = tuple(entries)
    rtp_ports = _parse_rtp_ports(reader, table)
    public_address = reader.string(table, "public_address", "sip.public_address")
    if public_address is not None and not is_host(public_address):
        reader.problem(
            "sip.public_address",
            f"expected an IP address or host name, got {describe(public_address)}",
        )
    trunks: list[SipTrunk] = []
    seen: dict[str, str] = {}
    for index, entry in enumerate(reader.tables(table, "trunks", "sip.trunks")):
        trunk = _parse_trunk(reader, item_path("sip.trunks", index), entry, seen)
        if trunk is not None:
            trunks.append(trunk)
    return SipConfig(listen, rtp_ports, public_address, tuple(trunks))


def _check_listen(text: str) -> str | None:
    match = _LISTEN_RE.fullmatch(text)
    expected = f'expected "udp:HOST:PORT" or "tcp:HOST:PORT", got {describe(text)}'
    if match is None:
        return expected
    host = match.group(2)
    if host.startswith("["):
        host = host[1:-1]
        if ":" not in host:
            return expected
    if not is_host(host) or not 1 <= int(match.group(3)) <= 65535:
        return expected
    return None


def _parse_rtp_ports(reader: Reader, table: Mapping[str, Any]) -> tuple[int, int]:
    """An ordered range within 1024..65535 with an even count: RTP and RTCP take port pairs."""
    path = "sip.rtp_ports"
    if "rtp_ports" not in table:
        return DEFAULT_RTP_PORTS
    items = reader.array(table, "rtp_ports", path)
    if items is None:
        return DEFAULT_RTP_PORTS
    if len(items) != 2:
        reader.problem(path, f"expected two ports [first, last], got {len(items)} values")
        return DEFAULT_RTP_PORTS
    problems_before = len(reader.problems)
    low, high = (
        reader.integer_value(item, item_path(path, i), low=1024, high=65535, default=0)
        for i, item in enumerate(items)
    )
    if len(reader.problems) > problems_before:
        return DEFAULT_RTP_PORTS
    if low >= high:
        reader.problem(path, f"the first port must be below the last, got [{low}, {high}]")
    elif (high - low + 1) % 2:
        reader.problem(path, f"the range must hold an even number of ports, got {high - low + 1}")
    return (low, high)


def _parse_trunk(
    reader: Reader, path: str, table: Mapping[str, Any], seen: dict[str, str]
) -> SipTrunk | None:
    reader.check_keys(
        path, table, ("name", "host", "port", "transport", "username", "password", "allow")
    )
    name = _ref(reader, table, "name", key_path(path, "name"), seen, "trunk name")
    host = reader.string(table, "host", key_path(path, "host"), required=True)
    if host is not None and not is_host(host):
        reader.problem(
            key_path(path, "host"), f"expected an IP address or host name, got {describe(host)}"
        )
    port = reader.integer(table, "port", key_path(path, "port"), default=5060, low=1, high=65535)
    transport = reader.choice(
        table, "transport", key_path(path, "transport"), ("udp", "tcp"), "udp"
    )
    username = reader.string(table, "username", key_path(path, "username"))
    password = reader.string(table, "password", key_path(path, "password"), secret=True)
    if password is not None and username is None and "username" not in table:
        reader.problem(key_path(path, "password"), "set without username")
    allow = reader.strings(table, "allow", key_path(path, "allow"), check_cidr) or []
    if name is None or host is None:
        return None
    return SipTrunk(
        name, host, port, cast(SipTransport, transport), username, password, tuple(allow)
    )


# -- [speech] -----------------------------------------------------------------------------------


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
    voices, so an app may name ``deepgram/aura-2-thalia-en`` once ``[speech.deepgram]`` is set.

    The provider module is imported only then, which keeps ``check-config`` of a file without
    cloud speech as light as before.
    """
    if known_voice is None or speech is None or speech.deepgram is None:
        return known_voice
    from appbridge.speech.providers.deepgram import deepgram_voice_ids

    cloud = frozenset(deepgram_voice_ids(speech.deepgram))
    check = known_voice
    return lambda voice: voice in cloud or check(voice)


# -- [[apps]] ------------------------------------------------------------------------------------


def parse_apps(
    reader: Reader,
    data: Mapping[str, Any],
    *,
    known_voice: Callable[[str], bool] | None,
    rest_enabled: bool,
) -> dict[str, AppConfig]:
    """Every ``[[apps]]`` entry by ref, in file order; refs are read first so a fallback may
    name an app defined further down."""
    entries = reader.tables(data, "apps", "apps")
    if "apps" not in data or data["apps"] == []:
        reader.problem("apps", "at least one [[apps]] entry is required")
    seen: dict[str, str] = {}
    refs = [
        _ref(reader, entry, "ref", key_path(item_path("apps", i), "ref"), seen, "app ref")
        for i, entry in enumerate(entries)
    ]
    known_refs = frozenset(ref for ref in refs if ref is not None)
    apps: dict[str, AppConfig] = {}
    for index, (entry, ref) in enumerate(zip(entries, refs, strict=True)):
        app = _parse_app(
            reader, item_path("apps", index), entry, ref, known_refs, known_voice, rest_enabled
        )
        if app is not None:
            apps[app.ref] = app
    return apps


def _parse_app(
    reader: Reader,
    path: str,
    table: Mapping[str, Any],
    ref: str | None,
    known_refs: frozenset[str],
    known_voice: Callable[[str], bool] | None,
    rest_enabled: bool,
) -> AppConfig | None:
    reader.check_keys(path, table, _APP_KEYS)
    allow_insecure = reader.boolean(
        table, "allow_insecure", key_path(path, "allow_insecure"), default=False
    )
    label = f"{path} ({ref})" if ref else path
    if allow_insecure:
        reader.warn(
            f"{label}: allow_insecure = true: plaintext ws:// to any host is accepted for this "
            "app and its listeners; audio and transcripts cross the network unencrypted"
        )
    url = reader.string(table, "url", key_path(path, "url"), required=True)
    if url is not None:
        _check_link_url(reader, key_path(path, "url"), url, allow_insecure)
    protocol = reader.choice(
        table, "protocol", key_path(path, "protocol"), ("fonoster", "twilio"), "fonoster"
    )
    secret = reader.string(table, "signing_secret", key_path(path, "signing_secret"), secret=True)
    workspace_ref = reader.string(
        table, "workspace_ref", key_path(path, "workspace_ref"), max_chars=MAX_REF_CHARS
    )
    if protocol == "twilio" and rest_enabled and workspace_ref is None:
        reader.warn(
            f"{label}: no workspace_ref, so the Twilio-compatible hang-up endpoint answers 404 "
            "for this app's calls (set it to http.account_sid)"
        )
    speech = _parse_speech(reader, key_path(path, "speech"), table, known_voice)
    audio = AudioConfig()
    if "audio" in table and protocol == "twilio":
        reader.problem(
            key_path(path, "audio"),
            'not allowed on a "twilio" app (the Twilio dialect is always µ-law at 8 kHz)',
        )
    elif "audio" in table:
        audio = _parse_audio(reader, key_path(path, "audio"), table)
    fallback = _parse_fallback(reader, key_path(path, "fallback"), table, ref, known_refs)
    listeners = _parse_listeners(reader, key_path(path, "listeners"), table, allow_insecure)
    if ref is None or url is None:
        return None
    return AppConfig(
        ref=ref,
        url=url,
        protocol=cast(AppProtocol, protocol),
        signing_secret=secret,
        workspace_ref=workspace_ref,
        speech=speech,
        audio=audio,
        fallback=fallback,
        listeners=listeners,
        allow_insecure=allow_insecure,
    )


def _check_link_url(reader: Reader, path: str, url: str, allow_insecure: bool) -> None:
    """ws:// or wss:// only, and the plaintext rule unless the app allows insecure links."""
    authority = parse_authority(url)
    if authority is None or authority.scheme not in ("ws", "wss"):
        reader.problem(path, f"expected a ws:// or wss:// URL with a host, got {describe(url)}")
        return
    if "#" in url:
        reader.problem(path, "must not have a fragment (RFC 6455 §3)")
        return
    verdict = check_plaintext(url)
    if verdict.warning is not None:
        reader.warn(f"{path}: {verdict.warning}")
    if not verdict.allowed and not allow_insecure:
        reader.problem(
            path,
            "ws:// is only allowed for loopback/private hosts (set allow_insecure = true on the "
            f"app when a VPN or service mesh protects the path, or use wss://): {verdict.reason}",
        )


def _parse_speech(
    reader: Reader,
    path: str,
    table: Mapping[str, Any],
    known_voice: Callable[[str], bool] | None,
) -> SpeechDefaults:
    defaults = SpeechDefaults()
    speech = reader.table(table, "speech", path)
    if speech is None:
        return defaults
    reader.check_keys(path, speech, ("voice", "language", "stt"))
    voice = reader.string(speech, "voice", key_path(path, "voice"), max_chars=MAX_REF_CHARS)
    if voice is not None:
        if known_voice is not None and not known_voice(voice):
            reader.problem(key_path(path, "voice"), f"unknown voice {describe(voice)}")
        elif known_voice is None and not _VOICE_RE.fullmatch(voice):
            reader.problem(
                key_path(path, "voice"),
                f'expected a catalog id "provider/voice", got {describe(voice)}',
            )
    language = reader.string(speech, "language", key_path(path, "language"), max_chars=64)
    if language is not None and not is_bcp47(language):
        reader.problem(
            key_path(path, "language"),
            f"expected a BCP-47 language tag such as en-US, got {describe(language)}",
        )
    stt = reader.string(speech, "stt", key_path(path, "stt"), max_chars=32) or defaults.stt
    if stt not in STT_CHOICES:
        reader.problem(
            key_path(path, "stt"),
            f"expected one of {', '.join(sorted(STT_CHOICES))}, got {describe(stt)}",
        )
        stt = defaults.stt
    return SpeechDefaults(voice or defaults.voice, language or defaults.language, stt)


STT_CHOICES = frozenset({"auto", "local", "deepgram", "none"})


def _parse_audio(reader: Reader, path: str, table: Mapping[str, Any]) -> AudioConfig:
    audio = reader.table(table, "audio", path)
    if audio is None:
        return AudioConfig()
    reader.check_keys(path, audio, ("codec", "rate"))
    codec = reader.choice(audio, "codec", key_path(path, "codec"), ("pcm16", "pcmu"), "pcm16")
    rates_hz = AUDIO_RATES_HZ[codec]
    default_rate_hz = 16000 if codec == "pcm16" else 8000
    rate_hz = reader.integer(
        audio, "rate", key_path(path, "rate"), default=default_rate_hz, low=1, high=192000
    )
    if rate_hz not in rates_hz:
        allowed = ", ".join(str(rate) for rate in rates_hz)
        reader.problem(
            key_path(path, "rate"), f"{codec} is available at {allowed} Hz, not {rate_hz}"
        )
        rate_hz = default_rate_hz
    return AudioConfig(cast(Codec, codec), cast(RateHz, rate_hz))


def _parse_fallback(
    reader: Reader,
    path: str,
    table: Mapping[str, Any],
    ref: str | None,
    known_refs: frozenset[str],
) -> Fallback | None:
    fallback = reader.table(table, "fallback", path)
    if fallback is None:
        return None
    reader.check_keys(path, fallback, ("app", "message"))
    app = reader.string(fallback, "app", key_path(path, "app"))
    message = reader.string(
        fallback, "message", key_path(path, "message"), max_chars=MAX_FALLBACK_MESSAGE_CHARS
    )
    if ("app" in fallback) == ("message" in fallback):
        reader.problem(path, "set exactly one of app or message")
        return None
    if app is not None:
        if app == ref:
            reader.problem(key_path(path, "app"), "must name another app, not the app itself")
        elif app not in known_refs:
            reader.problem(key_path(path, "app"), f"unknown app {describe(app)}")
    if app is None and message is None:
        return None
    return Fallback(app=app, message=message)


def _parse_listeners(
    reader: Reader, path: str, table: Mapping[str, Any], allow_insecure: bool
) -> tuple[ListenerConfig, ...]:
    entries = reader.tables(table, "listeners", path)
    if len(entries) > MAX_LISTENERS:
        reader.problem(path, f"at most {MAX_LISTENERS} listeners are allowed, got {len(entries)}")
    listeners: list[ListenerConfig] = []
    for index, entry in enumerate(entries):
        at = item_path(path, index)
        reader.check_keys(at, entry, ("url", "tracks"))
        url = reader.string(entry, "url", key_path(at, "url"), required=True)
        if url is not None:
            _check_link_url(reader, key_path(at, "url"), url, allow_insecure)
        tracks = reader.choice(
            entry, "tracks", key_path(at, "tracks"), ("inbound", "outbound", "both"), "both"
        )
        if url is not None:
            listeners.append(ListenerConfig(url, cast(ListenerTracks, tracks)))
    return tuple(listeners)


# -- [[numbers]] ---------------------------------------------------------------------------------


def parse_numbers(
    reader: Reader, data: Mapping[str, Any], apps: Mapping[str, AppConfig]
) -> tuple[NumberRoute, ...]:
    """Routing entries (INTERFACES §4): unique numbers, each naming a configured app."""
    routes: list[NumberRoute] = []
    seen: dict[str, str] = {}
    entries = reader.tables(data, "numbers", "numbers")
    for index, entry in enumerate(entries):
        path = item_path("numbers", index)
        reader.check_keys(path, entry, ("number", "app"))
        number = reader.string(entry, "number", key_path(path, "number"), required=True)
        if number is not None:
            if number != "*" and not is_e164(number):
                reader.problem(
                    key_path(path, "number"),
                    f'expected E.164 ("+" and 2-15 digits) or "*", got {describe(number)}',
                )
                number = None
            elif number in seen:
                reader.problem(
                    key_path(path, "number"),
                    f"duplicate number {describe(number)} (first at {seen[number]})",
                )
                number = None
            else:
                seen[number] = path
        app = reader.string(entry, "app", key_path(path, "app"), required=True)
        if app is not None and app not in apps:
            reader.problem(key_path(path, "app"), f"unknown app {describe(app)}")
            app = None
        if number is not None and app is not None:
            routes.append(NumberRoute(number, app))
    if not entries and apps:
        reader.warn("no [[numbers]] entries: every inbound call is rejected")
    return tuple(routes)


# -- shared --------------------------------------------------------------------------------------


def _ref(
    reader: Reader,
    table: Mapping[str, Any],
    key: str,
    path: str,
    seen: dict[str, str],
    what: str,
) -> str | None:
    """A required, unique identifier of 1-128 characters from ``[A-Za-z0-9._-]``."""
    value = reader.string(table, key, path, required=True, max_chars=MAX_REF_CHARS)
    if value is None:
        return None
    if not _REF_RE.fullmatch(value):
        reader.problem(path, f"expected letters, digits, '.', '_' or '-', got {describe(value)}")
        return None
    if value in seen:
        reader.problem(path, f"duplicate {what} {describe(value)} (first at {seen[value]})")
        return None
    seen[value] = path.rsplit(".", 1)[0]
    return value


def _report_duplicates(reader: Reader, path: str, values: list[str]) -> None:
    first: dict[str, int] = {}
    for index, value in enumerate(values):
        if value in first:
            reader.problem(path, f"duplicate entry {describe(value)}")
        first.setdefault(value, index)
