"""``make bench`` with ``--stt local`` (bench/stt_load.py): the speaking callers, the apps'
configuration, and the recogniser's figures read from two ``/metrics`` scrapes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from appbridge.config import load_config
from appbridge.gateway import Gateway
from appbridge.http.metrics import render_metrics
from appbridge.speech.providers.local_stt import LocalSttProvider, WhisperEngine
from bench.gateway_proc import GatewaySpec, render_config
from bench.options import build_parser
from bench.stt_load import GAP_S, drive_speaker, stt_figures, stt_line


class Caller:
    """Records when it was handed each clip, on the test's clock; hangs up after ``talks``."""

    def __init__(self, talks: int) -> None:
        self.now = 0.0
        self.talks = talks
        self.said: list[tuple[float, bytes]] = []
        self.closed = False

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    def talk(self, ulaw: bytes) -> None:
        self.said.append((self.now, ulaw))
        self.closed = len(self.said) >= self.talks


async def test_a_speaking_caller_says_each_sentence_then_pauses() -> None:
    clips = [b"\xff" * 16000, b"\xff" * 24000, b"\xff" * 8000]  # 2 s, 3 s and 1 s
    caller = Caller(talks=5)
    await drive_speaker(caller, clips, seed=3, sleep=caller.sleep)
    times = [t for t, _ in caller.said]
    assert 0.0 <= times[0] <= GAP_S  # a random phase, so calls do not speak in step
    first = clips.index(caller.said[0][1])
    assert [c for _, c in caller.said] == [clips[(first + k) % 3] for k in range(5)]
    for (t0, clip), t1 in zip(caller.said, times[1:], strict=False):
        assert t1 - t0 == pytest.approx(len(clip) / 8000 + GAP_S)  # the sentence, then silence


def test_an_stt_step_has_its_apps_listen_with_the_local_recogniser(tmp_path: Path) -> None:
    spec = GatewaySpec(18080, "http://127.0.0.1:1", ("ws://127.0.0.1:2/",), "AC" + "be" * 16)
    for stt in ("none", "local"):
        path = tmp_path / f"{stt}.toml"
        path.write_text(render_config(dataclasses.replace(spec, stt=stt)))
        config = load_config(path, {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"})
        assert config.apps["bench-0"].speech.stt == stt
    parse = build_parser().parse_args
    assert parse([]).stt == "none" and parse([]).caller is None  # bench.load settles it


async def test_the_recognisers_figures_over_a_window(gw: Gateway) -> None:
    local = gw.stt_providers["local"]
    assert isinstance(local, LocalSttProvider)
    engine = local._engine = WhisperEngine(workers=1)
    local.stats.final_delay.observe(0.2)  # before the window: not counted
    gw.metrics.turns["ended"] = 4
    before = render_metrics(gw)
    for delay_s in (0.2, 0.4, 0.4, 3.0):
        local.stats.final_delay.observe(delay_s)
    gw.metrics.turns.update({"started": 2, "ended": 5, "ended_without_final": 1})
    engine.decode_stats["final"].audio_s = 10.0
    engine.decode_stats["final"].busy_s = 0.5
    engine.decode_stats["final"].decodes = 4
    local.stats.partials_dropped = 3
    figures = stt_figures(before, render_metrics(gw))
    assert figures["finals"] == 4
    assert figures["final_delay_s"] == {"mean": 1.0, "p50_le": 0.5, "p95_le": 5.0, "max_le": 5.0}
    assert figures["turns"]["started"] == 2 and figures["turns"]["ended"] == 1
    assert figures["turns"]["ended_without_final"] == 1
    assert figures["decodes"]["final"]["real_time_factor"] == 0.05
    assert figures["decodes"]["partial"]["real_time_factor"] is None  # none ran
    assert figures["partials_dropped"] == 3 and figures["workers"] == 1
    line = stt_line(figures)
    assert "4 finals" in line and "mean 1.000 s, p50/p95/max ≤0.5/≤5/≤5 s" in line
    assert "without their final 1" in line
