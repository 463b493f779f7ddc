"""More inbound SIP scenarios against real sipp (docs/sip.md), all on loopback.

The gateway, :class:`FakeApp` and the missing-sipp guard (fail under ``CI=true``, skip elsewhere)
come from :mod:`tests.integration.test_sip_sipp`; the scenarios live in ``tests/integration/sipp/``.
Covered here: hold and resume by re-INVITE (RFC 3264 §8.4), a late ACK that makes the gateway
retransmit its 200 (RFC 3261 §13.3.1.4), caller audio from sipp's ``rtp_stream`` streamer,
OPTIONS (§11) and malformed INVITEs answered 400 (§8.2.6.2, §18.3).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from appbridge.carriers.sip.inbound import SipCall
from appbridge.testing.audio import dominant_freq, rms_pcm16, tone_pcm16, ulaw_encode
from appbridge.testing.fake_app import FakeSession
from tests.integration.sipp_support import sipp_required
from tests.integration.test_sip_sipp import ROUTED, SipEnv, run_sipp, sip_gateway

pytestmark = [
    sipp_required(),
    pytest.mark.timeout(60),
]

#: Session audio format of the FakeApp session (the default app audio): pcm16 at 16 kHz.
APP_RATE_HZ = 16000
TONE_HZ = 1000.0
POLL_S = 0.02


async def poll_until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Wait (loop time) until ``condition()`` holds; the gateway state has no event to await."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(POLL_S)


async def first_session(env: SipEnv, sipp: asyncio.Task[tuple[int, str]]) -> FakeSession:
    """The call's app session; when none comes, sipp's own log says why (scenario errors)."""
    try:
        return await env.app.next_session(timeout=10)
    except TimeoutError:
        if sipp.done():
            rc, log = sipp.result()
            raise AssertionError(f"no session; sipp exited {rc}:\n{log}") from None
        raise


def only_call(env: SipEnv) -> SipCall:
    assert env.gw.sip is not None
    calls = list(env.gw.sip.inbound.calls.values())
    assert len(calls) == 1
    return calls[0]


def _trace(tmp: Path) -> str:
    """The one ``-trace_msg`` log sipp wrote into ``tmp`` (named after scenario and pid)."""
    traces = list(tmp.glob("*_messages.log"))
    assert len(traces) == 1, list(tmp.iterdir())
    return traces[0].read_text(errors="replace")


def received_messages(trace: str, status_line: str, cseq: str) -> list[str]:
    """The messages in sipp's ``-trace_msg`` log that sipp received, start with ``status_line``
    and carry ``CSeq: <cseq>``. sipp heads each with a dashed line and ``... message received``."""
    found = []
    for block in re.split(r"^-{10,}[^\n]*$", trace, flags=re.MULTILINE):
        head, _, message = block.strip().partition("\n")
        message = message.strip()
        if "message received" not in head or not message.startswith(status_line):
            continue
        if re.search(rf"^CSeq:\s*{cseq}\s*$", message, flags=re.MULTILINE):
            found.append(message)
    return found


async def test_hold_and_resume_by_reinvite(tmp_path: Path) -> None:
    async with sip_gateway(42000) as env:
        sipp = asyncio.create_task(
            run_sipp(
                env, "uac_hold_reinvite.xml", ROUTED, tmp_path, hold_ms="1500", resumed_ms="1500"
            )
        )
        session = await first_session(env, sipp)
        await session.wait_for("session.start", timeout=5)
        sc = only_call(env)
        await poll_until(lambda: sc.leg is not None, 5)
        leg = sc.leg
        assert leg is not None
        assert leg.negotiated.local_direction == "sendrecv"
        # Hold: the caller offered sendonly; our answer is recvonly (RFC 3264 §6.1) and the
        # leg stops sending (its ticks skip the RTP clock instead).
        await poll_until(lambda: leg.negotiated.local_direction == "recvonly", 8)
        assert leg.negotiated.remote_hold
        await asyncio.sleep(0.1)  # a tick already under way may still send one frame
        held_frames = leg.frames_sent
        await asyncio.sleep(0.5)
        assert leg.frames_sent == held_frames, "RTP went to a caller who holds"
        assert session.of_type("session.end") == []
        # Resume: sendrecv again, and media flows to the caller again.
        await poll_until(lambda: leg.negotiated.local_direction == "sendrecv", 5)
        assert not leg.negotiated.remote_hold
        await poll_until(lambda: leg.frames_sent >= held_frames + 10, 3)
        assert session.of_type("session.end") == []
        assert not session.closed
        rc, log = await sipp
        assert rc == 0, log
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        assert env.gw.sip is not None
        assert env.gw.sip.inbound.rejected == {}


async def test_late_ack_gets_the_200_retransmitted(tmp_path: Path) -> None:
    async with sip_gateway(42200) as env:
        sipp = asyncio.create_task(
            run_sipp(
                env,
                "uac_late_ack.xml",
                ROUTED,
                tmp_path,
                "-trace_msg",
                ack_delay_ms="1800",
                pause_ms="1500",
            )
        )
        session = await first_session(env, sipp)
        await session.wait_for("session.start", timeout=5)
        sc = only_call(env)
        await poll_until(lambda: sc.answered, 5)
        assert sc.retransmitter is not None  # no ACK yet: the 200 is being retransmitted
        await poll_until(lambda: sc.retransmitter is None, 5)  # the late ACK stopped it
        assert not sc.finished
        assert session.of_type("session.end") == []
        rc, log = await sipp
        assert rc == 0, log
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        trace = _trace(tmp_path)
        # T1 = 500 ms then 1 s: within 1.8 s the 200 went out at 0, 0.5 and 1.5 s.
        oks = received_messages(trace, "SIP/2.0 200", "1 INVITE")
        assert len(oks) >= 2, trace[-4000:]
        assert all(ok == oks[0] for ok in oks), "a retransmission must repeat the same 200"
        assert env.gw.metrics.calls_ended.get("caller_hangup") == 1
        assert env.gw.metrics.calls_ended.get("error") is None


async def test_rtp_stream_caller_audio_reaches_the_app(tmp_path: Path) -> None:
    audio = tmp_path / "tone_1k.ulaw"
    audio.write_bytes(ulaw_encode(tone_pcm16(TONE_HZ, 2000, 8000, amplitude=8000)))
    async with sip_gateway(42400) as env:
        sipp = asyncio.create_task(
            run_sipp(env, "uac_rtp_stream.xml", ROUTED, tmp_path, audio=str(audio), pause_ms="3000")
        )
        session = await first_session(env, sipp)
        start = await session.wait_for("session.start", timeout=5)
        assert start["audio"] == {"codec": "pcm16", "rate": APP_RATE_HZ}
        sc = only_call(env)
        await poll_until(lambda: sc.leg is not None, 5)
        assert sc.leg is not None
        assert sc.leg.negotiated.codec.name.upper() == "PCMU"
        # Frames keep coming (silence before the stream starts); wait for the tone itself.
        await session.wait_until(lambda: rms_pcm16(session.inbound_audio()) > 500, timeout=8)
        await session.wait_until(lambda: len(session.inbound_audio()) >= 2 * APP_RATE_HZ, 8)
        rc, log = await sipp
        assert rc == 0, log
        await session.wait_for("session.end", timeout=5)
        pcm = session.inbound_audio()
        # The loudest second is the tone: 1 kHz, near the encoded level (8000 peak: RMS ~5657).
        second_bytes = 2 * APP_RATE_HZ
        chunks = [pcm[i : i + second_bytes] for i in range(0, len(pcm), second_bytes // 4)]
        loudest = max(chunks, key=rms_pcm16)
        assert 4000 < rms_pcm16(loudest) < 7000
        assert abs(dominant_freq(loudest, APP_RATE_HZ) - TONE_HZ) < 20
        assert sc.leg.frames_delivered >= 100


async def test_options_gets_200(tmp_path: Path) -> None:
    async with sip_gateway(42600) as env:
        rc, log = await run_sipp(env, "uac_options.xml", ROUTED, tmp_path)
        assert rc == 0, log
        assert env.gw.sip is not None
        assert env.gw.sip.inbound.rejected == {}
        assert env.gw.sip.inbound.calls == {}
        assert len(env.gw.registry) == 0


@pytest.mark.parametrize(
    ("max_forwards", "content_length"),
    [
        pytest.param("70", "999", id="content-length-beyond-datagram"),
        pytest.param("70", "-5", id="negative-content-length"),
        pytest.param("many", "[len]", id="non-numeric-max-forwards"),
    ],
)
async def test_malformed_invite_gets_400(
    tmp_path: Path, max_forwards: str, content_length: str
) -> None:
    async with sip_gateway(42800) as env:
        rc, log = await run_sipp(
            env,
            "uac_malformed_invite.xml",
            ROUTED,
            tmp_path,
            "-trace_msg",
            max_forwards=max_forwards,
            content_length=content_length,
        )
        assert rc == 0, log
        assert env.gw.sip is not None
        assert env.gw.sip.transport.stats.malformed == 1
        assert env.gw.sip.inbound.calls == {}
        assert len(env.gw.registry) == 0
        assert env.app.sessions == []
        bad_requests = received_messages(_trace(tmp_path), "SIP/2.0 400 ", "1 INVITE")
        assert len(bad_requests) == 1


async def test_malformed_invite_400_reports_rport(tmp_path: Path) -> None:
    async with sip_gateway(42900) as env:
        rc, log = await run_sipp(
            env,
            "uac_malformed_invite.xml",
            ROUTED,
            tmp_path,
            "-trace_msg",
            max_forwards="70",
            content_length="999",
        )
        assert rc == 0, log
        (bad_request,) = received_messages(_trace(tmp_path), "SIP/2.0 400 ", "1 INVITE")
        via = re.search(r"^Via:[^\n]*$", bad_request, flags=re.MULTILINE)
        assert via is not None
        assert re.search(r";rport=\d+", via.group(0)), via.group(0)
