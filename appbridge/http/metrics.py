"""``GET /metrics``: Prometheus text exposition (version 0.0.4) of the gateway's counters."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appbridge.gateway import Gateway


def render_metrics(gw: Gateway) -> str:
    m = gw.metrics
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}")

    metric("appbridge_calls_live", "gauge", "Calls in progress.", [("", len(gw.registry))])
    metric(
        "appbridge_asyncio_tasks",
        "gauge",
        "Tasks of the event loop; a soak checks it stays flat.",
        [("", len(asyncio.all_tasks()))],
    )
    metric(
        "appbridge_calls_started_total",
        "counter",
        "Calls accepted.",
        [("", gw.registry.total_started)],
    )
    metric(
        "appbridge_calls_rejected_total",
        "counter",
        "Calls refused (capacity or draining).",
        [("", gw.registry.total_rejected)],
    )
    metric(
        "appbridge_calls_ended_total",
        "counter",
        "Calls ended, by session.end reason.",
        [(f'{{reason="{r}"}}', n) for r, n in sorted(m.calls_ended.items())] or [("", 0)],
    )
    metric(
        "appbridge_app_unreachable_total",
        "counter",
        "App dials that failed for the whole window.",
        [("", m.app_unreachable)],
    )
    metric(
        "appbridge_bad_signatures_total",
        "counter",
        "Carrier requests refused for their signature.",
        [("", m.bad_signatures)],
    )
    metric(
        "appbridge_carrier_bad_messages_total",
        "counter",
        "Malformed carrier messages.",
        [("", m.carrier_bad_messages)],
    )
    to_app, to_carrier = m.audio_dropped_to_app, m.audio_dropped_to_carrier
    for call in gw.registry:
        if call.link is not None:
            to_app += call.link.audio_dropped_frames
        if call.leg is not None:
            to_carrier += call.leg.audio_dropped
    metric(
        "appbridge_audio_frames_dropped_total",
        "counter",
        "Audio frames dropped because the receiving peer read too slowly (never waited on).",
        [('{to="app"}', to_app), ('{to="carrier"}', to_carrier)],
    )
    clock = gw.media_clock
    hist = clock.lateness
    snap = hist.snapshot()
    name = "appbridge_media_tick_lateness_ms"
    lines.append(f"# HELP {name} How late each 20 ms media tick started.")
    lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, count in zip(snap["buckets_ms"], snap["counts"], strict=True):  # type: ignore[call-overload]
        cumulative += count
        le = "+Inf" if bound >= 1e9 else f"{bound:g}"
        lines.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
    lines.append(f"{name}_sum {hist.sum_ms:g}")
    lines.append(f"{name}_count {hist.total}")
    metric(
        "appbridge_media_tick_resyncs_total",
        "counter",
        "Media clock resyncs.",
        [("", clock.resyncs)],
    )
    cache = gw.catalog.tts_cache
    if cache is not None:
        metric(
            "appbridge_tts_cache_requests_total",
            "counter",
            "Speech requests by whether the finished utterance was cached (speech/cache.py).",
            [('{result="hit"}', cache.stats.hits), ('{result="miss"}', cache.stats.misses)],
        )
        metric(
            "appbridge_tts_cache_bytes",
            "gauge",
            "PCM held by the utterance cache.",
            [("", cache.bytes)],
        )
    pacer = getattr(gw, "gc_pacer", None)
    if pacer is not None:
        passes = pacer.pacer
        metric(
            "appbridge_gc_full_passes_total",
            "counter",
            "Full garbage collections run between media ticks (media/gc_pacer.py).",
            [("", passes.passes)],
        )
        metric(
            "appbridge_gc_early_passes_total",
            "counter",
            "Those of them run before their period was up: enough new objects to walk.",
            [("", passes.early_passes)],
        )
        metric(
            "appbridge_gc_deep_passes_total",
            "counter",
            "Those of them that also walked the frozen objects (gc.unfreeze first).",
            [("", passes.deep_passes)],
        )
        metric(
            "appbridge_gc_full_pass_seconds_total",
            "counter",
            "Time spent in those passes, with the loop stopped.",
            [("", round(passes.total_s, 6))],
        )
        metric(
            "appbridge_gc_full_pass_max_seconds",
            "gauge",
            "The longest of those passes.",
            [("", round(passes.max_s, 6))],
        )
    return "\n".join(lines) + "\n"
