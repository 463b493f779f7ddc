"""The typed model of the gateway's configuration (docs/configuration.md).

Everything here is immutable once built: the server reads a :class:`Config` and never changes it,
so a call that starts during a reload (or a test) sees one consistent view. This module holds
only the shapes and their defaults, and imports nothing else of appbridge, so any part of the
gateway (the speech providers included) may read the configuration without pulling in the
loader; :mod:`appbridge.config.loader` builds these from TOML and reports every problem.

A section left out turns its part off (docs/configuration.md, "General rules"): no ``[sip]``, no
SIP listener; no ``[carriers.twilio]``, no Twilio routes; no ``[http]`` / ``[api]``, no REST
endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

AppProtocol: TypeAlias = Literal["fonoster", "twilio"]
Codec: TypeAlias = Literal["pcm16", "pcmu"]
RateHz: TypeAlias = Literal[8000, 16000, 24000]
ListenerTracks: TypeAlias = Literal["inbound", "outbound", "both"]
SipTransport: TypeAlias = Literal["udp", "tcp", "tls"]
SrtpMode: TypeAlias = Literal["off", "optional", "required"]

EMBEDDED_SOURCE: Final = "<embedded default>"
DEMO_ACCOUNT_SID: Final = "AC" + "0" * 32
DEMO_FALLBACK_MESSAGE: Final = "Sorry, the demo app is not available right now."
TWILIO_API_BASE: Final = "https://api.twilio.com"
DEEPGRAM_BASE_URL: Final = "https://api.deepgram.com"
DEEPGRAM_TTS_MODEL: Final = "aura-2-thalia-en"
DEEPGRAM_STT_MODEL: Final = "nova-3"
DEEPGRAM_PROVIDER: Final = "deepgram"
# The featured Aura-2 voices the catalog offers with [speech.deepgram] (Deepgram's "Voices and
# Languages" list); the configuration lists more with `voices`. The provider reads them from here.
DEEPGRAM_AURA_VOICES: Final = (
    "aura-2-thalia-en", "aura-2-andromeda-en", "aura-2-helena-en", "aura-2-apollo-en",
    "aura-2-arcas-en", "aura-2-aries-en", "aura-2-asteria-en", "aura-2-athena-en",
    "aura-2-luna-en", "aura-2-orion-en", "aura-2-zeus-en",
    "aura-2-celeste-es", "aura-2-estrella-es", "aura-2-nestor-es",
    "aura-2-aurelia-de", "aura-2-elara-de", "aura-2-agathe-fr", "aura-2-beatrix-nl",
    "aura-2-cesare-it", "aura-2-cinzia-it", "aura-2-ama-ja", "aura-2-ebisu-ja",
)  # fmt: skip
DEFAULT_RTP_PORTS: Final = (20000, 29999)
DEFAULT_SIP_LISTEN: Final = ("udp:127.0.0.1:5060", "tcp:127.0.0.1:5060")
# [speech] tts_cache_mb: the default budget of the utterance cache, and its ceiling.
DEFAULT_TTS_CACHE_MB: Final = 32
MAX_TTS_CACHE_MB: Final = 4096


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
    tls: TlsFiles | None = None  # the gateway serves HTTPS (and wss) itself
    max_stt_lag_s: float | None = None  # refuse new calls while the local STT is this far behind

    def base_url(self) -> str:
        """The URL carriers use to reach this gateway; routes are appended to it.

        Without ``public_url`` it is the listening address, https when the gateway serves TLS
        itself (``tls``); a wildcard bind address (``0.0.0.0``, ``::``) is not dialable, so the
        loopback address of the same family stands in for it.
        """
        if self.public_url is not None:
            return self.public_url
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"


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
class ClusterConfig:
    """``[cluster]``: this node's place in a cluster of gateways sharing one Redis
    (docs/scaling.md). Without it the gateway is a single node, exactly as before."""

    node_id: str
    redis_url: str = field(repr=False)
    internal_url: str
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class IceServer:
    """One entry of ``[webrtc] ice_servers``: a STUN or TURN server (RFC 8489, RFC 8656)."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class WebRtcConfig:
    """``[webrtc]``: browser calls (docs/webrtc.md). ``host_addresses`` empty: every interface's
    address is a host candidate, as aioice does by itself."""

    host_addresses: tuple[str, ...] = ()
    ice_servers: tuple[IceServer, ...] = ()
    max_pending_offers: int = 8


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
    # SDES-SRTP (RFC 4568): "required" is the default over TLS, "off" over UDP and TCP.
    srtp: SrtpMode = "off"
    # Keep a registration with the trunk (RFC 3261 §10), refreshed before it expires.
    register: bool = False
    register_expires_s: int = 3600


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A certificate chain and its key, with an optional extra CA bundle for checking peers."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: ``listen`` entries are ``"udp:HOST:PORT"``, ``"tcp:HOST:PORT"`` or
    ``"tls:HOST:PORT"`` (the last needs ``tls``)."""

    listen: tuple[str, ...]
    rtp_ports: tuple[int, int]
    public_address: str | None
    trunks: tuple[SipTrunk, ...]
    tls: TlsFiles | None = None


@dataclass(frozen=True, slots=True)
class SpeechDefaults:
    """An app's default voice and language, as catalog ids (docs/speech.md)."""

    voice: str = "local/en-US"
    language: str = "en-US"
    # Which STT listens to the caller: "auto" (the voice's provider when it has STT, else
    # local), "local", "deepgram", or "none" (VAD-only turn events, no transcripts: the cheap
    # choice for apps that bring their own recognition).
    stt: str = "auto"


@dataclass(frozen=True, slots=True)
class AudioConfig:
    """The session audio of a ``fonoster`` app: pcm16 at 8, 16 or 24 kHz, or pcmu at 8 kHz
    (docs/protocol-session-v1.md, ``session.start``)."""

    codec: Codec = "pcm16"
    rate: RateHz = 16000


@dataclass(frozen=True, slots=True)
class Fallback:
    """What a call gets when its app cannot be reached: another app, or a spoken message."""

    app: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """A listen-only socket of an app (docs/protocol-session-v1.md, "Listen-only sockets")."""

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
    """``[media]``: bounds on what ``play`` fetches for an app (docs/configuration.md, ``[media]``).

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

    def voice_ids(self) -> list[str]:
        """The catalog ids this section offers: ``tts_model`` first, then the featured voices,
        then ``voices``, each once. App voices are checked against it, and the provider lists
        the same models, so the two never disagree."""
        models = dict.fromkeys([self.tts_model, *DEEPGRAM_AURA_VOICES, *self.voices])
        return [f"{DEEPGRAM_PROVIDER}/{model}" for model in models]


@dataclass(frozen=True, slots=True)
class SpeechConfig:
    """``[speech]``: cloud speech providers (without it only the offline ``local`` one exists)
    and the budget of the cache of finished utterances (appbridge/speech/cache.py)."""

    deepgram: DeepgramConfig | None = None
    tts_cache_mb: int = DEFAULT_TTS_CACHE_MB


# -- [logging] -------------------------------------------------------------------------------
LogFormat: TypeAlias = Literal["text", "json"]
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """``[logging]``: one text line per event, or one JSON object per line for a log shipper
    (docs/configuration.md, ``[logging]``). ``APPBRIDGE_LOG_LEVEL`` overrides ``level``."""

    format: LogFormat = "text"
    level: str = "info"


# -- end of [logging] ------------------------------------------------------------------------


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
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig | None = None
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)
    _routes: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "apps", MappingProxyType(dict(self.apps)))
        routes = {route.number: route.app for route in self.numbers}
        object.__setattr__(self, "_routes", MappingProxyType(routes))

    def route(self, called_number: str) -> AppConfig | None:
        """Routing (docs/configuration.md, ``[[numbers]]``): the exact entry, else ``"*"``, else
        ``None``."""
        ref = self._routes.get(called_number)
        if ref is None:
            ref = self._routes.get("*")
        return self.apps.get(ref) if ref is not None else None
