"""The benchmark's own arithmetic (bench/): statistics, /proc and /metrics readers, the timeline
measurements and the gateway configuration it writes. No gateway and no real time here: the
benchmark itself is run by ``make bench``; these tests keep its figures honest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from appbridge.config import load_config
from bench.analysis import CallerFigures, analyse_calls
from bench.gateway_proc import GatewaySpec, loop_env, render_config, worker_number
from bench.lean_app import LeanApp, LeanSession
from bench.lean_twilio import LeanTwilioCall
from bench.measure import (
    BurstOutcome,
    audio_frames_between,
    burst_frames_lost,
    caller_jitter_ms,
    inbound_latencies_ms,
    playing_at,
)
from bench.report import (
    CpuTimes,
    format_table,
    histogram_delta,
    paced_collections,
    paced_collections_line,
    parse_cpu_times,
    parse_histogram,
    parse_metric,
    parse_proc_stat_split,
    parse_proc_stat_ticks,
    parse_vmrss_bytes,
    percentile,
    summarize,
)
from bench.talker import AppScript, Burst, burst_kind
from tests.unit.test_bench_lean import new_call

# ---------------------------------------------------------------------- statistics


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    # On a small sample p99 is the maximum: nearest rank invents no value between observations.
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summary_of_nothing_prints_a_dash() -> None:
    empty = summarize([])
    assert empty.count == 0 and empty.cell() == "-"
    assert summarize([1.0, 2.0, 10.0]).cell() == "2.0/10.0/10.0"


# ---------------------------------------------------------------------- /proc


def test_proc_stat_counts_fields_after_the_last_parenthesis() -> None:
    # A command name with spaces and a ')' of its own must not shift the fields.
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "250", "50", "0", "0"]
    text = "4242 (we ird) name) " + " ".join(fields) + "\n"
    assert parse_proc_stat_ticks(text) == 300
    assert parse_proc_stat_split(text) == (250, 50)  # user, system
    with pytest.raises(ValueError):
        parse_proc_stat_ticks("4242 no parenthesis")


def test_vmrss_is_read_in_kib() -> None:
    status = "Name:\tappbridge\nVmPeak:\t  99999 kB\nVmRSS:\t   51200 kB\nThreads:\t3\n"
    assert parse_vmrss_bytes(status) == 51200 * 1024
    with pytest.raises(ValueError):
        parse_vmrss_bytes("Name:\tzombie\n")


def test_cpu_times_per_core_and_deltas() -> None:
    before = parse_cpu_times(
        "cpu  10 0 10 100 0 0 0 0 0 0\n"
        "cpu0 5 0 5 50 1 0 0 2 0 0\n"
        "cpu1 5 0 5 50 0 1 1 0 0 0\nintr 1 2 3\n"
    )
    after = parse_cpu_times("cpu0 105 0 25 60 1 0 0 7 0 0\ncpu1 5 0 5 150 0 1 1 0 0 0\n")
    assert set(before) == {0, 1}
    assert before[1] == CpuTimes(busy=12, idle=50, steal=0)
    assert after[0].minus(before[0]) == CpuTimes(busy=120, idle=10, steal=5)


# ---------------------------------------------------------------------- /metrics

EXPOSITION = """\
# HELP appbridge_calls_ended_total Calls ended, by session.end reason.
# TYPE appbridge_calls_ended_total counter
appbridge_calls_ended_total{reason="app_hangup"} 3
appbridge_calls_ended_total{reason="caller_hangup"} 4
# TYPE appbridge_media_tick_lateness_ms histogram
appbridge_media_tick_lateness_ms_bucket{le="0.5"} %d
appbridge_media_tick_lateness_ms_bucket{le="1"} %d
appbridge_media_tick_lateness_ms_bucket{le="5"} %d
appbridge_media_tick_lateness_ms_bucket{le="+Inf"} %d
appbridge_media_tick_lateness_ms_sum %g
appbridge_media_tick_lateness_ms_count %d
"""


def test_counters_sum_over_labels_or_pick_one() -> None:
    text = EXPOSITION % (0, 0, 0, 0, 0, 0)
    assert parse_metric(text, "appbridge_calls_ended_total") == 7
    assert parse_metric(text, "appbridge_calls_ended_total", {"reason": "app_hangup"}) == 3
    assert parse_metric(text, "appbridge_nothing_total") == 0


def test_paced_collections_over_a_window() -> None:
    def exposition(passes: int, early: int, seconds: float, longest: float) -> str:
        return (
            f"appbridge_gc_full_passes_total {passes}\n"
            f"appbridge_gc_early_passes_total {early}\n"
            "appbridge_gc_deep_passes_total 1\n"
            f"appbridge_gc_full_pass_seconds_total {seconds}\n"
            f"appbridge_gc_full_pass_max_seconds {longest}\n"
        )

    figures = paced_collections(exposition(4, 1, 0.02, 0.011), exposition(9, 3, 0.035, 0.012))
    assert figures == {
        "passes": 5,
        "early_passes": 2,
        "deep_passes": 0,
        "seconds": 0.015,
        "max_seconds": 0.012,
    }
    assert paced_collections_line(figures) == (
        "paced collections: 5 passes (2 early, 0 deep), 15.0 ms in all; "
        "the longest since the gateway started 12.0 ms"
    )


def test_lateness_quantiles_are_bucket_bounds_of_the_window() -> None:
    before = parse_histogram(
        EXPOSITION % (100, 100, 100, 100, 10.0, 100), "appbridge_media_tick_lateness_ms"
    )
    # In the window: 50 ticks ≤0.5 ms, 45 more ≤1 ms, 4 more ≤5 ms, 1 beyond 5 ms.
    after = parse_histogram(
        EXPOSITION % (150, 195, 199, 200, 90.0, 200), "appbridge_media_tick_lateness_ms"
    )
    window = histogram_delta(before, after)
    assert window.count == 100 and window.cumulative == (50, 95, 99, 100)
    assert window.quantile_bound(0.50) == 0.5
    assert window.quantile_bound(0.99) == 5.0
    assert window.max_bound() == math.inf
    assert window.mean() == pytest.approx(0.8)
    with pytest.raises(ValueError):
        histogram_delta(after, before)  # counters never go down within one process


def test_format_table_aligns_columns() -> None:
    table = format_table(("a", "long header"), [("1", "2"), ("333", "4")])
    lines = table.splitlines()
    assert lines[0] == "  a  long header"
    assert lines[2] == "  1            2"
    assert lines[3] == "333            4"
    with pytest.raises(ValueError):
        format_table(("a",), [("1", "2")])


# ---------------------------------------------------------------------- timelines


def test_caller_jitter_skips_the_lead_and_splits_runs() -> None:
    lead = [0.0, 0.0005, 0.001]  # three frames at once: the pacer's lead
    steady = [0.020, 0.040, 0.065, 0.080]  # one 25 ms gap then a 15 ms one
    next_burst = [5.0, 5.0, 5.0, 5.020]
    jitter = caller_jitter_ms(lead + steady + next_burst)
    assert jitter == pytest.approx([1.0, 0.0, 5.0, 5.0, 0.0])


def test_inbound_latency_pairs_frames_in_order() -> None:
    sent = [0.00, 0.02, 0.04, 0.06]
    received = [0.001, 0.0215, 0.043, 0.061]
    assert inbound_latencies_ms(sent, received) == pytest.approx([1.0, 1.5, 3.0, 1.0])
    assert inbound_latencies_ms(sent, received, window=(0.01, 0.05)) == pytest.approx([1.5, 3.0])


def test_inbound_latency_refuses_a_broken_pairing() -> None:
    sent = [i * 0.02 for i in range(100)]
    # Frame 10 never arrived: every later pair would read one frame (20 ms) too slow.
    received = [t + 0.001 for i, t in enumerate(sent) if i not in (10, 99)]
    assert inbound_latencies_ms(sent, received) is None
    assert inbound_latencies_ms([0.0], [0.0, 0.1]) is None
    assert inbound_latencies_ms([0.0, 0.02], [0.01, 0.001]) is None  # arrived before it was sent
    # Only the last frame missing: held back by reframing at the end of the call; still paired.
    tail_held = inbound_latencies_ms(sent, [t + 0.001 for t in sent[:-1]])
    assert tail_held is not None and len(tail_held) == 99


def test_frames_between_round_up_padded_frames() -> None:
    media = [(1.0, 160), (1.02, 160), (1.04, 80), (9.0, 160)]
    assert audio_frames_between(media, 1.0, 2.0) == 3
    assert audio_frames_between(media, 0.0, 1.0) == 0
    outcomes = [BurstOutcome(100, 98), BurstOutcome(50, 51)]
    assert burst_frames_lost(outcomes) == (150, 2, 1)


def test_playing_at_reads_the_tick_covering_the_instant() -> None:
    heard = [(1.00, b"", 160), (1.02, b"", 80), (1.04, b"", 0)]
    assert playing_at(heard, 1.01)
    assert playing_at(heard, 1.025)  # 80 bytes = the first 10 ms of that tick
    assert not playing_at(heard, 1.035)
    assert not playing_at(heard, 1.05)
    assert not playing_at(heard, 0.5)


def test_burst_cycle_clears_each_kind_half_of_the_time() -> None:
    cycle = [burst_kind(i) for i in range(8)]
    assert cycle[:4] == [("speak", False), ("audio", True), ("audio", False), ("speak", True)]
    assert cycle[4:] == cycle[:4]


def _call_with(
    received: list[float], sent: list[float], heard: list[tuple[float, int]]
) -> LeanTwilioCall:
    """A Twilio caller's recording: 160-byte ``media`` arrivals, its own sends, its playout
    (built inside a running loop, as the caller's futures need one)."""
    call = new_call()
    for t in received:
        call.recv_times.append(t)
        call.recv_bytes.append(160)
    call.sent_times.extend(sent)
    for t, n in heard:
        call.heard_times.append(t)
        call.heard_bytes.append(n)
    return call


def _one_call_over_the_window(arrivals: list[float]) -> CallerFigures:
    """One call's figures over 9-20 s: burst b0 sent at 9.99 s (its frames arriving at
    ``arrivals``), b1 at 13.70 s and cleared at 14.0 s."""
    caller_sent = [5.0 + 0.02 * k for k in range(1000)]
    # Playout: audio from 10.0 s, cut 14.0 s + 5 ms by a clear (40 bytes of that tick played).
    heard = [(10.0 + 0.02 * k, 160) for k in range(200)] + [(14.0, 40), (14.02, 0)]
    call = _call_with(arrivals, caller_sent, heard)
    call.clear_times = [14.004]
    session = LeanSession(LeanApp(secret=None))
    session.messages = [
        {"type": "mark", "name": "b0", "cleared": False},
        {"type": "mark", "name": "b1", "cleared": True},
    ]
    session.message_times = [12.1, 14.01]
    for k in range(1000):
        session.audio_times.append(5.0 + 0.02 * k + 0.003)
        session.audio_tracks.append(1)
        session.audio_loud.append(0)
    script = AppScript("CA1", session, 5.0)
    script.bursts = [
        Burst(0, "audio", 9.99, "b0", None, 2000),
        Burst(1, "audio", 13.70, "b1", None, 2000, clear_at=14.0),
    ]
    return analyse_calls([(call, script)], (9.0, 20.0))


async def test_analysis_of_one_call_over_the_window() -> None:
    # Gateway audio arrives at the caller 10.0-12.0 s (a burst of 100 frames, lead first).
    figures = _one_call_over_the_window(
        [10.0, 10.0, 10.0] + [10.0 + 0.02 * k for k in range(1, 98)]
    )
    assert figures.bursts_measured == 2
    assert figures.frames_expected == 100 and figures.frames_lost == 0
    assert figures.expected_by_kind == {"audio": 100} and figures.bursts_silent == 0
    assert (figures.clears_sent, figures.clears_at_caller) == (1, 1)
    assert figures.marks_missing == 0
    assert figures.clear_to_silence_ms == pytest.approx([5.0])
    assert figures.jitter_ms and max(figures.jitter_ms) < 1e-6
    assert figures.inbound_latency_ms and all(
        v == pytest.approx(3.0) for v in figures.inbound_latency_ms
    )
    assert figures.inbound_unpaired_calls == 0
    assert figures.lost_bursts == []


async def test_a_burst_that_lost_frames_is_described() -> None:
    # Frames 50-52 of the burst never arrive: a 80 ms gap after the one at 11.0 s.
    arrivals = [10.0, 10.0, 10.0] + [10.0 + 0.02 * k for k in range(1, 98) if not 50 < k < 54]
    figures = _one_call_over_the_window(arrivals)
    assert figures.frames_lost == 3
    (lost,) = figures.lost_bursts
    assert lost["burst"] == 0 and lost["kind"] == "audio" and lost["carrier"] == "twilio"
    assert (lost["expected"], lost["received"], lost["messages"]) == (100, 97, 97)
    assert lost["sent_at_s"] == pytest.approx(0.99) and lost["after_cleared"] is False
    assert lost["first_ms"] == pytest.approx(10.0) and lost["last_ms"] == pytest.approx(1950.0)
    assert lost["gaps_ms"] == [[pytest.approx(1010.0), pytest.approx(80.0)]]
    assert lost["odd_messages"] == [] and lost["just_before_ms"] == []
    # It travels from a worker as it is (its numbers are not rounded like the samples).
    assert CallerFigures.from_wire(figures.to_wire()).lost_bursts == figures.lost_bursts


async def test_a_frame_stamped_a_hair_before_its_burst_counts_for_it() -> None:
    # The burst is stamped as sent at 9.99 s; its first frame is dated 1 ms before that (the
    # stamps' clock error, within STAMP_SLACK_S): it is the burst's, and nothing is lost.
    arrivals = [9.989, 10.0, 10.0] + [10.0 + 0.02 * k for k in range(1, 98)]
    figures = _one_call_over_the_window(arrivals)
    assert figures.frames_lost == 0 and figures.lost_bursts == []


async def test_a_frame_stamped_well_before_its_burst_is_listed_as_just_before() -> None:
    # 5 ms before the send is beyond the slack: the burst lacks that frame, and the description
    # shows where it went.
    arrivals = [9.985, 10.0, 10.0] + [10.0 + 0.02 * k for k in range(1, 98)]
    figures = _one_call_over_the_window(arrivals)
    assert figures.frames_lost == 1
    (lost,) = figures.lost_bursts
    assert lost["just_before_ms"] == [pytest.approx(-5.0)]
    assert lost["messages"] == 99 and lost["first_ms"] == pytest.approx(10.0)


def test_figures_travel_and_merge() -> None:
    a = CallerFigures(jitter_ms=[1.23456], frames_lost=2, gateway_errors={"queue_full": 1})
    b = CallerFigures.from_wire(CallerFigures(jitter_ms=[2.0], frames_lost=3).to_wire())
    b.gateway_errors["queue_full"] = 2
    a.merge(b)
    assert a.jitter_ms == [1.23456, 2.0]
    assert a.frames_lost == 5 and a.gateway_errors == {"queue_full": 3}
    assert CallerFigures(jitter_ms=[1.23456]).to_wire()["jitter_ms"] == [1.235]


# ---------------------------------------------------------------------- the gateway it runs


def test_generated_config_is_valid_for_the_gateway(tmp_path: Path) -> None:
    spec = GatewaySpec(
        port=18080,
        rest_base_url="http://127.0.0.1:18081",
        app_urls=("ws://127.0.0.1:18082/session", "ws://127.0.0.1:18083/session"),
        account_sid="AC" + "be" * 16,
    )
    path = tmp_path / "gateway.toml"
    path.write_text(render_config(spec))
    env = {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"}
    config = load_config(path, env)
    assert config.server.port == 18080
    assert config.route(worker_number(1)).ref == "bench-1"  # type: ignore[union-attr]
    assert config.route("+15550009999").ref == "bench-0"  # type: ignore[union-attr]
    # Secrets stay in the environment, as an operator would write them.
    assert '"${BENCH_TWILIO_TOKEN}"' in path.read_text()
    assert config.twilio is not None and config.twilio.auth_token == "t"


def test_asyncio_loop_hides_uvloop_from_the_child_only(tmp_path: Path) -> None:
    env = {"PYTHONPATH": "/elsewhere", "KEEP": "1"}
    assert loop_env("uvloop", tmp_path, env) == env
    child = loop_env("asyncio", tmp_path, env)
    shim = tmp_path / "no-uvloop"
    assert child["PYTHONPATH"].split(":") == [str(shim), "/elsewhere"]
    assert "raise ImportError" in (shim / "uvloop.py").read_text()
    assert env["PYTHONPATH"] == "/elsewhere"
    with pytest.raises(ValueError):
        loop_env("trio", tmp_path, env)


# ---------------------------------------------------------------------- soak
def test_least_squares_slope_recovers_a_line_and_refuses_a_point() -> None:
    from bench.soak import least_squares_slope

    line = [(t, 3.0 + 0.5 * t) for t in (0.0, 10.0, 20.0, 30.0)]
    assert least_squares_slope(line) == pytest.approx(0.5)
    # Noise mirrored about the middle instant leaves the slope at zero ...
    mirrored = [(0.0, 1.0), (1.0, 3.0), (2.0, 2.0), (3.0, 3.0), (4.0, 1.0)]
    assert least_squares_slope(mirrored) == pytest.approx(0.0)
    # ... and by hand: cov(t, v) = 2, var(t) = 10.
    hand = [(0.0, 1.0), (1.0, 3.0), (2.0, 1.0), (3.0, 3.0), (4.0, 2.0)]
    assert least_squares_slope(hand) == pytest.approx(0.2)
    assert least_squares_slope([(5.0, 1.0)]) is None
    assert least_squares_slope([(5.0, 1.0), (5.0, 2.0)]) is None  # no spread in time


def test_memory_is_flat_below_one_percent_per_ten_minutes_after_warm_up() -> None:
    from bench.soak import assess

    # Warm-up growth (first minute) is ignored; then 0.05 MB/min on 100 MB = 0.5 % per 10 min.
    warm = [(float(t), 80.0 + t / 3.0) for t in range(0, 60, 10)]
    steady = [(float(t), 100.0 + 0.05 * (t - 60) / 60.0) for t in range(60, 610, 10)]
    trend = assess("rss_mb", "memory", warm + steady)
    assert trend.flat is True
    assert trend.start == 80.0 and trend.end == pytest.approx(100.45)
    assert trend.slope_per_min == pytest.approx(0.05)
    assert trend.allowed_10min == pytest.approx(1.0)
    # 0.2 MB/min is 2 % per 10 min: a leak.
    leaking = [(float(t), 100.0 + 0.2 * t / 60.0) for t in range(0, 610, 10)]
    grown = assess("rss_mb", "memory", leaking)
    assert grown.flat is False
    assert grown.growth_10min == pytest.approx(2.0)


def test_the_last_third_slope_shows_a_rise_that_levelled_off() -> None:
    from bench.soak import assess

    # Memory that rises until 420 s (a bounded history filling) and is flat after it: the
    # whole-run fit still says growing, the last third's slope says it stopped.
    filling = [(float(t), 70.0 + 0.1 * min(t, 420) / 60.0) for t in range(0, 610, 10)]
    trend = assess("rss_mb", "memory", filling)
    assert trend.flat is False and trend.slope_per_min is not None and trend.slope_per_min > 0.05
    assert trend.last_third_slope_per_min == pytest.approx(0.0, abs=1e-9)
    steady = assess("rss_mb", "memory", [(float(t), 70.0 + t / 60.0) for t in range(0, 610, 10)])
    assert steady.last_third_slope_per_min == pytest.approx(1.0)


def test_a_longer_warm_up_judges_only_what_follows_it() -> None:
    from bench.load import build_parser
    from bench.soak import WARMUP_S, assess

    assert build_parser().parse_args(["--soak", "600"]).warmup == WARMUP_S
    assert build_parser().parse_args(["--soak", "1200", "--warmup", "600"]).warmup == 600.0
    # An allocator that grows for ten minutes and then holds: growing by the default warm-up,
    # flat over the ten minutes after a ten-minute one.
    series = [(float(t), 70.0 + 0.2 * min(t, 600) / 60.0) for t in range(0, 1210, 10)]
    assert assess("rss_mb", "memory", series).flat is False
    after = assess("rss_mb", "memory", series, warmup_s=600.0)
    assert after.flat is True and after.slope_per_min == pytest.approx(0.0, abs=1e-9)
    assert (after.start, after.end) == (70.0, 72.0)


def test_counts_are_flat_when_they_stay_in_their_range_despite_churn() -> None:
    from bench.soak import assess

    # fds wobble between 250 and 256 as calls are replaced: flat.
    wobble = [(float(t), 250.0 + (t // 10) % 7) for t in range(0, 610, 10)]
    assert assess("fds", "count", wobble).flat is True
    # One task leaked per call ended (80 a minute) is far outside the range.
    leak = [(float(t), 360.0 + 80.0 * t / 60.0) for t in range(0, 610, 10)]
    trend = assess("asyncio_tasks", "count", leak)
    assert trend.flat is False
    assert trend.slope_per_min == pytest.approx(80.0)
    # One sample catching a burst of set-ups is a transient, not growth.
    spike = [(float(t), 300.0 + (50.0 if t == 550 else 0.0)) for t in range(0, 610, 10)]
    assert assess("asyncio_tasks", "count", spike).flat is True
    # A slow creep that ends above the first third's range is growth too.
    creep = [(float(t), 100.0 + (10.0 if t > 400 else 0.0)) for t in range(0, 610, 10)]
    assert assess("threads", "count", creep).flat is False


def test_too_short_a_soak_gives_no_verdict() -> None:
    from bench.soak import assess

    trend = assess("fds", "count", [(0.0, 35.0), (10.0, 35.0), (20.0, 36.0)])
    assert trend.flat is None and trend.slope_per_min is None
    assert (trend.start, trend.end, trend.low, trend.high) == (35.0, 36.0, 35.0, 36.0)
    with pytest.raises(ValueError):
        assess("fds", "count", [])
