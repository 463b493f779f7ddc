"""The gateway's configuration: a TOML file or the embedded default (docs/configuration.md).

The package keeps one concept per module: :mod:`~appbridge.config.model` (the immutable typed
model, importing nothing else of appbridge), :mod:`~appbridge.config.schema` (typed reads,
``${NAME}`` and value formats), one reader per group of sections, :mod:`~appbridge.config.loader`
(TOML in, a :class:`Config` or every problem out) and :mod:`~appbridge.config.default` (the
embedded default). The names the rest of the gateway imports are re-exported here, so
``from appbridge.config import Config, load_config`` keeps working.
"""

from __future__ import annotations

from appbridge.config.default import default_config
from appbridge.config.loader import load_config, parse_config
from appbridge.config.model import (
    DEEPGRAM_AURA_VOICES,
    DEEPGRAM_BASE_URL,
    DEEPGRAM_STT_MODEL,
    DEEPGRAM_TTS_MODEL,
    DEFAULT_RTP_PORTS,
    DEFAULT_TTS_CACHE_MB,
    DEMO_ACCOUNT_SID,
    DEMO_FALLBACK_MESSAGE,
    EMBEDDED_SOURCE,
    MAX_TTS_CACHE_MB,
    TWILIO_API_BASE,
    ApiConfig,
    AppConfig,
    AppProtocol,
    AudioConfig,
    Codec,
    Config,
    ConfigError,
    DeepgramConfig,
    Fallback,
    HttpConfig,
    ListenerConfig,
    ListenerTracks,
    MediaConfig,
    NumberRoute,
    RateHz,
    ServerConfig,
    SipConfig,
    SipTransport,
    SipTrunk,
    SpeechConfig,
    SpeechDefaults,
    TwilioCarrierConfig,
)

__all__ = [
    "DEEPGRAM_AURA_VOICES",
    "DEEPGRAM_BASE_URL",
    "DEEPGRAM_STT_MODEL",
    "DEEPGRAM_TTS_MODEL",
    "DEFAULT_RTP_PORTS",
    "DEFAULT_TTS_CACHE_MB",
    "DEMO_ACCOUNT_SID",
    "DEMO_FALLBACK_MESSAGE",
    "EMBEDDED_SOURCE",
    "MAX_TTS_CACHE_MB",
    "TWILIO_API_BASE",
    "ApiConfig",
    "AppConfig",
    "AppProtocol",
    "AudioConfig",
    "Codec",
    "Config",
    "ConfigError",
    "DeepgramConfig",
    "Fallback",
    "HttpConfig",
    "ListenerConfig",
    "ListenerTracks",
    "MediaConfig",
    "NumberRoute",
    "RateHz",
    "ServerConfig",
    "SipConfig",
    "SipTransport",
    "SipTrunk",
    "SpeechConfig",
    "SpeechDefaults",
    "TwilioCarrierConfig",
    "default_config",
    "load_config",
    "parse_config",
]
