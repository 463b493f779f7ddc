"""OPTIONS answers of the SIP carrier (docs/sip.md, "OPTIONS"): 200 while new calls are taken,
503 with Retry-After (RFC 3261 §21.5.4) while admission refuses them, and 200 in a dialog.

The gateway is a stand-in whose admission runs the real rule (``appbridge.admission.refusal``)
over a CPU meter fed virtual-time samples; the transport records what is answered.
"""

from __future__ import annotations

from typing import Any

from appbridge.admission import CpuLoad, refusal
from appbridge.carriers.sip.inbound import RETRY_AFTER_S, SipInbound
from appbridge.carriers.sip.message import Request, parse_message
from appbridge.carriers.sip.transport import Peer
from appbridge.carriers.sip.uac import ALLOW
from appbridge.config import SipConfig

PEER: Peer = ("udp", "127.0.0.1", 5070)
SIP = SipConfig(
    listen=("udp:127.0.0.1:5060",), rtp_ports=(30000, 30099), public_address=None, trunks=()
)


class AdmissionGateway:
    """What ``SipInbound`` asks of the gateway for OPTIONS: its admission."""

    def __init__(self, max_calls: int = 2, max_cpu_percent: float | None = None) -> None:
        self.draining = False
        self.live_calls = 0
        self.max_calls = max_calls
        self.max_cpu_percent = max_cpu_percent
        self.cpu = CpuLoad(window_s=5.0)

    def admission_refusal(self) -> str | None:
        return refusal(
            draining=self.draining,
            live_calls=self.live_calls,
            max_calls=self.max_calls,
            cpu_percent=self.cpu.percent(),
            max_cpu_percent=self.max_cpu_percent,
        )


class Answers:
    """What ``SipInbound`` uses of ``SipTransport`` to answer; answers are recorded."""

    local_host = "127.0.0.1"

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str]]] = []

    def respond(self, request: Request, peer: Peer, status: int, *args: Any, **kw: Any) -> None:
        self.answers.append((status, dict(kw.get("headers") or [])))

    def last(self) -> tuple[int, dict[str, str]]:
        return self.answers[-1]


def options(to_tag: str | None = None, call_id: str = "probe-1") -> Request:
    tag = f";tag={to_tag}" if to_tag else ""
    raw = (
        "OPTIONS sip:127.0.0.1:5060 SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-opt1;rport\r\n"
        "From: <sip:dispatcher@127.0.0.1>;tag=d1\r\n"
        f"To: <sip:127.0.0.1:5060>{tag}\r\n"
        f"Call-ID: {call_id}\r\n"
        "CSeq: 10 OPTIONS\r\n"
        "Max-Forwards: 70\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    message = parse_message(raw)
    assert isinstance(message, Request)
    return message


def inbound(gw: AdmissionGateway) -> tuple[SipInbound, Answers]:
    answers = Answers()
    return SipInbound(gw, answers, SIP), answers  # type: ignore[arg-type]


def test_options_answers_200_with_allow_while_calls_are_taken() -> None:
    sip, answers = inbound(AdmissionGateway())
    sip.on_message(options(), PEER, 0.0)
    status, headers = answers.last()
    assert status == 200
    assert headers["Allow"] == ALLOW
    assert "Retry-After" not in headers


def test_options_answers_503_with_retry_after_while_draining() -> None:
    gw = AdmissionGateway()
    sip, answers = inbound(gw)
    gw.draining = True
    sip.on_message(options(), PEER, 0.0)
    status, headers = answers.last()
    assert status == 503
    assert headers["Retry-After"] == RETRY_AFTER_S
    assert int(headers["Retry-After"]) > 0
    assert headers["Allow"] == ALLOW
    assert sip.rejected == {}  # a probe is not a refused call


def test_options_follow_the_call_cap_both_ways() -> None:
    gw = AdmissionGateway(max_calls=2)
    sip, answers = inbound(gw)
    gw.live_calls = 1
    sip.on_message(options(), PEER, 0.0)
    assert answers.last()[0] == 200
    gw.live_calls = 2  # at max_calls
    sip.on_message(options(), PEER, 1.0)
    assert answers.last()[0] == 503
    gw.live_calls = 1  # a call ended: the node takes calls again
    sip.on_message(options(), PEER, 2.0)
    assert answers.last()[0] == 200


def test_options_follow_the_cpu_limit() -> None:
    gw = AdmissionGateway(max_cpu_percent=80.0)
    sip, answers = inbound(gw)
    for second in range(6):  # a quarter of a core
        gw.cpu.sample(float(second), 0.25 * second)
    sip.on_message(options(), PEER, 6.0)
    assert answers.last()[0] == 200
    for second in range(6, 13):  # a whole core: over the limit
        gw.cpu.sample(float(second), 1.25 + 1.0 * (second - 5))
    sip.on_message(options(), PEER, 13.0)
    assert answers.last()[0] == 503


def test_in_dialog_options_keeps_answering_200_while_draining() -> None:
    gw = AdmissionGateway(max_calls=1)
    sip, answers = inbound(gw)
    gw.draining = True
    gw.live_calls = 1
    sip.on_message(options(to_tag="gw-tag", call_id="live-call"), PEER, 0.0)
    status, headers = answers.last()
    assert status == 200
    assert headers["Allow"] == ALLOW
    sip.on_message(options(), PEER, 0.0)  # the dispatcher's probe, same moment
    assert answers.last()[0] == 503
