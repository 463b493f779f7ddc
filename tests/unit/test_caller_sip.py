"""Unit tests of the SIP test caller's UAC logic (``appbridge.caller.sip``), with a scripted far
end: the signalling link is replaced by a recorder, so each SIP message is built and checked by
hand (RFC 3261 §13.2 INVITE/ACK, §9.1 CANCEL, §15 BYE). Media ticks are driven by a
:class:`VirtualClock`; RTP goes to a loopback socket standing in for the far end.
"""

from __future__ import annotations

import asyncio
import socket
from argparse import Namespace
from pathlib import Path

import pytest

from appbridge.caller import CallerUsageError
from appbridge.caller.cli import run_sip_call_command
from appbridge.caller.sip import (
    SipCallFailed,
    SipCallPlan,
    SipTestCaller,
    parse_sip_target,
)
from appbridge.carriers.sip.dtmf4733 import TelephoneEvent
from appbridge.carriers.sip.message import Headers, Request, Response, make_response
from appbridge.carriers.sip.offer_answer import SdpNegotiator
from appbridge.carriers.sip.rtp import RtpPacket
from appbridge.carriers.sip.sdp import SessionDescription
from appbridge.clock import VirtualClock
from appbridge.testing.audio import rms_pcm16, tone_pcm16, ulaw_encode

FAR_TAG = "far123"


class RecordingLink:
    """Stands in for the caller's signalling link: records what the caller sends."""

    def __init__(self) -> None:
        self.local = ("127.0.0.1", 5099)
        self.sent: list[Request] = []
        self.responses: list[Response] = []
        self.closed = False
        self.sent_one = asyncio.Event()

    async def open(self) -> None:
        return None

    def send_request(self, request: Request) -> None:
        self.sent.append(request)
        self.sent_one.set()

    def respond(
        self,
        request: Request,
        status: int,
        *,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> None:
        self.responses.append(make_response(request, status, headers=headers or [], body=body))

    def close(self) -> None:
        self.closed = True


class ScriptedCaller(SipTestCaller):
    def __init__(self, uri: str, **kw: object) -> None:
        super().__init__(uri, **kw)  # type: ignore[arg-type]
        self.link = RecordingLink()
        self.run_media_clock = False

    def _make_link(self) -> RecordingLink:  # type: ignore[override]
        return self.link


def far_rtp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2.0)
    return sock


def answer_for(invite: Request, rtp_port: int, status: int = 200) -> Response:
    far = SdpNegotiator(local_address="127.0.0.1", rtp_port=rtp_port, codecs=("PCMU",))
    answer, _ = far.create_answer(SessionDescription.parse(invite.body))
    return make_response(
        invite,
        status,
        to_tag=FAR_TAG,
        headers=[("Contact", "<sip:gw@127.0.0.1:5060>")],
        body=answer.serialize(),
        content_type="application/sdp",
    )


def in_dialog_request(method: str, invite: Request, seq: int = 500) -> Request:
    """A request from the far end inside the call's dialog (From/To swapped, §12.2.1.1)."""
    headers = Headers(
        [
            ("Via", "SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKfar" + method.lower()),
            ("Max-Forwards", "70"),
            ("From", f"{invite.headers.get('To')};tag={FAR_TAG}"),
            ("To", invite.headers.get("From") or ""),
            ("Call-ID", invite.call_id),
            ("CSeq", f"{seq} {method}"),
            ("Contact", "<sip:gw@127.0.0.1:5060>"),
        ]
    )
    return Request(method, invite.contacts[0].uri, headers)


async def started(caller: ScriptedCaller) -> tuple[asyncio.Task[int], Request]:
    task = asyncio.create_task(caller.call(timeout_s=5))
    await asyncio.wait_for(caller.link.sent_one.wait(), 5)
    return task, caller.link.sent[0]


def test_targets_and_usage() -> None:
    t = parse_sip_target("sip:+15550002222@127.0.0.1:5070;transport=TCP")
    assert (t.host, t.port, t.transport, t.uri.user) == ("127.0.0.1", 5070, "tcp", "+15550002222")
    t = parse_sip_target("sip:demo@localhost")
    assert (t.host, t.port, t.transport) == ("localhost", 5060, "udp")
    for bad in ("sips:a@127.0.0.1", "sip:a@127.0.0.1;transport=sctp", "http://x", "sip:"):
        with pytest.raises(ValueError):
            parse_sip_target(bad)
    with pytest.raises(CallerUsageError, match="--digits"):
        SipCallPlan(uri="sip:a@127.0.0.1", digits="1x").validate()
    with pytest.raises(CallerUsageError, match="--duration"):
        SipCallPlan(uri="sip:a@127.0.0.1", duration_s=0).validate()
    with pytest.raises(CallerUsageError, match="--record"):
        SipCallPlan(uri="sip:a@127.0.0.1", record=Path("/nonexistent/dir/x.wav")).validate()
    with pytest.raises(ValueError, match="codecs"):
        SipTestCaller("sip:a@127.0.0.1", codecs=("OPUS",))


def test_the_command_exits_2_on_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def args(**kw: object) -> Namespace:
        base: dict[str, object] = {
            "url": "sip:+15550002222@127.0.0.1:9",
            "from_": "+15550001111",
            "play": None,
            "digits": None,
            "seconds": 5.0,
            "record": None,
        }
        return Namespace(**{**base, **kw})

    assert run_sip_call_command(args(digits="9z")) == 2
    assert "--digits" in capsys.readouterr().err
    not_wav = tmp_path / "x.wav"
    not_wav.write_bytes(b"hello")
    assert run_sip_call_command(args(play=str(not_wav))) == 2
    assert "not a RIFF/WAVE file" in capsys.readouterr().err


async def test_invite_offer_answer_ack_media_and_remote_bye() -> None:
    clock = VirtualClock()
    far = far_rtp_socket()
    caller = ScriptedCaller("sip:+15550002222@127.0.0.1:5060", clock=clock)
    try:
        task, invite = await started(caller)
        assert invite.method == "INVITE" and str(invite.uri) == "sip:+15550002222@127.0.0.1:5060"
        assert invite.from_.uri.user == "+15550001111" and invite.from_.tag
        assert invite.to.tag is None and invite.contacts[0].uri.host == "127.0.0.1"
        assert (invite.headers.get("Via") or "").startswith("SIP/2.0/UDP 127.0.0.1:5099;")
        offer = SessionDescription.parse(invite.body)
        assert offer.media[0].formats == ["0", "8", "101"]  # PCMU, PCMA, telephone-event
        caller.on_message(make_response(invite, 100))
        caller.on_message(make_response(invite, 180, to_tag=FAR_TAG))
        ok = answer_for(invite, far.getsockname()[1])
        caller.on_message(ok)
        assert await task == 200
        assert caller.answered and [e.status for e in caller.history[1:3]] == [100, 180]
        ack = caller.link.sent[-1]
        assert ack.method == "ACK" and ack.cseq.seq == 1 and ack.to.tag == FAR_TAG
        caller.on_message(ok)  # a retransmitted 200 gets the same ACK again (§13.2.2.4)
        assert caller.link.sent[-1] is ack
        # Media: queued audio goes out 20 ms per tick as PCMU; silence when nothing is queued.
        tone = tone_pcm16(1000, 40, 8000, amplitude=8000)
        await caller.send_audio(tone, wait=False)
        for _ in range(3):
            caller.tick(clock.now())
            clock.advance(0.020)
        packets = [RtpPacket.parse(far.recv(2048)) for _ in range(3)]
        assert [p.payload_type for p in packets] == [0, 0, 0]
        assert packets[0].payload == ulaw_encode(tone[:320])
        assert packets[2].payload == b"\xff" * 160
        assert [p.timestamp - packets[0].timestamp for p in packets] == [0, 160, 320]
        # A keypress: RFC 4733 packets on the negotiated event payload type.
        await caller.send_digits("5", wait=False)
        caller.tick(clock.now())
        event = RtpPacket.parse(far.recv(2048))
        assert event.payload_type == 101 and event.marker
        assert TelephoneEvent.parse_all(event.payload)[0].event == 5
        # The far end's audio and keypresses are heard.
        assert caller._rtp is not None and caller._rtp.transport is not None
        port = caller._rtp.transport.get_extra_info("sockname")[1]
        for i in range(5):
            payload = ulaw_encode(tone[:320])
            packet = RtpPacket(
                payload_type=0, sequence=7 + i, timestamp=160 * i, ssrc=42, payload=payload
            )
            far.sendto(packet.serialize(), ("127.0.0.1", port))
        await asyncio.sleep(0.05)  # loopback delivery to the caller's RTP socket
        for _ in range(15):
            clock.advance(0.020)
            caller.tick(clock.now())
        assert len(caller.heard()) >= 5 * 320
        assert rms_pcm16(caller.heard()) > 1000  # the tone, not silence
        # BYE from the far end: answered 200, the call ends as a remote hangup.
        bye = in_dialog_request("BYE", invite)
        caller.on_message(bye)
        assert caller.link.responses[-1].status == 200
        assert caller.ended and caller.hung_up_by == "remote"
        assert [e.kind for e in caller.history][-2:] == ["remote_hangup", "ended"]
        await caller.hangup()  # nothing left to do: no BYE of ours
        assert [r.method for r in caller.link.sent].count("BYE") == 0
    finally:
        await caller.close()
        far.close()


async def test_failures_cancel_and_our_bye() -> None:
    # Busy: 486 fails the call with its status.
    caller = ScriptedCaller("sip:busy@127.0.0.1")
    task, invite = await started(caller)
    caller.on_message(make_response(invite, 486, to_tag=FAR_TAG))
    with pytest.raises(SipCallFailed) as failed:
        await task
    assert (failed.value.status, failed.value.reason) == (486, "Busy Here")
    assert caller.ended
    await caller.close()
    # Hanging up before any provisional response: the CANCEL waits for one (§9.1).
    caller = ScriptedCaller("sip:slow@127.0.0.1")
    task, invite = await started(caller)
    await caller.hangup()
    assert [r.method for r in caller.link.sent] == ["INVITE"]
    caller.on_message(make_response(invite, 180, to_tag=FAR_TAG))
    cancel = caller.link.sent[-1]
    assert cancel.method == "CANCEL" and cancel.cseq.seq == 1
    assert cancel.headers.get("Via") == invite.headers.get("Via")
    caller.on_message(make_response(invite, 487, to_tag=FAR_TAG))
    with pytest.raises(SipCallFailed) as failed:
        await task
    assert failed.value.status == 487
    await caller.close()
    # Our BYE after the answer, answered 200; no response at all to an INVITE is a 408.
    far = far_rtp_socket()
    caller = ScriptedCaller("sip:ok@127.0.0.1")
    task, invite = await started(caller)
    caller.on_message(answer_for(invite, far.getsockname()[1]))
    await task
    hangup = asyncio.create_task(caller.hangup())
    await asyncio.sleep(0)
    bye = caller.link.sent[-1]
    assert bye.method == "BYE" and bye.to.tag == FAR_TAG and bye.cseq.seq == 2
    caller.on_message(make_response(bye, 200))
    await hangup
    assert caller.ended and caller.hung_up_by == "caller"
    await caller.close()
    far.close()
    caller = ScriptedCaller("sip:void@127.0.0.1")
    task, invite = await started(caller)
    caller.on_timeout(invite)
    with pytest.raises(SipCallFailed) as failed:
        await task
    assert failed.value.status == 408
    await caller.close()
    caller = ScriptedCaller("sip:gone@127.0.0.1:9")
    task, invite = await started(caller)
    caller.on_timeout(invite, unreachable=True)
    with pytest.raises(SipCallFailed) as failed:
        await task
    assert failed.value.status == 503 and "nothing at 127.0.0.1:9" in failed.value.reason
    await caller.close()
