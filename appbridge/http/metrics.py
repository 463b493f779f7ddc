"""``GET /metrics``: the gateway's counters in the Prometheus text format, via prometheus_client.

The media path keeps counting in plain ints (appbridge/counters.py, the legs, the media clock);
:class:`GatewayCollector` reads them only when a scraper asks, so a frame never touches a
prometheus_client object (docs/operations.md, "Metrics"). The names, types and labels below are
the ones docs/operations.md lists; dashboards and bench/report.py read them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from appbridge.calls.listening import TURN_OUTCOMES
from appbridge.carriers.sip.srtp import DROPS
from appbridge.speech.providers.local_stt import LocalSttProvider

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

__all__ = ["CONTENT_TYPE_LATEST", "GatewayCollector", "node_id", "render_metrics"]


def render_metrics(gw: Gateway) -> str:
    """One scrape: every family :class:`GatewayCollector` yields, as exposition text."""
    return generate_latest(GatewayCollector(gw)).decode("utf-8")


def node_id(gw: Gateway) -> str | None:
    """The node's id from ``[cluster] node_id`` when the configuration has one (docs/operations.md,
    "Metrics"); read loosely so a configuration without the section works."""
    cluster = getattr(gw.config, "cluster", None)
    node = getattr(cluster, "node_id", None) if cluster is not None else None
    return str(node) if node else None


_DECODE_FAMILIES = (
    ("appbridge_stt_decodes_total", "Local STT decodes run, by kind.", "decodes"),
    (
        "appbridge_stt_decoded_audio_seconds_total",
        "Seconds of caller audio the local STT decoded, by kind.",
        "audio_s",
    ),
    (
        "appbridge_stt_decode_seconds_total",
        "Wall time the local STT's decodes took, by kind.",
        "busy_s",
    ),
)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


class GatewayCollector:
    """A prometheus_client collector over one gateway: each ``collect`` reads the counters as they
    are at that moment. It is handed straight to ``generate_latest`` (no global registry), so two
    gateways in one process, as in the tests, never share or collide."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def collect(self) -> Iterator[Metric]:
        yield from self._calls()
        yield from self._carrier_and_app()
        yield self._audio_dropped()
        yield from self._media_clock()
        yield from self._tts_cache()
        yield from self._gc()
        yield from self._node()
        yield from self._registrations()
        yield self._srtp_dropped()
        yield from self._turns()
        yield from self._local_stt()

    def _turns(self) -> Iterator[Metric]:
        """Turn outcomes, and the finals the live calls' recognisers still owe
        (docs/turn-taking.md, "The rules", 5)."""
        gw = self.gw
        family = CounterMetricFamily(
            "appbridge_turns_total", "Turn events sent to apps, by outcome.", labels=("outcome",)
        )
        for outcome in TURN_OUTCOMES:
            family.add_metric((outcome,), gw.metrics.turns.get(outcome, 0))
        yield family
        owed = 0
        for call in gw.registry:
            stream = None if call.ears is None else call.ears.stream
            if stream is not None:
                owed += stream.finals_owed
        yield _gauge(
            "appbridge_stt_finals_owed",
            "Finals of closed utterances the live calls' recognisers have not delivered yet.",
            owed,
        )

    def _local_stt(self) -> Iterator[Metric]:
        """The offline recogniser (docs/speech.md): its streams' counters, and its engine's,
        which is one per process."""
        local = self.gw.stt_providers.get("local")
        if not isinstance(local, LocalSttProvider):
            return
        stats = local.stats
        yield _counter(
            "appbridge_stt_partials_dropped_total",
            "Partial transcripts not decoded because the decoders were busy.",
            stats.partials_dropped,
        )
        yield _counter(
            "appbridge_stt_finals_coalesced_total",
            "Finals merged into the one before because four were waiting.",
            stats.finals_coalesced,
        )
        yield from stats.final_delay.collect()
        yield _gauge(
            "appbridge_stt_lag_seconds",
            "How long the oldest final a live call's local STT owes has waited.",
            local.lag_s(),
        )
        engine = local.started_engine
        kinds = ("final", "partial")
        by_kind = {k: engine.decode_stats[k] for k in kinds} if engine is not None else {}
        for name, help_text, attr in _DECODE_FAMILIES:
            family = CounterMetricFamily(name, help_text, labels=("kind",))
            for kind in kinds:
                decoded = by_kind.get(kind)
                family.add_metric((kind,), 0 if decoded is None else getattr(decoded, attr))
            yield family
        yield _gauge(
            "appbridge_stt_decode_backlog",
            "Decodes waiting for a worker thread.",
            0 if engine is None else engine.backlog,
        )
        yield _gauge(
            "appbridge_stt_decode_workers",
            "Worker threads of the local recogniser (0 before it starts).",
            0 if engine is None else engine.workers,
        )

    def _registrations(self) -> Iterator[Metric]:
        """Registering trunks per state (docs/sip.md, "Registering with a trunk")."""
        sip = self.gw.sip
        if sip is None or not sip.registrations.entries:
            return
        family = GaugeMetricFamily(
            "appbridge_sip_registrations", "Registering SIP trunks, by state.", labels=("state",)
        )
        for state, count in sip.registrations.counts().items():
            family.add_metric((state,), count)
        yield family

    def _srtp_dropped(self) -> Metric:
        """SRTP packets dropped by every leg so far (docs/sip.md, "SRTP (SDES)")."""
        family = CounterMetricFamily(
            "appbridge_srtp_packets_dropped_total",
            "SRTP packets dropped: failed authentication (auth) or replayed (replay).",
            labels=("reason",),
        )
        family.add_metric(("auth",), DROPS.auth_failures)
        family.add_metric(("replay",), DROPS.replays)
        return family

    def _node(self) -> Iterator[Metric]:
        gw = self.gw
        node = node_id(gw)
        if node is not None:
            info = GaugeMetricFamily(
                "appbridge_node_info", "The cluster node this gateway is.", labels=("node",)
            )
            info.add_metric((node,), 1)
            yield info
        yield _gauge(
            "appbridge_draining",
            "1 while draining (SIGTERM): /readyz answers 503 and new calls are refused.",
            1 if gw.draining else 0,
        )
        m = gw.metrics
        yield _counter(
            "appbridge_cluster_redis_errors_total",
            "Cluster directory operations that failed against Redis.",
            m.cluster_redis_errors,
        )
        yield _counter(
            "appbridge_cluster_forwarded_requests_total",
            "Requests forwarded to the node that owns the call.",
            m.cluster_forwarded,
        )

    def _calls(self) -> Iterator[Metric]:
        gw = self.gw
        yield _gauge("appbridge_calls_live", "Calls in progress.", len(gw.registry))
        yield _gauge(
            "appbridge_asyncio_tasks",
            "Tasks of the event loop; a soak checks it stays flat.",
            len(asyncio.all_tasks()),
        )
        yield _counter(
            "appbridge_calls_started_total", "Calls accepted.", gw.registry.total_started
        )
        yield _counter(
            "appbridge_calls_rejected_total",
            "Calls refused (capacity or draining).",
            gw.registry.total_rejected,
        )
        ended = CounterMetricFamily(
            "appbridge_calls_ended_total", "Calls ended, by session.end reason.", labels=("reason",)
        )
        for reason, count in sorted(gw.metrics.calls_ended.items()):
            ended.add_metric((reason,), count)
        if not gw.metrics.calls_ended:
            ended.add_metric((), 0)  # one unlabelled zero, so the family is never empty
        yield ended

    def _carrier_and_app(self) -> Iterator[Metric]:
        m = self.gw.metrics
        yield _counter(
            "appbridge_app_unreachable_total",
            "App dials that failed for the whole window.",
            m.app_unreachable,
        )
        yield _counter(
            "appbridge_bad_signatures_total",
            "Carrier requests refused for their signature.",
            m.bad_signatures,
        )
        yield _counter(
            "appbridge_carrier_bad_messages_total",
            "Malformed carrier messages.",
            m.carrier_bad_messages,
        )

    def _audio_dropped(self) -> Metric:
        """Ended calls' drops are in the counters; the live calls' own are added here."""
        gw = self.gw
        to_app, to_carrier = gw.metrics.audio_dropped_to_app, gw.metrics.audio_dropped_to_carrier
        for call in gw.registry:
            if call.link is not None:
                to_app += call.link.audio_dropped_frames
            if call.leg is not None:
                to_carrier += call.leg.audio_dropped
        family = CounterMetricFamily(
            "appbridge_audio_frames_dropped_total",
            "Audio frames dropped because the receiving peer read too slowly (never waited on).",
            labels=("to",),
        )
        family.add_metric(("app",), to_app)
        family.add_metric(("carrier",), to_carrier)
        return family

    def _media_clock(self) -> Iterator[Metric]:
        clock = self.gw.media_clock
        hist = clock.lateness
        snap = hist.snapshot()
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(snap["buckets_ms"], snap["counts"], strict=True):  # type: ignore[call-overload]
            cumulative += count
            buckets.append(("+Inf" if bound >= 1e9 else f"{bound:g}", cumulative))
        # The family's _count is its +Inf bucket, which is every tick the histogram saw.
        yield HistogramMetricFamily(
            "appbridge_media_tick_lateness_ms",
            "How late each 20 ms media tick started.",
            buckets=buckets,
            sum_value=hist.sum_ms,
        )
        yield _counter("appbridge_media_tick_resyncs_total", "Media clock resyncs.", clock.resyncs)

    def _tts_cache(self) -> Iterator[Metric]:
        cache = self.gw.catalog.tts_cache
        if cache is None:
            return
        requests = CounterMetricFamily(
            "appbridge_tts_cache_requests_total",
            "Speech requests by whether the finished utterance was cached (speech/cache.py).",
            labels=("result",),
        )
        requests.add_metric(("hit",), cache.stats.hits)
        requests.add_metric(("miss",), cache.stats.misses)
        yield requests
        yield _gauge("appbridge_tts_cache_bytes", "PCM held by the utterance cache.", cache.bytes)

    def _gc(self) -> Iterator[Metric]:
        pacer = getattr(self.gw, "gc_pacer", None)
        if pacer is None:
            return
        passes = pacer.pacer
        yield _counter(
            "appbridge_gc_full_passes_total",
            "Full garbage collections run between media ticks (media/gc_pacer.py).",
            passes.passes,
        )
        yield _counter(
            "appbridge_gc_early_passes_total",
            "Those of them run before their period was up: enough new objects to walk.",
            passes.early_passes,
        )
        yield _counter(
            "appbridge_gc_deep_passes_total",
            "Those of them that also walked the frozen objects (gc.unfreeze first).",
            passes.deep_passes,
        )
        yield _counter(
            "appbridge_gc_full_pass_seconds_total",
            "Time spent in those passes, with the loop stopped.",
            round(passes.total_s, 6),
        )
        yield _gauge(
            "appbridge_gc_full_pass_max_seconds",
            "The longest of those passes.",
            round(passes.max_s, 6),
        )
