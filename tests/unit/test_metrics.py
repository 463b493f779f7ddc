"""``GET /metrics`` through prometheus_client (appbridge/http/metrics.py; docs/operations.md,
"Metrics"): the exposition parses, keeps its names and types, and carries the per-node families."""

from __future__ import annotations

import types
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from appbridge.carriers.sip.srtp import DROPS
from appbridge.gateway import Gateway
from appbridge.http.app import build_app
from appbridge.http.metrics import node_id, render_metrics
from appbridge.speech.providers.local_stt import LocalSttProvider, WhisperEngine
from bench.report import parse_metric

# Every family of /metrics with its type: dashboards and bench/report.py read them.
FAMILIES = {
    "appbridge_calls_live": "gauge",
    "appbridge_asyncio_tasks": "gauge",
    "appbridge_calls_started": "counter",
    "appbridge_calls_rejected": "counter",
    "appbridge_calls_ended": "counter",
    "appbridge_app_unreachable": "counter",
    "appbridge_bad_signatures": "counter",
    "appbridge_carrier_bad_messages": "counter",
    "appbridge_audio_frames_dropped": "counter",
    "appbridge_media_tick_lateness_ms": "histogram",
    "appbridge_media_tick_resyncs": "counter",
    "appbridge_tts_cache_requests": "counter",
    "appbridge_tts_cache_bytes": "gauge",
    "appbridge_gc_full_passes": "counter",
    "appbridge_gc_early_passes": "counter",
    "appbridge_gc_deep_passes": "counter",
    "appbridge_gc_full_pass_seconds": "counter",
    "appbridge_gc_full_pass_max_seconds": "gauge",
    "appbridge_draining": "gauge",
    "appbridge_cluster_redis_errors": "counter",
    "appbridge_cluster_forwarded_requests": "counter",
    "appbridge_srtp_packets_dropped": "counter",
    "appbridge_turns": "counter",
    "appbridge_stt_finals_owed": "gauge",
    "appbridge_stt_partials_dropped": "counter",
    "appbridge_stt_finals_coalesced": "counter",
    "appbridge_stt_final_delay_seconds": "histogram",
    "appbridge_stt_lag_seconds": "gauge",
    "appbridge_stt_decodes": "counter",
    "appbridge_stt_decoded_audio_seconds": "counter",
    "appbridge_stt_decode_seconds": "counter",
    "appbridge_stt_decode_backlog": "gauge",
    "appbridge_stt_decode_workers": "gauge",
}


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def fake_call(ref: str, to_app: int, to_carrier: int, owed: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        call_ref=ref,
        link=types.SimpleNamespace(audio_dropped_frames=to_app),
        leg=types.SimpleNamespace(audio_dropped=to_carrier),
        ears=types.SimpleNamespace(stream=types.SimpleNamespace(finals_owed=owed)),
    )


async def test_every_family_keeps_its_name_and_type(gw: Gateway) -> None:
    parsed = families(render_metrics(gw))
    for name, kind in FAMILIES.items():
        assert name in parsed, name
        assert parsed[name].type == kind, name
    assert "appbridge_node_info" not in parsed  # no [cluster] node_id


async def test_help_texts_and_sample_lines_stay(gw: Gateway) -> None:
    text = render_metrics(gw)
    assert "# HELP appbridge_calls_live Calls in progress.\n" in text
    assert "# TYPE appbridge_calls_started_total counter\n" in text
    assert "# HELP appbridge_calls_ended_total Calls ended, by session.end reason.\n" in text
    assert "\nappbridge_calls_ended_total 0.0\n" in text  # the family is never empty
    assert '\nappbridge_media_tick_lateness_ms_bucket{le="+Inf"} ' in text
    assert '\nappbridge_tts_cache_requests_total{result="hit"} ' in text


async def test_counters_are_read_at_scrape_time(gw: Gateway) -> None:
    gw.metrics.calls_ended.update({"app_hangup": 3, "caller_hangup": 4})
    gw.metrics.audio_dropped_to_app = 5
    gw.metrics.cluster_redis_errors = 2
    gw.metrics.cluster_forwarded = 7
    for i in range(400):
        gw.registry._live[f"c{i}"] = fake_call(f"c{i}", 1, 2)  # type: ignore[assignment]
    text = render_metrics(gw)
    assert parse_metric(text, "appbridge_calls_live") == 400
    assert parse_metric(text, "appbridge_calls_ended_total") == 7
    assert parse_metric(text, "appbridge_calls_ended_total", {"reason": "app_hangup"}) == 3
    assert parse_metric(text, "appbridge_audio_frames_dropped_total", {"to": "app"}) == 405
    assert parse_metric(text, "appbridge_audio_frames_dropped_total", {"to": "carrier"}) == 800
    assert parse_metric(text, "appbridge_cluster_redis_errors_total") == 2
    assert parse_metric(text, "appbridge_cluster_forwarded_requests_total") == 7
    assert parse_metric(text, "appbridge_draining") == 0
    gw.draining = True
    assert parse_metric(render_metrics(gw), "appbridge_draining") == 1


async def test_lateness_histogram_counts_every_tick(gw: Gateway) -> None:
    hist = gw.media_clock.lateness
    for late_ms in (0.1, 0.7, 4.0, 250.0):
        hist.record(late_ms)
    family = families(render_metrics(gw))["appbridge_media_tick_lateness_ms"]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("appbridge_media_tick_lateness_ms_bucket", "0.5")] == 1
    assert samples[("appbridge_media_tick_lateness_ms_bucket", "5")] == 3
    assert samples[("appbridge_media_tick_lateness_ms_bucket", "+Inf")] == 4
    assert samples[("appbridge_media_tick_lateness_ms_count", None)] == hist.total == 4
    assert samples[("appbridge_media_tick_lateness_ms_sum", None)] == pytest.approx(hist.sum_ms)


async def test_node_info_once_the_configuration_names_the_node(gw: Gateway) -> None:
    assert node_id(gw) is None
    cluster = types.SimpleNamespace(node_id="gw-a")
    gw.config = types.SimpleNamespace(cluster=cluster)  # type: ignore[assignment]
    assert node_id(gw) == "gw-a"
    info = families(render_metrics(gw))["appbridge_node_info"]
    assert info.type == "gauge"
    assert [(s.labels, s.value) for s in info.samples] == [({"node": "gw-a"}, 1.0)]


async def test_the_route_answers_with_the_library_content_type(gw: Gateway) -> None:
    transport = httpx.ASGITransport(app=build_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    assert "appbridge_calls_live" in families(response.text)


async def test_srtp_drops_are_the_process_totals(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DROPS, "auth_failures", 12)
    monkeypatch.setattr(DROPS, "replays", 3)
    text = render_metrics(gw)
    assert parse_metric(text, "appbridge_srtp_packets_dropped_total", {"reason": "auth"}) == 12
    assert parse_metric(text, "appbridge_srtp_packets_dropped_total", {"reason": "replay"}) == 3


async def test_turns_and_the_local_stt_are_read_at_scrape_time(gw: Gateway) -> None:
    gw.metrics.turns.update({"started": 5, "ended": 3, "ended_without_final": 1})
    for i in range(3):
        gw.registry._live[f"c{i}"] = fake_call(f"c{i}", 0, 0, owed=i)  # type: ignore[assignment]
    gw.registry._live["vad-only"] = types.SimpleNamespace(  # type: ignore[assignment]
        call_ref="vad-only", link=None, leg=None, ears=types.SimpleNamespace(stream=None)
    )
    local = gw.stt_providers["local"]
    assert isinstance(local, LocalSttProvider)
    local.stats.partials_dropped = 4
    local.stats.final_delay.observe(0.3)
    local.stats.final_delay.observe(2.0)
    text = render_metrics(gw)
    assert parse_metric(text, "appbridge_turns_total", {"outcome": "started"}) == 5
    assert parse_metric(text, "appbridge_turns_total", {"outcome": "ended_without_final"}) == 1
    assert parse_metric(text, "appbridge_turns_total", {"outcome": "backchannel"}) == 0
    assert parse_metric(text, "appbridge_stt_finals_owed") == 0 + 1 + 2
    assert parse_metric(text, "appbridge_stt_partials_dropped_total") == 4
    delay = families(text)["appbridge_stt_final_delay_seconds"]
    samples = {(s.name, s.labels.get("le")): s.value for s in delay.samples}
    assert samples[("appbridge_stt_final_delay_seconds_bucket", "0.5")] == 1
    assert samples[("appbridge_stt_final_delay_seconds_bucket", "2.5")] == 2
    assert samples[("appbridge_stt_final_delay_seconds_count", None)] == 2
    # The engine is the process's; each scrape reads what it has decoded so far.
    engine = WhisperEngine(workers=2)
    engine.decode_stats["final"].decodes = 6
    engine.decode_stats["final"].audio_s = 12.5
    engine.decode_stats["partial"].busy_s = 0.25
    local._engine = engine
    text = render_metrics(gw)
    assert parse_metric(text, "appbridge_stt_decodes_total", {"kind": "final"}) == 6
    audio = parse_metric(text, "appbridge_stt_decoded_audio_seconds_total", {"kind": "final"})
    assert audio == 12.5
    assert parse_metric(text, "appbridge_stt_decode_seconds_total", {"kind": "partial"}) == 0.25
    assert parse_metric(text, "appbridge_stt_decode_workers") == 2
    assert parse_metric(text, "appbridge_stt_decode_backlog") == 0
