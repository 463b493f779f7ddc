"""What the call engine needs of the gateway: eleven members, named here once.

A call is built on an object with these members (the running ``Gateway`` has them all), so the
engine never imports the gateway, and a test of the engine can hand it just what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import ssl

    import httpx

    from appbridge.calls.registry import CallRegistry
    from appbridge.clock import Clock
    from appbridge.config import AppConfig, Config
    from appbridge.counters import Metrics
    from appbridge.media.media_clock import MediaClock
    from appbridge.media.music import MusicStore
    from appbridge.speech.base import SttProvider
    from appbridge.speech.catalog import SpeechCatalog


class CallServices(Protocol):
    #: The configuration in force; a call keeps the one it started with (a reload spares it).
    config: Config
    clock: Clock
    registry: CallRegistry
    media_clock: MediaClock
    metrics: Metrics
    catalog: SpeechCatalog
    http: httpx.AsyncClient
    music: MusicStore
    ssl_context: ssl.SSLContext

    def signing_secret(self, app: AppConfig) -> str | None:
        """The secret a new connection to ``app`` is signed with now."""
        ...

    def stt_for(self, voice_id: str, choice: str = "auto") -> SttProvider | None:
        """The recogniser a call of ``voice_id`` listens with (docs/speech.md)."""
        ...
