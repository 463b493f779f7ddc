"""The gateway's shared services: what every call and every route reaches through one object.

It holds the configuration in force (swapped whole on SIGHUP: new calls see the new one at once,
live calls keep the snapshot they started with), the call registry, the one media clock, the
speech catalog, the outbound HTTP client and the TLS context for ``wss://`` app links.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import ssl
import time
from collections.abc import Sequence

import httpx

from appbridge.admission import CpuLoad, refusal
from appbridge.calls.registry import CallRegistry
from appbridge.carriers.sip.inbound import SipService
from appbridge.carriers.twilio.rest import TwilioRestClient
from appbridge.carriers.twilio_outbound import TwilioOutbound
from appbridge.clock import Clock, SystemClock
from appbridge.cluster.service import ClusterService
from appbridge.config import AppConfig, Config
from appbridge.console.logins import SessionStore
from appbridge.counters import Metrics
from appbridge.media.gc_pacer import GcPacer, GcPacerShell, period_from_env
from appbridge.media.media_clock import MediaClock, slice_from_env
from appbridge.media.music import MusicStore
from appbridge.net.loop_watch import LoopStallWatch, MemoryDiffLog, threshold_from_env
from appbridge.net.ws_client import close_all
from appbridge.speech.base import SttProvider
from appbridge.speech.catalog import SpeechCatalog, build_catalog
from appbridge.speech.providers.deepgram_stt import DeepgramSttProvider
from appbridge.speech.providers.local_stt import LocalSttProvider

log = logging.getLogger(__name__)


RETIRED_PROVIDER_GRACE_S = 600.0


async def _aclose_all(providers: Sequence[object]) -> None:
    for provider in providers:
        aclose = getattr(provider, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                log.exception("closing a retired speech provider failed")


def build_ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """System roots, plus the operator's private CA bundle when configured (docs/configuration.md,
    `[server]` ``ca_bundle``)."""
    ctx = ssl.create_default_context()
    if ca_bundle:
        ctx.load_verify_locations(cafile=ca_bundle)
    return ctx


#: Modules that libraries import on first use, on the loop: the first Twilio REST hangup
#: imported anyio's asyncio backend (through httpcore's ``AsyncEvent``), a 60 ms stall in the
#: churn soak (docs/PERFORMANCE.md). Imported at start-up instead, before ``gc.freeze()``.
LAZY_IMPORTS = ("anyio._backends._asyncio",)


def _preload_lazy_imports() -> None:
    for name in LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # pragma: no cover - an optional backend is missing: no harm
            log.debug("preload: %s is not installed", name)


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        catalog: SpeechCatalog | None = None,
        http: httpx.AsyncClient | None = None,
        stt_providers: dict[str, SttProvider] | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.catalog = catalog or build_catalog(config)
        self.registry = CallRegistry()
        #: The browser pages' login sessions (http/web_auth.py); a restart logs everyone out.
        self.web_sessions = SessionStore()
        self.media_clock = MediaClock(slice_size=slice_from_env(), clock=self.clock)
        self.metrics = Metrics()
        self.http = http or httpx.AsyncClient(
            timeout=10.0, headers={"User-Agent": "AppBridge"}, follow_redirects=False
        )
        # Hold and transfer music: one fetch and one copy per track, shared by the calls.
        self.music = MusicStore(self.clock)
        self.draining = False
        self.cpu = CpuLoad()
        self._cpu_task: asyncio.Task[None] | None = None
        self.config = config
        self.ssl_context = build_ssl_context(config.server.ca_bundle)
        self.twilio_rest = TwilioRestClient(self.http, config.twilio) if config.twilio else None
        self.stt_providers: dict[str, SttProvider] = dict(stt_providers or {})
        deepgram = config.speech.deepgram if config.speech is not None else None
        if deepgram is not None and "deepgram" not in self.stt_providers:
            self.stt_providers["deepgram"] = DeepgramSttProvider.from_config(deepgram)
        if "local" not in self.stt_providers:
            self.stt_providers["local"] = LocalSttProvider()
        # The SIP carrier: started and stopped with the gateway when [sip] is set.
        self.sip: SipService | None = None
        # Calls placed through Twilio's REST API (carriers/twilio_outbound.py), made on first use.
        self.twilio_outbound: TwilioOutbound | None = None
        # Opt-in diagnostic (APPBRIDGE_STALL_TRACE_MS): log what holds the loop too long.
        self.stall_watch: LoopStallWatch | None = None
        self.memory_log: MemoryDiffLog | None = None
        # The cluster directory and membership in Redis, with [cluster] (docs/scaling.md).
        self.cluster: ClusterService | None = None
        # Full garbage collections every 10 s between ticks (sooner when many objects were made),
        # each over what is newer than the last one, not one big one a minute
        # (media/gc_pacer.py); APPBRIDGE_GC_PERIOD_S=0 leaves CPython's schedule. A deep pass
        # prefers a moment with no call live.
        gc_period_s = period_from_env()
        self.gc_pacer = (
            GcPacerShell(
                GcPacer(gc_period_s), clock=self.clock.now, idle=lambda: len(self.registry) == 0
            )
            if gc_period_s is not None
            else None
        )
        self._gc_key: int | None = None

    def stt_for(self, voice_id: str, choice: str = "auto") -> SttProvider | None:
        """The STT a call listens with: ``speech.stt`` of its app, where ``auto`` means the
        voice's provider (``deepgram/...`` → Deepgram) when it has STT, else ``local``; ``none``
        means VAD-only turns. Chosen once per call; a failing provider is reported, never
        swapped for another."""
        if choice == "none":
            return None
        if choice != "auto":
            return self.stt_providers.get(choice)
        name = voice_id.split("/", 1)[0]
        return self.stt_providers.get(name) or self.stt_providers["local"]

    def stt_in_use(self) -> set[SttProvider]:
        """The STT providers the configured apps' calls listen with. Only fonoster apps listen
        (calls/call.py ``_sync_ears``: the Twilio dialect has no transcripts), so a gateway with
        Twilio-dialect apps alone loads no recognition model (about 80 MB for the local one)."""
        used: set[SttProvider] = set()
        for app in self.config.apps.values():
            if app.protocol == "fonoster":
                provider = self.stt_for(app.speech.voice, app.speech.stt)
                if provider is not None:
                    used.add(provider)
        return used

    def signing_secret(self, app: AppConfig) -> str | None:
        """The secret a new connection to ``app`` (or its listeners) is signed with: the one
        configured now, even for a call that started before a reload. The session protocol:
        "Rotating the signing secret takes effect immediately; there is no overlap window". An app
        the reload removed keeps the secret the call started with."""
        current = self.config.apps.get(app.ref)
        return current.signing_secret if current is not None else app.signing_secret

    def reload(self, config: Config) -> None:
        """Swap in a validated configuration: apps, numbers and secrets change for new calls."""
        old = self.config
        if (old.server.host, old.server.port) != (config.server.host, config.server.port):
            log.warning("reload: server.host/port changes need a restart; keeping the listener")
        if old.cluster != config.cluster:
            log.warning("reload: [cluster] changes need a restart; keeping the running one")
        self.ssl_context = build_ssl_context(config.server.ca_bundle)
        self.twilio_rest = TwilioRestClient(self.http, config.twilio) if config.twilio else None
        if old.speech != config.speech:
            # New voices and keys for new speech requests; the old providers are closed once
            # the utterances and streams that hold them are long over.
            retired = [*self.catalog.providers(), self.stt_providers.pop("deepgram", None)]
            self.catalog = build_catalog(config)
            deepgram = config.speech.deepgram if config.speech is not None else None
            if deepgram is not None:
                self.stt_providers["deepgram"] = DeepgramSttProvider.from_config(deepgram)
            asyncio.get_running_loop().call_later(
                RETIRED_PROVIDER_GRACE_S, lambda: asyncio.ensure_future(_aclose_all(retired))
            )
        self.config = config
        log.info("configuration reloaded from %s", config.source)

    def admission_refusal(self) -> str | None:
        """Why a new call must be refused now (draining, the call cap, the CPU limit, the
        recogniser's lag), or None. Every carrier asks this before it takes a call."""
        server = self.config.server
        local = self.stt_providers.get("local")
        lag_s = 0.0
        if server.max_stt_lag_s is not None and isinstance(local, LocalSttProvider):
            lag_s = local.lag_s()
        return refusal(
            draining=self.draining,
            live_calls=len(self.registry),
            max_calls=server.max_calls,
            cpu_percent=self.cpu.percent(),
            max_cpu_percent=server.max_cpu_percent,
            stt_lag_s=lag_s,
            max_stt_lag_s=server.max_stt_lag_s,
        )

    async def _sample_cpu(self) -> None:
        while True:
            self.cpu.sample(self.clock.now(), time.process_time())
            await asyncio.sleep(1.0)

    async def start(self) -> None:
        _preload_lazy_imports()
        self.media_clock.start()
        if self.gc_pacer is not None:
            self.gc_pacer.start(asyncio.get_running_loop(), self.media_clock.call_after_tick)
            self._gc_key = self.media_clock.subscribe(self.gc_pacer.on_tick)
        stall_threshold_s = threshold_from_env()
        if stall_threshold_s is not None:
            self.stall_watch = LoopStallWatch(stall_threshold_s)
            self.stall_watch.start(asyncio.get_running_loop())
        self.memory_log = MemoryDiffLog.from_env()
        if self.memory_log is not None:
            self.memory_log.start(asyncio.get_running_loop())
        self._cpu_task = asyncio.get_running_loop().create_task(self._sample_cpu())
        if self.config.sip is not None:
            self.sip = SipService(self, self.config.sip)
            await self.sip.start()
        if self.config.cluster is not None:
            self.cluster = ClusterService(self, self.config.cluster)
            await self.cluster.start()
        # Load the models of the STT providers the apps use, in the background: the first call
        # must not wait, and a model no app needs costs no memory.
        for provider in self.stt_in_use():
            preload = getattr(provider, "preload", None)
            if preload is not None:
                preload()

    async def stop(self) -> None:
        # Calls still live when the gateway stops (a drain that ran out): the drain timed out.
        for call in self.registry:
            await call.end("timeout")
        if self.sip is not None:
            await self.sip.stop()
            self.sip = None
        if self.cluster is not None:  # leaves the cluster once its calls are over
            await self.cluster.stop()
            self.cluster = None
        await close_all(timeout_s=1.0)
        await self.media_clock.stop()
        if self.gc_pacer is not None:
            if self._gc_key is not None:
                self.media_clock.unsubscribe(self._gc_key)
                self._gc_key = None
            self.gc_pacer.stop()
        if self.stall_watch is not None:
            self.stall_watch.stop()
            self.stall_watch = None
        if self.memory_log is not None:
            self.memory_log.stop()
            self.memory_log = None
        if self._cpu_task is not None:
            self._cpu_task.cancel()
        await _aclose_all([*self.catalog.providers(), *self.stt_providers.values()])
        await self.http.aclose()
