"""The mix and overload in the bench: SIP share, refusals, the [sip] config, RTP ports."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from appbridge.config import load_config
from bench.gateway_proc import GatewaySpec, free_rtp_range, render_config
from bench.load import build_parser
from bench.worker import is_refusal, is_sip_slot


def test_sip_slots_are_spread_evenly_at_the_share() -> None:
    picks = [is_sip_slot(k, 0.5) for k in range(10)]
    assert picks == [False, True] * 5
    assert sum(is_sip_slot(k, 0.3) for k in range(100)) == 30
    assert not any(is_sip_slot(k, 0.0) for k in range(10))
    assert all(is_sip_slot(k, 1.0) for k in range(10))


def test_only_admission_refusals_count_as_refused() -> None:
    assert is_refusal("503 Service Unavailable (Retry-After 5)")
    assert not is_refusal("503 No RTP port available")  # a failure, not admission control
    assert is_refusal("webhook 200 ['Reject']: no stream")
    assert not is_refusal("webhook 500 []: boom")
    assert not is_refusal(None)


def test_config_with_sip_listens_on_loopback_udp(tmp_path: Path) -> None:
    spec = GatewaySpec(
        port=18080,
        rest_base_url="http://127.0.0.1:18081",
        app_urls=("ws://127.0.0.1:18082/session",),
        account_sid="AC" + "be" * 16,
        max_calls=100,
        sip_port=15070,
        rtp_ports=(24000, 24399),
    )
    path = tmp_path / "gateway.toml"
    path.write_text(render_config(spec))
    config = load_config(path, {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"})
    assert config.sip is not None
    assert config.sip.listen == ("udp:127.0.0.1:15070",)
    assert config.sip.rtp_ports == (24000, 24399)
    assert config.server.max_calls == 100
    no_sip = render_config(GatewaySpec(18080, "http://x", ("ws://y",), "AC" + "be" * 16))
    assert "[sip]" not in no_sip


def test_rtp_range_skips_ports_in_use() -> None:
    low, high = free_rtp_range(10, random.Random(1))
    assert (high - low + 1) % 2 == 0 and high - low + 1 >= 200 and low % 2 == 0
    assert low >= 20000 and high < 32768  # below the ephemeral range
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", low))
        again = free_rtp_range(10, random.Random(1))
    assert not again[0] <= low <= again[1]


def test_overload_and_mix_options() -> None:
    args = build_parser().parse_args(["--overload", "100", "--sip-share", "0.5"])
    assert args.overload == 100 and args.sip_share == 0.5
    defaults = build_parser().parse_args([])
    assert defaults.sip_share == 0.5 and defaults.overload is None
    assert defaults.lifetime == (60.0, 120.0)
