"""Interop with a real baresip (docs/interop.md): real audio both ways over G.722 and PCMU.

The gateway runs in-process (``gateway_env``) with ``[sip]`` on 127.0.0.1 and one trunk pointing
at baresip; the app is a :class:`FakeApp` (pcm16 at 16 kHz). baresip is driven through the
harness in tests/integration/baresip.py. Under CI=true a missing baresip fails these tests;
elsewhere they skip (deploy/install-test-peers.sh installs it).

What each test proves:

- baresip calling in with G.722: the app hears a 1 kHz tone and a 5 kHz tone (which only a
  wideband codec can carry: G.711's band ends at 4 kHz), the local STT recognises a sentence
  spoken by the gateway's own eSpeak voice, and baresip hears the app's tone;
- an outbound call (``POST /v1/calls``) answered by baresip, once per codec: the session opens
  as ``outbound`` and audio flows both ways;
- over PCMU, a 6 kHz tone from the 16 kHz app does not reach baresip folded to 2 kHz: the
  gateway filters before it downsamples (appbridge/media/antialias.py).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.media.codecs import AudioFormat, Converter
from appbridge.media.wav import DecodedAudio
from appbridge.speech.catalog import default_catalog
from appbridge.testing import FakeSession
from appbridge.testing.audio import dominant_freq, goertzel_power, rms_pcm16, tone_pcm16
from appbridge.testing.wer import word_error_rate as wer
from tests.integration.baresip import AUDIO_RATE_HZ, Baresip, require_baresip, running_baresip
from tests.integration.conftest import API_TOKEN, Env, gateway_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROUTED = "+15550001111"
CALLEE = "+15550002222"
APP_RATE_HZ = 16_000
SENTENCE = "I would like to check the balance of my savings account please."
LOUD_RMS = 1000.0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sip_settings(rtp_low: int, trunk_port: int | None = None) -> dict[str, Any]:
    sip: dict[str, Any] = {
        "listen": [f"udp:127.0.0.1:{_free_udp_port()}"],
        "rtp_ports": [rtp_low, rtp_low + 99],
    }
    if trunk_port is not None:
        sip["trunks"] = [{"name": "main", "host": "127.0.0.1", "port": trunk_port}]
    return sip


def gateway_sip_port(env: Env) -> int:
    assert env.gw.sip is not None
    return env.gw.sip.transport.udp_addresses[0][1]


async def speech_pcm16(text: str) -> bytes:
    """The gateway's own offline voice (eSpeak NG), at baresip's source rate."""
    provider, voice, language = default_catalog().voice_for("local/en-US", None, None)
    pcm, rate = b"", 22050
    async for chunk in provider.synthesize(text, voice, language):
        pcm += chunk.pcm16
        rate = chunk.rate_hz
    return Converter(AudioFormat("pcm16", rate), AudioFormat("pcm16", AUDIO_RATE_HZ)).convert(pcm)


def tone_windows(pcm16: bytes, rate_hz: int, window_ms: int = 100) -> list[float]:
    """The dominant frequency of every loud window: a compact picture of what was heard."""
    size = rate_hz * window_ms // 1000 * 2
    return [
        dominant_freq(pcm16[i : i + size], rate_hz)
        for i in range(0, len(pcm16) - size + 1, size)
        if rms_pcm16(pcm16[i : i + size]) > LOUD_RMS
    ]


def near(freqs: list[float], target_hz: float, tolerance_hz: float = 25.0) -> int:
    return sum(1 for f in freqs if abs(f - target_hz) <= tolerance_hz)


async def recording(peer: Baresip) -> DecodedAudio:
    """baresip's recording of the last call; sndfile completes the file when the call ends."""
    for _ in range(100):
        if peer.recordings():
            heard = peer.received_audio()
            if heard.pcm16:
                return heard
        await asyncio.sleep(0.05)
    return peer.received_audio()


async def app_tone(session: FakeSession, freq_hz: float, ms: int) -> None:
    await session.send_binary(tone_pcm16(freq_hz, ms, APP_RATE_HZ, amplitude=8000))


def assert_heard_app_tone(heard: DecodedAudio, freq_hz: float, peer: Baresip) -> None:
    windows = tone_windows(heard.pcm16, heard.rate_hz)
    assert near(windows, freq_hz) >= 5, f"{windows}\n{peer.log_text()}"


async def test_baresip_calls_in_over_g722_tone_wideband_speech_and_back(tmp_path: Path) -> None:
    require_baresip()
    wav = tmp_path / "caller.wav"
    Baresip.write_wav(
        wav,
        tone_pcm16(1000, 800, AUDIO_RATE_HZ, amplitude=8000)
        + tone_pcm16(5000, 600, AUDIO_RATE_HZ, amplitude=8000)
        + bytes(2 * AUDIO_RATE_HZ)  # 1 s of silence: the tones' turn ends before the sentence
        + await speech_pcm16(SENTENCE),
        hold_s=3.0,
    )
    async with (
        gateway_env(sip=sip_settings(44_000), numbers=[{"number": ROUTED, "app": "main"}]) as env,
        running_baresip(
            tmp_path / "caller", user="+15550003333", codecs=("G722",), play=wav
        ) as caller,
    ):
        await caller.dial(f"sip:{ROUTED}@127.0.0.1:{gateway_sip_port(env)}")
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "inbound" and start["to"] == ROUTED
        assert start["from"] == "+15550003333"
        await session.send({"type": "listen.update", "patience": "low"})
        await app_tone(session, 600, 1200)
        await caller.wait_event("CALL_ESTABLISHED")

        # The sentence: some turn.ended (the tones may make turns of their own) carries it.
        async with asyncio.timeout(25):
            while True:
                ended = await session.wait_for("turn.ended", timeout=25)
                if wer(SENTENCE, ended["text"]) <= 0.5:
                    break
        # The WAV ends, baresip hangs up.
        end = await session.wait_for("session.end", timeout=10)
        assert end["reason"] == "caller_hangup"
        await caller.wait_event("CALL_CLOSED")

        inbound = session.inbound_audio()
        windows = tone_windows(inbound, APP_RATE_HZ)
        assert near(windows, 1000) >= 5, windows
        # 5 kHz survives: the call really is wideband end to end (G.711 stops at 4 kHz).
        assert near(windows, 5000) >= 3, windows
        heard = await recording(caller)
        assert heard.rate_hz == 16_000  # baresip decoded G.722 (16 kHz), not G.711
        assert_heard_app_tone(heard, 600, caller)
        assert "G722" in caller.log_text(100_000)


@dataclass(frozen=True)
class Answered:
    """An outbound call that baresip answered: the callee, the app's session, its start."""

    callee: Baresip
    http: httpx.AsyncClient
    call_ref: str
    session: FakeSession
    start: dict[str, Any]

    async def hang_up(self) -> DecodedAudio:
        """End the call over the REST API; what baresip heard."""
        deleted = await self.http.delete(f"/v1/calls/{self.call_ref}")
        assert deleted.status_code in (200, 202, 204), deleted.text
        await self.callee.wait_event("CALL_CLOSED", timeout_s=10)
        return await recording(self.callee)


@asynccontextmanager
async def answered_by_baresip(
    tmp_path: Path, codec: str, rtp_low: int, plays: bytes
) -> AsyncIterator[Answered]:
    """``POST /v1/calls`` to a baresip that answers with ``codec`` and plays ``plays``."""
    require_baresip()
    wav = tmp_path / "callee.wav"
    Baresip.write_wav(wav, plays, hold_s=20.0)
    callee = Baresip(tmp_path / "callee", user=CALLEE, codecs=(codec,), play=wav)
    async with (
        gateway_env(sip=sip_settings(rtp_low, trunk_port=callee.sip_port)) as env,
        callee,
        httpx.AsyncClient(
            base_url=env.base_url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=10
        ) as http,
    ):
        body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:main"}
        created = await http.post("/v1/calls", json=body)
        assert created.status_code == 201, created.text
        await callee.wait_event("CALL_ESTABLISHED", timeout_s=10)
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        yield Answered(callee, http, created.json()["callRef"], session, start)


@pytest.mark.parametrize(("codec", "rtp_low"), [("PCMU", 44_200), ("G722", 44_400)])
async def test_outbound_call_answered_by_baresip(tmp_path: Path, codec: str, rtp_low: int) -> None:
    tone = tone_pcm16(1000, 1000, AUDIO_RATE_HZ, amplitude=8000)
    async with answered_by_baresip(tmp_path, codec, rtp_low, tone) as call:
        session, start = call.session, call.start
        assert start["direction"] == "outbound" and start["callRef"] == call.call_ref
        assert start["to"] == CALLEE
        await app_tone(session, 600, 1200)
        # Caller audio: the callee's 1 kHz tone reaches the app.
        await session.wait_until(lambda: len(session.inbound_audio()) >= APP_RATE_HZ * 2, timeout=8)
        windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
        assert near(windows, 1000) >= 5, windows
        await asyncio.sleep(0.8)  # let the app's 1.2 s tone finish playing out
        heard = await call.hang_up()
        assert heard.rate_hz == (16_000 if codec == "G722" else 8000)
        assert_heard_app_tone(heard, 600, call.callee)
        assert goertzel_power(heard.pcm16, heard.rate_hz, 600) > 0


async def test_an_app_tone_above_the_telephone_band_is_not_folded_into_a_pcmu_call(
    tmp_path: Path,
) -> None:
    """Linear interpolation alone would play a 16 kHz app's 6 kHz tone to a G.711 caller as a
    2 kHz tone at the same level (appbridge/media/antialias.py)."""
    async with answered_by_baresip(tmp_path, "PCMU", 46_800, bytes(2 * AUDIO_RATE_HZ)) as call:
        await app_tone(call.session, 6000, 1200)
        await app_tone(call.session, 1000, 1200)
        await asyncio.sleep(2.8)  # both tones play out
        heard = await call.hang_up()
        assert heard.rate_hz == 8000
        windows = tone_windows(heard.pcm16, heard.rate_hz)
        assert near(windows, 1000) >= 5, f"{windows}\n{call.callee.log_text()}"
        folded = goertzel_power(heard.pcm16, 8000, 2000)
        assert folded < goertzel_power(heard.pcm16, 8000, 1000) * 1e-4, windows  # 40 dB below
        assert near(windows, 2000) == 0, windows
