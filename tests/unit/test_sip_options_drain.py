"""SIGTERM marks the gateway draining in the signal handler itself, so the very next OPTIONS probe
is answered 503 and a second SIGTERM stops at once (docs/operations.md, "Signals"; docs/sip.md,
"OPTIONS")."""

from __future__ import annotations

from appbridge.carriers.sip.inbound import SipInbound
from appbridge.clock import VirtualClock
from appbridge.config import parse_config
from appbridge.gateway import Gateway
from appbridge.server import _Signals
from tests.unit.test_sip_options import PEER, SIP, Answers, options


def gateway() -> Gateway:
    config = parse_config(
        {
            "server": {"max_calls": 5, "drain_timeout_s": 3},
            "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x"}],
            "numbers": [{"number": "*", "app": "a"}],
        },
        {},
    )
    return Gateway(config, clock=VirtualClock())


async def test_first_sigterm_turns_options_503_at_once() -> None:
    gw = gateway()
    answers = Answers()
    sip = SipInbound(gw, answers, SIP)  # type: ignore[arg-type]
    signals = _Signals(gw, None)
    sip.on_message(options(), PEER, 0.0)
    assert answers.last()[0] == 200
    signals.on_term()
    assert gw.draining  # before the main task has run again
    assert gw.admission_refusal() == "draining"
    sip.on_message(options(), PEER, 0.0)
    assert answers.last()[0] == 503
    assert gw.registry.total_rejected == 0  # a probe is no refused call (the metric stays)
    sip.on_message(options(to_tag="live", call_id="live-call"), PEER, 0.0)
    assert answers.last()[0] == 200  # a live call's keepalive
    assert signals.drain_requested.is_set() and not signals.stop_now.is_set()
    signals.on_term()  # the second one stops at once
    assert signals.stop_now.is_set()
    await gw.http.aclose()


async def test_sigint_stops_without_a_drain() -> None:
    gw = gateway()
    signals = _Signals(gw, None)
    signals.on_int()
    assert signals.stop_now.is_set()
    assert not signals.drain_requested.is_set()
    await gw.http.aclose()
