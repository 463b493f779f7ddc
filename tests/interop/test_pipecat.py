"""Interop with real Pipecat (docs/interop.md; docs/protocol-twilio.md).

A call comes in through the Twilio carrier ingress (the fake Twilio plays the caller), the
gateway dials a real Pipecat app (tests/interop/pipecat_app.py, in ``.venv-pipecat``) with the
Twilio dialect, and Pipecat, which believes it is talking to Twilio, parses ``connected`` and
``start`` with its own runner code, echoes the caller's audio through ``TwilioFrameSerializer``
and, when its pipeline ends, hangs up through the gateway's Twilio-compatible REST endpoint
(``auto_hang_up`` with ``base_url`` = the gateway; docs/protocol-twilio.md).

Real time is bounded: each test lasts about 5 s (up to 3 s of call, about 1 s for the Pipecat
process to start, the hang-up), far under the 30 s budget; every wait has a timeout.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from appbridge.testing.audio import dominant_freq, tone_pcm16, ulaw_decode, ulaw_encode
from appbridge.testing.fake_twilio import FakeTwilioCall
from tests.interop.conftest import pipecat_env

pytestmark = pytest.mark.interop

CALLER = "+15550001111"
CALLED = "+15550002222"
RATE_HZ = 8000
FRAME_SAMPLES = 160
#: A 20 ms frame louder than this (16-bit RMS) carries the tone; µ-law silence decodes to ~0.
TONE_RMS = 1000.0
REST_LOGGER = "appbridge.http.twilio_rest"


def frame_rms(pcm16: bytes) -> list[float]:
    """RMS of each whole 20 ms frame of 8 kHz PCM16."""
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    n = samples.size // FRAME_SAMPLES
    frames = samples[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)
    return [float(v) for v in np.sqrt(np.mean(frames**2, axis=1))]


def loud_audio(call: FakeTwilioCall) -> bytes:
    """The PCM16 of every 20 ms of gateway audio the caller heard that carries sound."""
    pcm = ulaw_decode(call.heard_ulaw())
    loud = [
        pcm[i * FRAME_SAMPLES * 2 : (i + 1) * FRAME_SAMPLES * 2]
        for i, rms in enumerate(frame_rms(pcm))
        if rms > TONE_RMS
    ]
    return b"".join(loud)


def first_loud_heard_at(call: FakeTwilioCall) -> float | None:
    for start, frame, n in call.heard_frames():
        if n and frame_rms(ulaw_decode(frame))[0] > TONE_RMS:
            return start
    return None


def first_loud_sent_at(call: FakeTwilioCall) -> float | None:
    """When the caller's first frame of tone left for the gateway."""
    for sent_at, msg in call.sent:
        if msg.get("event") == "media":
            frame = base64.b64decode(msg["media"]["payload"])
            if frame_rms(ulaw_decode(frame))[0] > TONE_RMS:
                return sent_at
    return None


def assert_pipecat_parsed_the_handshake(
    events: list[dict[str, object]], call: FakeTwilioCall, session_ref: str
) -> None:
    """Pipecat's runner read ``connected`` then ``start`` and took the right ids from them."""
    seen = {e["which"]: json.loads(str(e["raw"])) for e in events if e["event"] == "frame_seen"}
    assert seen["first"]["event"] == "connected", seen
    assert seen["second"]["event"] == "start", seen
    parsed = next(e for e in events if e["event"] == "parsed")
    assert parsed["transport"] == "twilio"
    assert parsed["callSid"] == call.call_sid
    assert parsed["streamSid"] == session_ref
    custom = parsed["customParameters"]
    assert isinstance(custom, dict) and custom.get("from") == CALLER


async def test_pipecat_echo_and_auto_hang_up(
    pipecat_python: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REST_LOGGER)
    async with pipecat_env(pipecat_python, tmp_path, "--scenario", "echo", "--call-s", "3") as (
        env,
        pc,
    ):
        call = await env.twilio.place_call(CALLER, CALLED, continuous_media=True)
        assert call.has_stream, call.stream_error
        await pc.wait_for("parsed", 10)
        described = env.gw.registry.describe(call.call_sid)
        assert described is not None and described["app"] == "pc"
        session_ref = str(described["sessionRef"])
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(700, 1500, RATE_HZ)))
        await call.send_dtmf("5")  # leaves after the tone
        dtmf = await pc.wait_for("dtmf", 5)
        # Pipecat ends its pipeline after 3 s; auto_hang_up POSTs to the gateway, which ends
        # the call (and the carrier leg through Twilio's REST API).
        hangup = await pc.wait_for("hangup", 15)
        await call.wait_closed(timeout=5)
        finished = await pc.wait_for("finished", 5)
        audio = await pc.wait_for("audio", 1)

    assert hangup["ok"] is True, hangup  # Pipecat got a 200 from the gateway's endpoint
    assert finished["ended_by_app"] is True
    assert dtmf["digit"] == "5"  # Pipecat's serializer made an InputDTMFFrame of it
    assert_pipecat_parsed_the_handshake(pc.events, call, session_ref)
    # Pipecat heard the caller's tone, at 8 kHz, undistorted.
    assert int(str(audio["frames_in"])) > 50
    assert abs(float(str(audio["dominant_hz"])) - 700) < 30, audio
    # The echo reached the caller: about the whole 1.5 s of tone, at its frequency.
    loud = loud_audio(call)
    assert 1.2 <= len(loud) / 2 / RATE_HZ <= 1.7, len(loud)
    assert abs(dominant_freq(loud, RATE_HZ) - 700) < 30
    heard_at, tone_sent_at = first_loud_heard_at(call), first_loud_sent_at(call)
    assert heard_at is not None and tone_sent_at is not None
    echo_latency_s = heard_at - tone_sent_at
    print(f"echo round trip through gateway and Pipecat: {echo_latency_s * 1000:.0f} ms")
    assert echo_latency_s < 1.0
    # The hang-up went through the REST endpoint and ended the call as the app's.
    assert any(
        "Twilio-compatible endpoint" in r.getMessage() and call.call_sid in r.getMessage()
        for r in caplog.records
        if r.name == REST_LOGGER
    )
    ended = env.gw.registry.describe(call.call_sid)
    assert ended is not None and ended["endReason"] == "app_hangup", ended
    assert call.closed and call.ended_by == "rest"  # the gateway ended the carrier leg
    assert env.rest.requests[-1].form.get("Status") == "completed"
    assert call.protocol_errors == []
    assert env.gw.metrics.app_bad_messages == 0  # everything Pipecat sent was understood


async def test_pipecat_interruption_sends_clear(
    pipecat_python: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REST_LOGGER)
    args = ("--scenario", "interrupt", "--tone-hz", "500", "--tone-ms", "3000")
    args += ("--interrupt-after-s", "0.6", "--call-s", "2.5")
    async with pipecat_env(pipecat_python, tmp_path, *args) as (env, pc):
        call = await env.twilio.place_call(CALLER, CALLED, continuous_media=True)
        assert call.has_stream, call.stream_error
        await pc.wait_for("parsed", 10)
        interrupted = await pc.wait_for("interrupted", 10)
        await call.wait_until(lambda: call.clears_received >= 1, timeout=5)
        hangup = await pc.wait_for("hangup", 15)
        await call.wait_closed(timeout=5)
        await pc.wait_for("finished", 5)

    assert hangup["ok"] is True, hangup
    # Pipecat's InterruptionFrame became `clear`, which the gateway passed on to the carrier.
    # Both processes read CLOCK_MONOTONIC, so the two timestamps compare.
    clear_delay_s = call.clear_times[0] - float(str(interrupted["t"]))
    print(f"Pipecat interruption to carrier clear: {clear_delay_s * 1000:.0f} ms")
    assert -0.05 < clear_delay_s < 0.5
    # The caller heard the start of the 3 s tone and no more than what played before the clear.
    loud = loud_audio(call)
    heard_s = len(loud) / 2 / RATE_HZ
    print(f"tone heard before the clear: {heard_s * 1000:.0f} ms of 3000 ms")
    assert 0.2 <= heard_s <= 1.3, heard_s
    assert abs(dominant_freq(loud, RATE_HZ) - 500) < 30
    last_loud = max(
        start
        for start, frame, n in call.heard_frames()
        if n and frame_rms(ulaw_decode(frame))[0] > TONE_RMS
    )
    assert last_loud < call.clear_times[0] + 0.05  # silence from the clear on
    ended = env.gw.registry.describe(call.call_sid)
    assert ended is not None and ended["endReason"] == "app_hangup"
    assert any(call.call_sid in r.getMessage() for r in caplog.records if r.name == REST_LOGGER)
    assert call.protocol_errors == []
    assert env.gw.metrics.app_bad_messages == 0  # everything Pipecat sent was understood
