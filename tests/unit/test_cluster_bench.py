"""The benchmark's ``--cluster`` (bench/directory_cost.py, docs/PERFORMANCE.md): the gateway's
``[cluster]`` section, and the arithmetic of the directory's cost from ``INFO commandstats``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from appbridge.config import load_config
from bench.directory_cost import ab_lines, commands_delta, directory_figures, directory_lines
from bench.gateway_proc import BENCH_NODE_ID, GatewaySpec, render_config
from bench.options import build_parser


def stats(**calls: int) -> dict[str, Any]:
    """``INFO commandstats`` as redis-py parses it; ``__`` stands for a subcommand's ``|``."""
    return {f"cmdstat_{k.replace('__', '|')}": {"calls": n, "usec": 1} for k, n in calls.items()}


def test_the_gateway_under_cluster_is_a_node_of_its_own_redis(tmp_path: Path) -> None:
    spec = GatewaySpec(
        port=18080,
        rest_base_url="http://127.0.0.1:18081",
        app_urls=("ws://127.0.0.1:18082/session",),
        account_sid="AC" + "be" * 16,
        cluster_redis_url="redis://127.0.0.1:16379/0",
    )
    path = tmp_path / "gateway.toml"
    path.write_text(render_config(spec))
    env = {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s", "BENCH_CLUSTER_SECRET": "c"}
    cluster = load_config(path, env).cluster
    assert cluster is not None
    assert (cluster.node_id, cluster.redis_url) == (BENCH_NODE_ID, "redis://127.0.0.1:16379/0")
    assert cluster.internal_url == "http://127.0.0.1:18080"
    assert cluster.secret == "c"
    assert '"${BENCH_CLUSTER_SECRET}"' in path.read_text()
    # Without --cluster there is no [cluster]: one node, as before.
    plain = GatewaySpec(18080, "http://127.0.0.1:18081", ("ws://127.0.0.1:18082/s",), "AC1")
    assert "[cluster]" not in render_config(plain)


def test_the_option() -> None:
    parser = build_parser()
    assert parser.parse_args([]).cluster is None
    assert parser.parse_args(["--cluster"]).cluster == "on"
    assert parser.parse_args(["--cluster", "ab"]).cluster == "ab"


def test_commands_between_two_answers() -> None:
    before = stats(hset=3, info=1)
    after = stats(hset=10, info=4, sadd=2, expire=0)
    assert commands_delta(before, after) == {"hset": 7, "info": 3, "sadd": 2}


def test_directory_figures_leave_out_the_probe_and_split_off_the_heartbeats() -> None:
    marks = {
        "run_start": (0.0, stats(hello=1, info=1), 1.0),
        # 100 calls opened (HSET + EXPIRE each) and one heartbeat (5 commands).
        "window_start": (10.0, stats(hello=1, info=2, hset=101, expire=103, sadd=1), 1.5),
        # 15 heartbeats in the window: 5 commands each, one SADD each.
        "window_end": (40.0, stats(hello=1, info=3, hset=116, expire=148, sadd=16), 2.1),
        # Ended: one HDEL each, the probe's HLEN and MEMORY USAGE, two more heartbeats.
        "run_end": (
            50.0,
            stats(
                hello=1, info=4, hset=118, expire=154, sadd=18, hdel=100, hlen=3, memory__usage=1
            ),
            2.5,
        ),
    }
    fig = directory_figures(marks, {"hlen": 3}, calls=100, entry_bytes=410.0)
    assert fig["commands_window"] == {"hset": 15, "expire": 45, "sadd": 15}
    assert fig["heartbeats_window"] == 15
    assert fig["commands_per_heartbeat"] == 5.0
    assert fig["commands_per_s_window"] == 2.5
    assert fig["commands_run"] == {"hset": 118, "expire": 154, "sadd": 18, "hdel": 100}
    assert fig["commands_total"] == 390
    assert fig["commands_per_call"] == 3.9
    assert fig["commands_per_call_without_heartbeats"] == 3.0  # (390 - 18 * 5) / 100
    assert fig["directory_bytes_per_call"] == 410.0
    assert fig["redis_cpu_pct_run"] == 3.0
    assert fig["redis_cpu_pct_window"] == 2.0
    lines = directory_lines(fig)
    assert "3.9 per call (3.0 without the 18 heartbeats)" in lines[0]
    assert "5.0 commands per heartbeat" in lines[0]
    assert "expire 154, hdel 100, hset 118, sadd 18" in lines[1]


def test_ab_lines_compare_cpu_per_call_with_the_probe_beside_each() -> None:
    def step(cluster: dict[str, Any] | None, cpu: float, probe: list[float]) -> dict[str, Any]:
        return {
            "offered": 100,
            "cluster": cluster,
            "gateway_cpu_pct_per_call": cpu,
            "core_probe_ms": probe,
        }

    steps = [step(None, 0.40, [20, 21]), step({"x": 1}, 0.42, [22, 22]), step(None, 0.44, [20, 20])]
    (line,) = ab_lines(steps)
    assert line.startswith("cluster A/B at 100 calls")
    assert "without the directory 0.420 [0.400 (probe 20.0/21.0 ms), 0.440" in line
    assert "with the directory 0.420 [0.420 (probe 22.0/22.0 ms)]" in line
