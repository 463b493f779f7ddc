"""The gateway's configuration: a TOML file (INTERFACES §4) or the embedded default (§3).

Everything here is immutable once built: the server reads a :class:`Config` and never changes it,
so a call that starts during a reload (or a test) sees one consistent view. Building one collects
*every* problem (``"<key.path>: <message>"``) into a single :class:`ConfigError`, so an operator
fixes a file in one round; see :mod:`appbridge.config_schema` for the reading rules (unknown keys,
strict types, ``${NAME}``) and docs/configuration.md for the reference of every key.

A section left out turns its part off (INTERFACES §4): no ``[sip]``, no SIP listener; no
``[carriers.twilio]``, no Twilio routes; no ``[http]`` / ``[api]``, no REST endpoints.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

from appbridge.config_schema import (
    Reader,
    check_ca_bundle,
    check_http_base_url,
    describe,
    is_host,
    key_path,
)

__all__ = [
    "ApiConfig",
    "AppConfig",
    "AudioConfig",
    "Config",
    "ConfigError",
    "DeepgramConfig",
    "Fallback",
    "HttpConfig",
    "ListenerConfig",
    "NumberRoute",
    "ServerConfig",
    "SipConfig",
    "SipTrunk",
    "SpeechConfig",
    "SpeechDefaults",
    "TwilioCarrierConfig",
    "default_config",
    "load_config",
    "parse_config",
]

AppProtocol: TypeAlias = Literal["fonoster", "twilio"]
Codec: TypeAlias = Literal["pcm16", "pcmu"]
RateHz: TypeAlias = Literal[8000, 16000, 24000]
ListenerTracks: TypeAlias = Literal["inbound", "outbound", "both"]
SipTransport: TypeAlias = Literal["udp", "tcp"]

EMBEDDED_SOURCE: Final = "<embedded default>"
DEMO_ACCOUNT_SID: Final = "AC" + "0" * 32
DEMO_FALLBACK_MESSAGE: Final = "Sorry, the demo app is not available right now."
TWILIO_API_BASE: Final = "https://api.twilio.com"
DEEPGRAM_BASE_URL: Final = "https://api.deepgram.com"
DEEPGRAM_TTS_MODEL: Final = "aura-2-thalia-en"
DEEPGRAM_STT_MODEL: Final = "nova-3"


# Secret fields are left out of every repr below, so logging a configuration never leaks them.


class ConfigError(Exception):
    """Every problem of a configuration, each ``"<key.path>: <message>"``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``[server]``: where the gateway listens and how carriers reach it."""

    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    ca_bundle: str | None = None
    drain_timeout_s: float = 30.0
    max_calls: int = 1000
    max_cpu_percent: float | None = None  # refuse new calls while the process is above this

    def base_url(self) -> str:
        """The URL carriers use to reach this gateway; routes are appended to it.

        Without ``public_url`` it is the listening address; a wildcard bind address (``0.0.0.0``,
        ``::``) is not dialable, so the loopback address of the same family stands in for it.
        """
        if self.public_url is not None:
            return self.public_url
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """``[http]``: the credentials of the Twilio-compatible REST hang-up endpoint."""

    account_sid: str
    auth_token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """``[api]``: Bearer tokens of the gateway's own ``/v1`` REST API."""

    tokens: tuple[str, ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class TwilioCarrierConfig:
    """``[carriers.twilio]``: calls from Twilio Programmable Voice.

    Without ``auth_token`` webhooks are not signature-checked and transfers cannot use the REST
    API; the embedded default runs that way, on loopback only.
    """

    account_sid: str
    auth_token: str | None = field(repr=False)
    api_base: str = TWILIO_API_BASE


@dataclass(frozen=True, slots=True)
class SipTrunk:
    """``[[sip.trunks]]``: a carrier trunk; INVITEs are accepted from ``host`` and ``allow``."""

    name: str
    host: str
    port: int = 5060
    transport: SipTransport = "udp"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    allow: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: ``listen`` entries are ``"udp:HOST:PORT"`` / ``"tcp:HOST:PORT"``."""

    listen: tuple[str, ...]
    rtp_ports: tuple[int, int]
    public_address: str | None
    trunks: tuple[SipTrunk, ...]


@dataclass(frozen=True, slots=True)
class SpeechDefaults:
    """An app's default voice and language, as catalog ids (INTERFACES §8)."""

    voice: str = "local/en-US"
    language: str = "en-US"
    # Which STT listens to the caller: "auto" (the voice's provider when it has STT, else
    # local), "local", "deepgram", or "none" (VAD-only turn events, no transcripts: the cheap
    # choice for apps that bring their own recognition).
    stt: str = "auto"


@dataclass(frozen=True, slots=True)
class AudioConfig:
    """The session audio of a ``fonoster`` app (seed 004: pcm16 8/16/24 kHz or pcmu 8 kHz)."""

    codec: Codec = "pcm16"
    rate: RateHz = 16000


@dataclass(frozen=True, slots=True)
class Fallback:
    """What a call gets when its app cannot be reached: another app, or a spoken message."""

    app: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """A listen-only socket of an app (seed 004, "Listen-only sockets")."""

    url: str
    tracks: ListenerTracks = "both"


@dataclass(frozen=True, slots=True)
class AppConfig:
    """``[[apps]]``: one voice app the gateway dials."""

    ref: str
    url: str
    protocol: AppProtocol = "fonoster"
    signing_secret: str | None = field(default=None, repr=False)
    workspace_ref: str | None = None
    speech: SpeechDefaults = SpeechDefaults()
    audio: AudioConfig = AudioConfig()
    fallback: Fallback | None = None
    listeners: tuple[ListenerConfig, ...] = ()
    allow_insecure: bool = False


@dataclass(frozen=True, slots=True)
class MediaConfig:
    """``[media]``: bounds on what ``play`` fetches for an app (DESIGN.md, "Reliability rules").

    ``allow_private`` lets ``play`` fetch from loopback, private and link-local addresses (a
    media server on the operator's own network); off by default so an app cannot make the
    gateway reach into that network.
    """

    allow_private: bool = False
    max_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 10.0
    max_redirects: int = 3


@dataclass(frozen=True, slots=True)
class DeepgramConfig:
    """``[speech.deepgram]``: the Deepgram provider, for TTS (Aura) and STT (Nova).

    ``base_url`` is the REST base (``/v1/speak`` is appended); the live transcription WebSocket
    is the same host with ``https`` turned into ``wss`` (``http`` into ``ws``), so one key points
    both at a self-hosted Deepgram or a test fake. ``voices`` lists Aura models offered in the
    catalog besides the built-in list and ``tts_model``.
    """

    api_key: str = field(repr=False)
    base_url: str = DEEPGRAM_BASE_URL
    tts_model: str = DEEPGRAM_TTS_MODEL
    stt_model: str = DEEPGRAM_STT_MODEL
    voices: tuple[str, ...] = ()

    @property
    def ws_base_url(self) -> str:
        """``base_url`` with its scheme mapped for the WebSocket API (https→wss, http→ws)."""
        scheme, rest = self.base_url.split("://", 1)
        return ("wss" if scheme == "https" else "ws") + "://" + rest


# [speech] tts_cache_mb: the default budget of the utterance cache, and its ceiling.
DEFAULT_TTS_CACHE_MB: Final = 32
MAX_TTS_CACHE_MB: Final = 4096


@dataclass(frozen=True, slots=True)
class SpeechConfig:
    """``[speech]``: cloud speech providers (without it only the offline ``local`` one exists)
    and the budget of the cache of finished utterances (appbridge/speech/cache.py)."""

    deepgram: DeepgramConfig | None = None
    tts_cache_mb: int = DEFAULT_TTS_CACHE_MB


@dataclass(frozen=True, slots=True)
class NumberRoute:
    """``[[numbers]]``: the app answering a called number (E.164, or ``"*"`` for the rest)."""

    number: str
    app: str


@dataclass(frozen=True, slots=True)
class Config:
    """A validated configuration. ``warnings`` are to be logged once at start-up."""

    server: ServerConfig
    http: HttpConfig | None
    api: ApiConfig | None
    twilio: TwilioCarrierConfig | None
    sip: SipConfig | None
    apps: Mapping[str, AppConfig]
    numbers: tuple[NumberRoute, ...]
    source: str = EMBEDDED_SOURCE
    warnings: tuple[str, ...] = ()
    media: MediaConfig = field(default_factory=MediaConfig)
    speech: SpeechConfig | None = None
    _routes: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "apps", MappingProxyType(dict(self.apps)))
        routes = {route.number: route.app for route in self.numbers}
        object.__setattr__(self, "_routes", MappingProxyType(routes))

    def route(self, called_number: str) -> AppConfig | None:
        """INTERFACES §4 routing: the exact ``[[numbers]]`` entry, else ``"*"``, else ``None``."""
        ref = self._routes.get(called_number)
        if ref is None:
            ref = self._routes.get("*")
        return self.apps.get(ref) if ref is not None else None


def default_config(port: int = 8080, *, sip_port: int | None = 5060) -> Config:
    """The embedded default (INTERFACES §3): loopback only, the demo app answers every number,
    SIP on udp and tcp 127.0.0.1:``sip_port`` (``None``: no SIP listener, for tests)."""
    from appbridge.config_sections import DEFAULT_RTP_PORTS

    demo = AppConfig(
        ref="demo",
        url=f"ws://127.0.0.1:{port}/demo/session",
        fallback=Fallback(message=DEMO_FALLBACK_MESSAGE),
    )
    return Config(
        server=ServerConfig(host="127.0.0.1", port=port),
        http=None,
        api=None,
        twilio=TwilioCarrierConfig(account_sid=DEMO_ACCOUNT_SID, auth_token=None),
        sip=(
            SipConfig(
                listen=(f"udp:127.0.0.1:{sip_port}", f"tcp:127.0.0.1:{sip_port}"),
                rtp_ports=DEFAULT_RTP_PORTS,
                public_address=None,
                trunks=(),
            )
            if sip_port is not None
            else None
        ),
        apps={"demo": demo},
        numbers=(NumberRoute("*", "demo"),),
    )


def load_config(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    *,
    known_voice: Callable[[str], bool] | None = None,
) -> Config:
    """Read and validate a TOML file; ``env`` defaults to :data:`os.environ`.

    Relative paths inside the file (``ca_bundle``) are relative to the file's directory, so a
    configuration means the same thing whatever directory the gateway starts in.
    """
    file_path = Path(path)
    source = str(path)
    try:
        text = file_path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read the file ({exc.strerror or exc})"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})"]
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: invalid TOML: {exc}"]) from None
    return parse_config(
        data,
        os.environ if env is None else env,
        known_voice=known_voice,
        source=source,
        base_dir=file_path.parent,
    )


def parse_config(
    data: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    known_voice: Callable[[str], bool] | None = None,
    source: str = "<data>",
    base_dir: str | os.PathLike[str] | None = None,
) -> Config:
    """Validate parsed TOML; raises :class:`ConfigError` listing every problem."""
    from appbridge.config_sections import (
        parse_apps,
        parse_numbers,
        parse_sip,
        parse_speech_providers,
        with_provider_voices,
    )

    reader = Reader(os.environ if env is None else env)
    reader.check_keys(
        "",
        data,
        ("server", "http", "api", "carriers", "sip", "media", "speech", "apps", "numbers"),
    )
    server = _parse_server(reader, data, Path(base_dir) if base_dir is not None else Path.cwd())
    http = _parse_http(reader, data)
    api = _parse_api(reader, data)
    twilio = _parse_twilio(reader, data)
    sip = parse_sip(reader, data)
    media = _parse_media(reader, data)
    speech = parse_speech_providers(reader, data)
    known_voice = with_provider_voices(known_voice, speech)
    apps = parse_apps(reader, data, known_voice=known_voice, rest_enabled=http is not None)
    numbers = parse_numbers(reader, data, apps)
    if twilio is not None and server.public_url is None:
        reader.warn(
            "carriers.twilio is set but server.public_url is not: TwiML stream URLs and signature "
            f"checks use {server.base_url()}, which Twilio cannot reach from the internet"
        )
    if speech is None or speech.deepgram is None:
        for index, app in enumerate(apps.values()):
            if app.speech.stt == "deepgram":
                reader.problem(
                    f"apps[{index}].speech.stt", '"deepgram" needs a [speech.deepgram] section'
                )
    if reader.problems:
        raise ConfigError(reader.problems)
    return Config(
        server=server,
        http=http,
        api=api,
        twilio=twilio,
        sip=sip,
        apps=apps,
        numbers=numbers,
        source=source,
        warnings=tuple(reader.warnings),
        media=media,
        speech=speech,
    )


def _parse_media(reader: Reader, data: Mapping[str, Any]) -> MediaConfig:
    table = reader.table(data, "media", "media")
    if table is None:
        return MediaConfig()
    reader.check_keys("media", table, ("allow_private", "max_bytes", "timeout_s", "max_redirects"))
    d = MediaConfig()
    return MediaConfig(
        allow_private=reader.boolean(
            table, "allow_private", "media.allow_private", default=d.allow_private
        ),
        max_bytes=reader.integer(
            table, "max_bytes", "media.max_bytes", default=d.max_bytes, low=1024, high=1 << 30
        ),
        timeout_s=reader.number(
            table, "timeout_s", "media.timeout_s", default=d.timeout_s, low=0.0, high=300.0
        ),
        max_redirects=reader.integer(
            table, "max_redirects", "media.max_redirects", default=d.max_redirects, low=0, high=10
        ),
    )


def _parse_server(reader: Reader, data: Mapping[str, Any], base_dir: Path) -> ServerConfig:
    table = reader.table(data, "server", "server")
    if table is None:
        return ServerConfig()
    reader.check_keys(
        "server",
        table,
        (
            "host",
            "port",
            "public_url",
            "ca_bundle",
            "drain_timeout_s",
            "max_calls",
            "max_cpu_percent",
        ),
    )
    defaults = ServerConfig()
    host = reader.string(table, "host", "server.host") or defaults.host
    if not is_host(host):
        reader.problem("server.host", f"expected an IP address or host name, got {describe(host)}")
    port = reader.integer(table, "port", "server.port", default=defaults.port, low=1, high=65535)
    public_url = reader.string(table, "public_url", "server.public_url")
    if public_url is not None:
        message = check_http_base_url(public_url)
        if message is not None:
            reader.problem("server.public_url", message)
    ca_bundle = reader.string(table, "ca_bundle", "server.ca_bundle")
    if ca_bundle is not None:
        bundle_path = Path(ca_bundle).expanduser()
        if not bundle_path.is_absolute():
            bundle_path = base_dir / bundle_path
        message = check_ca_bundle(bundle_path)
        if message is not None:
            reader.problem("server.ca_bundle", message)
        ca_bundle = str(bundle_path.resolve())
    drain_timeout_s = reader.number(
        table,
        "drain_timeout_s",
        "server.drain_timeout_s",
        default=defaults.drain_timeout_s,
        low=0.0,
        high=3600.0,
    )
    max_calls = reader.integer(
        table, "max_calls", "server.max_calls", default=defaults.max_calls, low=1, high=1_000_000
    )
    max_cpu_percent = (
        reader.number(
            table, "max_cpu_percent", "server.max_cpu_percent", default=100.0, low=0.0, high=100.0
        )
        if "max_cpu_percent" in table
        else None
    )
    return ServerConfig(
        host, port, public_url, ca_bundle, drain_timeout_s, max_calls, max_cpu_percent
    )


def _account_sid(reader: Reader, table: Mapping[str, Any], path: str) -> str:
    """A Twilio-style account SID: ``AC`` and 32 hex digits."""
    value = reader.string(table, "account_sid", path, required=True)
    if value is None:
        return ""
    body = value[2:]
    if not (
        value.startswith("AC")
        and len(body) == 32
        and all(c in "0123456789abcdefABCDEF" for c in body)
    ):
        reader.problem(path, f'expected "AC" and 32 hex digits, got {describe(value)}')
    return value


def _parse_http(reader: Reader, data: Mapping[str, Any]) -> HttpConfig | None:
    table = reader.table(data, "http", "http")
    if table is None:
        return None
    reader.check_keys("http", table, ("account_sid", "auth_token"))
    account_sid = _account_sid(reader, table, "http.account_sid")
    token = reader.string(table, "auth_token", "http.auth_token", required=True, secret=True)
    return HttpConfig(account_sid, token or "")


def _parse_api(reader: Reader, data: Mapping[str, Any]) -> ApiConfig | None:
    table = reader.table(data, "api", "api")
    if table is None:
        return None
    reader.check_keys("api", table, ("tokens",))
    if "tokens" not in table:
        reader.problem("api.tokens", "missing (required)")
        return ApiConfig(())
    tokens = reader.strings(table, "tokens", "api.tokens", secret=True)
    if tokens is not None and not tokens and not table["tokens"]:
        reader.problem("api.tokens", "must hold at least one token")
    return ApiConfig(tuple(tokens or ()))


def _parse_twilio(reader: Reader, data: Mapping[str, Any]) -> TwilioCarrierConfig | None:
    carriers = reader.table(data, "carriers", "carriers")
    if carriers is None:
        return None
    reader.check_keys("carriers", carriers, ("twilio",))
    table = reader.table(carriers, "twilio", "carriers.twilio")
    if table is None:
        return None
    path = "carriers.twilio"
    reader.check_keys(path, table, ("account_sid", "auth_token", "api_base"))
    account_sid = _account_sid(reader, table, key_path(path, "account_sid"))
    token = reader.string(table, "auth_token", key_path(path, "auth_token"), secret=True)
    if token is None and "auth_token" not in table:
        reader.warn(
            "carriers.twilio.auth_token is not set: Twilio webhooks and media streams are "
            "accepted without X-Twilio-Signature checks, and transfers cannot use the REST API"
        )
    api_base = reader.string(table, "api_base", key_path(path, "api_base")) or TWILIO_API_BASE
    message = check_http_base_url(api_base)
    if message is not None:
        reader.problem(key_path(path, "api_base"), message)
    return TwilioCarrierConfig(account_sid, token, api_base)
