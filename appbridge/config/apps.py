"""Readers of ``[[apps]]`` and ``[[numbers]]``: the voice apps and the routing to them.

Cross-references are checked here: a fallback must name another configured app, a number must
name an existing app, refs and numbers are unique, and every app or listener URL obeys the
plaintext ``ws://`` rule (docs/configuration.md, "The plaintext `ws://` rule", enforced by
:mod:`appbridge.net.plaintext`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from appbridge.config.model import (
    AppConfig,
    AppProtocol,
    AudioConfig,
    Codec,
    Fallback,
    ListenerConfig,
    ListenerTracks,
    NumberRoute,
    RateHz,
    SpeechDefaults,
)
from appbridge.config.schema import (
    MAX_REF_CHARS,
    Reader,
    describe,
    is_bcp47,
    is_e164,
    item_path,
    key_path,
    read_ref,
)
from appbridge.net.plaintext import check_plaintext, parse_authority

MAX_LISTENERS: Final = 4
"""Up to 4 listen-only sockets per app (docs/protocol-session-v1.md, "Listen-only sockets")."""
MAX_FALLBACK_MESSAGE_CHARS: Final = 1000
AUDIO_RATES_HZ: Final = {"pcm16": (8000, 16000, 24000), "pcmu": (8000,)}
"""pcm16 at 8, 16 or 24 kHz, or pcmu at 8 kHz (docs/protocol-session-v1.md, ``session.start``)."""
STT_CHOICES: Final = frozenset({"auto", "local", "deepgram", "none"})

_VOICE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*/\S{1,120}")


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
        read_ref(reader, entry, "ref", key_path(item_path("apps", i), "ref"), seen, "app ref")
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


def parse_numbers(
    reader: Reader, data: Mapping[str, Any], apps: Mapping[str, AppConfig]
) -> tuple[NumberRoute, ...]:
    """Routing entries (docs/configuration.md, ``[[numbers]]``): unique numbers, each naming a
    configured app."""
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
