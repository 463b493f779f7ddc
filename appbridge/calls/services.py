"""What the call engine needs of the world: the gateway's eleven members, and the core's three.

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
    from appbridge.speech.base import SttProvider, TtsProvider, VoiceInfo
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


class CoreServices(Protocol):
    """What the core asks of the world: pure look-ups and one reading of the carrier leg."""

    def voice_for(
        self, voice: str | None, language: str | None
    ) -> tuple[TtsProvider, VoiceInfo, str]:
        """The provider, voice and language to speak with (docs/speech.md); raises
        :class:`SpeechError`."""
        ...

    def check_language(self, tag: str) -> str:
        """``tag`` normalised when some voice speaks it; raises :class:`SpeechError`."""
        ...

    def unplayed_frames(self) -> int:
        """Frames the active leg holds that the far end has not played yet."""
        ...
