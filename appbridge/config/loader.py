"""Reading a configuration file: TOML in, a validated :class:`Config` or every problem out.

Building one collects *every* problem (``"<key.path>: <message>"``) into a single
:class:`ConfigError`, so an operator fixes a file in one round (docs/configuration.md, "General
rules"). Each section has its reader (:mod:`~appbridge.config.server`,
:mod:`~appbridge.config.carriers`, :mod:`~appbridge.config.speech`,
:mod:`~appbridge.config.apps`); the checks that span sections are here.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from appbridge.config.apps import parse_apps, parse_numbers
from appbridge.config.carriers import parse_sip, parse_twilio
from appbridge.config.cluster import parse_cluster
from appbridge.config.logging import parse_logging
from appbridge.config.model import AppConfig, Config, ConfigError, ServerConfig, SpeechConfig
from appbridge.config.schema import Reader
from appbridge.config.server import parse_api, parse_http, parse_media, parse_server
from appbridge.config.speech import parse_speech_providers, with_provider_voices
from appbridge.config.webrtc import parse_webrtc

TOP_LEVEL_KEYS = (
    "server",
    "http",
    "api",
    "carriers",
    "sip",
    "media",
    "speech",
    "apps",
    "numbers",
    "cluster",
    "webrtc",
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
    reader = Reader(os.environ if env is None else env)
    reader.check_keys("", data, (*TOP_LEVEL_KEYS, "logging"))  # [logging]: config/logging.py
    folder = Path(base_dir) if base_dir is not None else Path.cwd()
    server = parse_server(reader, data, folder)
    http = parse_http(reader, data)
    api = parse_api(reader, data)
    twilio = parse_twilio(reader, data)
    sip = parse_sip(reader, data, folder)
    media = parse_media(reader, data)
    speech = parse_speech_providers(reader, data)
    known_voice = with_provider_voices(known_voice, speech)
    apps = parse_apps(reader, data, known_voice=known_voice, rest_enabled=http is not None)
    numbers = parse_numbers(reader, data, apps)
    logging_config = parse_logging(reader, data)
    cluster = parse_cluster(reader, data)
    webrtc = parse_webrtc(reader, data)
    _check_across_sections(reader, server, twilio is not None, speech, apps)
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
        logging=logging_config,
        cluster=cluster,
        webrtc=webrtc,
    )


def _check_across_sections(
    reader: Reader,
    server: ServerConfig,
    twilio_enabled: bool,
    speech: SpeechConfig | None,
    apps: Mapping[str, AppConfig],
) -> None:
    """The rules no single section can check: Twilio needs a public URL to reach the gateway,
    and an app may only ask for Deepgram STT when ``[speech.deepgram]`` exists."""
    if twilio_enabled and server.public_url is None:
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
