"""``GET /metrics``: Prometheus text exposition (version 0.0.4) of the gateway's counters."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appbridge.gateway import Gateway


class _Exposition:
    """Lines of the text format: ``# HELP``, ``# TYPE`` and the samples of each metric."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{labels} {value:g}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.metric(name, kind, help_text, [("", value)])


def render_metrics(gw: Gateway) -> str:
    out = _Exposition()
    _calls(out, gw)
    _audio_dropped(out, gw)
    _media_clock(out, gw)
    _tts_cache(out, gw)
    _gc(out, gw)
    return "\n".join(out.lines) + "\n"


def _calls(out: _Exposition, gw: Gateway) -> None:
    m = gw.metrics
    out.one("appbridge_calls_live", "gauge", "Calls in progress.", len(gw.registry))
    out.one(
        "appbridge_asyncio_tasks",
        "gauge",
        "Tasks of the event loop; a soak checks it stays flat.",
        len(asyncio.all_tasks()),
    )
    out.one(
        "appbridge_calls_started_total", "counter", "Calls accepted.", gw.registry.total_started
    )
    out.one(
        "appbridge_calls_rejected_total",
        "counter",
        "Calls refused (capacity or draining).",
        gw.registry.total_rejected,
    )
    out.metric(
        "appbridge_calls_ended_total",
        "counter",
        "Calls ended, by session.end reason.",
        [(f'{{reason="{r}"}}', n) for r, n in sorted(m.calls_ended.items())] or [("", 0)],
    )
    out.one(
        "appbridge_app_unreachable_total",
        "counter",
        "App dials that failed for the whole window.",
        m.app_unreachable,
    )
    out.one(
        "appbridge_bad_signatures_total",
        "counter",
        "Carrier requests refused for their signature.",
        m.bad_signatures,
    )
    out.one(
        "appbridge_carrier_bad_messages_total",
        "counter",
        "Malformed carrier messages.",
        m.carrier_bad_messages,
    )


def _audio_dropped(out: _Exposition, gw: Gateway) -> None:
    m = gw.metrics
    to_app, to_carrier = m.audio_dropped_to_app, m.audio_dropped_to_carrier
    for call in gw.registry:
        if call.link is not None:
            to_app += call.link.audio_dropped_frames
        if call.leg is not None:
            to_carrier += call.leg.audio_dropped
    out.metric(
        "appbridge_audio_frames_dropped_total",
        "counter",
        "Audio frames dropped because the receiving peer read too slowly (never waited on).",
        [('{to="app"}', to_app), ('{to="carrier"}', to_carrier)],
    )


def _media_clock(out: _Exposition, gw: Gateway) -> None:
    clock = gw.media_clock
    hist = clock.lateness
    snap = hist.snapshot()
    name = "appbridge_media_tick_lateness_ms"
    lines = out.lines
    lines.append(f"# HELP {name} How late each 20 ms media tick started.")
    lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, count in zip(snap["buckets_ms"], snap["counts"], strict=True):  # type: ignore[call-overload]
        cumulative += count
        le = "+Inf" if bound >= 1e9 else f"{bound:g}"
        lines.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
    lines.append(f"{name}_sum {hist.sum_ms:g}")
    lines.append(f"{name}_count {hist.total}")
    out.one("appbridge_media_tick_resyncs_total", "counter", "Media clock resyncs.", clock.resyncs)


def _tts_cache(out: _Exposition, gw: Gateway) -> None:
    cache = gw.catalog.tts_cache
    if cache is None:
        return
    out.metric(
        "appbridge_tts_cache_requests_total",
        "counter",
        "Speech requests by whether the finished utterance was cached (speech/cache.py).",
        [('{result="hit"}', cache.stats.hits), ('{result="miss"}', cache.stats.misses)],
    )
    out.one("appbridge_tts_cache_bytes", "gauge", "PCM held by the utterance cache.", cache.bytes)


def _gc(out: _Exposition, gw: Gateway) -> None:
    pacer = getattr(gw, "gc_pacer", None)
    if pacer is None:
        return
    passes = pacer.pacer
    out.one(
        "appbridge_gc_full_passes_total",
        "counter",
        "Full garbage collections run between media ticks (media/gc_pacer.py).",
        passes.passes,
    )
    out.one(
        "appbridge_gc_early_passes_total",
        "counter",
        "Those of them run before their period was up: enough new objects to walk.",
        passes.early_passes,
    )
    out.one(
        "appbridge_gc_deep_passes_total",
        "counter",
        "Those of them that also walked the frozen objects (gc.unfreeze first).",
        passes.deep_passes,
    )
    out.one(
        "appbridge_gc_full_pass_seconds_total",
        "counter",
        "Time spent in those passes, with the loop stopped.",
        round(passes.total_s, 6),
    )
    out.one(
        "appbridge_gc_full_pass_max_seconds",
        "gauge",
        "The longest of those passes.",
        round(passes.max_s, 6),
    )
