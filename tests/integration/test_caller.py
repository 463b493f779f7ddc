"""``appbridge call`` against a real gateway on the embedded default (docs/caller.md: a newcomer can
place a test call and hear the demo app).

The gateway runs in-process on a loopback port with ``default_config(port)``, so the demo app's
URL carries the real port. One call of about ten seconds covers the whole story: the webhook and
stream, the greeting, a keypress after it, the demo's "You pressed 5." and the recording. What was
heard is checked against the offline TTS's own rendering of the same sentences (eSpeak NG is
deterministic), so "the answer arrived" means those words, not just any sound.
"""

from __future__ import annotations

import asyncio
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from appbridge.caller import (
    CallerUsageError,
    CallPlan,
    CallReport,
    load_wav_ulaw,
    place_test_call,
)
from appbridge.config import default_config
from appbridge.demo.app import GREETING
from appbridge.media.codecs import PCM16_8K, PCMU_8K, AudioFormat, Converter
from appbridge.media.wav import parse_wav
from appbridge.speech.providers.local import LocalTtsProvider
from appbridge.testing.audio import dominant_freq, rms_pcm16, tone_pcm16, ulaw_decode
from appbridge.testing.harness import bind_loopback, running_gateway

pytestmark = pytest.mark.integration

#: The greeting lasts about 6 s from the stream's opening; the key is pressed once it is over.
DIGIT_AT_S = 7.5
CALL_S = 10.5
FRAME_SAMPLES = 160
SILENT_RMS = 100.0


async def tts_pcm16_8k(text: str) -> bytes:
    """The demo's sentence as the local provider renders it, at the caller's 8 kHz."""
    provider = LocalTtsProvider()
    voice = next(v for v in provider.voices() if v.id == "local/en-US")
    chunks = [chunk async for chunk in provider.synthesize(text, voice, "en-US")]
    pcm = b"".join(c.pcm16 for c in chunks)
    # Through µ-law and back, as the caller hears it.
    to_ulaw = Converter(AudioFormat("pcm16", chunks[0].rate_hz), PCMU_8K)
    return Converter(PCMU_8K, PCM16_8K).convert(to_ulaw.convert(pcm))


def voiced_extent_s(pcm16_8k: bytes) -> float:
    """Seconds from the first to the last non-silent 20 ms frame."""
    samples = np.frombuffer(pcm16_8k, dtype="<i2")
    frames = len(samples) // FRAME_SAMPLES
    voiced = [
        i
        for i in range(frames)
        if rms_pcm16(samples[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES].tobytes()) >= SILENT_RMS
    ]
    return 0.0 if not voiced else (voiced[-1] + 1 - voiced[0]) * 0.020


def best_match(heard: bytes, reference: bytes) -> float:
    """Peak normalised cross-correlation of the reference against the heard audio (1.0 = the
    same waveform), searched over every lag; the envelopes are compared, which tolerates the
    different resampling paths of the gateway and of this test."""

    def envelope(pcm: bytes) -> np.ndarray:
        x = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.float64))
        n = len(x) // 40
        return x[: n * 40].reshape(n, 40).mean(axis=1)  # 5 ms steps

    h, r = envelope(heard), envelope(reference)
    r = r - r.mean()
    best = 0.0
    for lag in range(len(h) - len(r) + 1):
        window = h[lag : lag + len(r)]
        w = window - window.mean()
        denom = math.sqrt(float(np.dot(w, w)) * float(np.dot(r, r)))
        if denom:
            best = max(best, float(np.dot(w, r)) / denom)
    return best


def slice_s(pcm16_8k: bytes, start_s: float, end_s: float) -> bytes:
    first, last = int(start_s * 8000) * 2, int(end_s * 8000) * 2
    return pcm16_8k[max(0, first) : max(0, last)]


async def run_demo_call(tmp_path: Path) -> tuple[CallReport, list[str], Path]:
    sock = bind_loopback()
    port = sock.getsockname()[1]
    record = tmp_path / "heard.wav"
    lines: list[str] = []
    async with running_gateway(default_config(port, sip_port=None), sock):
        plan = CallPlan(
            url=f"http://127.0.0.1:{port}",
            digits="5",
            digits_start_s=DIGIT_AT_S,
            seconds=CALL_S,
            record=record,
        )
        report = await place_test_call(plan, emit=lines.append)
    return report, lines, record


async def test_a_test_call_hears_the_greeting_then_the_answer_to_a_key(tmp_path: Path) -> None:
    greeting_ref = await tts_pcm16_8k(GREETING)
    digit_refs = {d: await tts_pcm16_8k(f"You pressed {d}.") for d in "0123456789"}
    answer_ref = digit_refs["5"]
    report, lines, record = await run_demo_call(tmp_path)
    text = "\n".join(lines)

    # Connected through the Twilio ingress, and the caller (not the gateway) ended it on time.
    assert report.exit_code == 0, text
    assert report.connected and report.webhook_status == 200, text
    assert "<Connect><Stream url=ws://127.0.0.1:" in report.verdict
    assert report.hung_up_by == "caller", text
    assert report.stream_open_at_s is not None
    opened = report.stream_open_at_s
    assert report.heard_s == pytest.approx(CALL_S, abs=0.3)

    # One keypress, on schedule.
    assert [d for _, d in report.digits_sent] == ["5"]
    digit_at = report.digits_sent[0][0]
    assert digit_at - opened == pytest.approx(DIGIT_AT_S, abs=0.2)

    # The greeting: sound from the start, as long as the TTS says it is, over before the key.
    before = [s for s in report.voiced_spans if s[0] < digit_at]
    after = [s for s in report.voiced_spans if s[0] >= digit_at]
    assert before and after, report.voiced_spans
    assert before[0][0] - opened < 1.0
    greeting_s = before[-1][1] - before[0][0]
    expected_greeting_s = voiced_extent_s(greeting_ref)
    assert expected_greeting_s > 4.0
    assert greeting_s == pytest.approx(expected_greeting_s, rel=0.15), report.voiced_spans

    # The answer: sound soon after the key, lasting as long as "You pressed 5.", then quiet.
    answer_start, answer_end = after[0]
    assert answer_start - digit_at < 1.0
    assert len(after) == 1, report.voiced_spans
    assert answer_end - answer_start == pytest.approx(voiced_extent_s(answer_ref), rel=0.25)

    # What was heard is those very sentences (the envelope of the local TTS's own rendering),
    # and the answer names the key pressed: of "You pressed 0." ... "You pressed 9." it matches
    # "5" best. (The envelopes of two such answers differ little, 0.88-0.97 for "5" against
    # 0.81-0.83 for "9", so a fixed margin would be fragile.) The greeting matches its reference
    # at 0.99 alone, but at 0.755 twice in the full suite: eSpeak's output depends on what the
    # process synthesised before (its wavegen state runs on), so the reference rendered here and
    # the demo's rendering can differ; an unrelated sentence scores 0.13-0.16.
    heard = report.heard_pcm16()
    heard_answer = slice_s(heard, answer_start - opened - 0.3, answer_end - opened + 0.3)
    matches = {d: best_match(heard_answer, ref) for d, ref in digit_refs.items()}
    assert max(matches, key=lambda d: matches[d]) == "5", matches
    assert matches["5"] > 0.7, matches
    heard_greeting = slice_s(heard, 0.0, digit_at - opened)
    assert best_match(heard_greeting, greeting_ref) > 0.7

    # The narration has one line per event, with relative times.
    assert "sent DTMF 5" in text
    assert "audio from the gateway starts" in text
    assert "hanging up (--seconds" in text
    assert lines[-1].startswith("summary: heard ")

    # The recording is the playout timeline, silence included, as 16-bit 8 kHz WAV.
    decoded = parse_wav(record.read_bytes())
    assert decoded.rate_hz == 8000
    assert decoded.pcm16 == heard
    assert decoded.duration_ms == pytest.approx(CALL_S * 1000, abs=300)
    assert report.voiced_s == pytest.approx(sum(e - s for s, e in report.voiced_spans), abs=1.5)


async def test_refused_calls_and_usage_errors(tmp_path: Path) -> None:
    sock = bind_loopback()
    port = sock.getsockname()[1]
    async with running_gateway(default_config(port, sip_port=None), sock):
        base = f"http://127.0.0.1:{port}"
        # The embedded default has no auth token: a signed webhook is still accepted...
        lines: list[str] = []
        hang_up = asyncio.Event()
        hang_up.set()  # ...and a caller who hangs up at once leaves cleanly.
        plan = CallPlan(url=base, auth_token="any-token", seconds=5)
        report = await place_test_call(plan, emit=lines.append, hang_up=hang_up)
        assert report.exit_code == 0 and report.end_reason == "Ctrl-C", lines
        # A gateway path with no Twilio webhook: refused, exit 1.
        report = await place_test_call(CallPlan(url=base + "/nowhere"), emit=lines.append)
        assert report.exit_code == 1 and report.webhook_status == 404
        assert "refused: HTTP 404" in report.verdict
    # Nobody listening any more: unreachable, exit 1.
    report = await place_test_call(CallPlan(url=base), emit=lines.append)
    assert report.exit_code == 1 and "unreachable" in report.verdict
    for bad in (
        CallPlan(url="sip:+15550002222@127.0.0.1"),
        CallPlan(url="ftp://127.0.0.1"),
        CallPlan(url=base, digits="12x"),
        CallPlan(url=base, seconds=0),
        CallPlan(url=base, record=tmp_path / "missing" / "heard.wav"),
    ):
        with pytest.raises(CallerUsageError):
            await place_test_call(bad, emit=lines.append)


def test_the_call_command_is_on_the_command_line() -> None:
    """A real process: ``python -m appbridge call``."""
    command = [sys.executable, "-m", "appbridge", "call"]
    result = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    for option in ("--play", "--digits", "--record", "--seconds", "--auth-token", "--public-url"):
        assert option in result.stdout
    # A sip: URI is a SIP call (appbridge/caller/sip); its usage errors exit 2 as well.
    sip = subprocess.run(
        [*command, "sip:+15550002222@127.0.0.1:9", "--digits", "1x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sip.returncode == 2
    assert "--digits" in sip.stderr


def test_play_accepts_any_wav_and_sends_it_as_ulaw_8k(tmp_path: Path) -> None:
    """--play: a 44.1 kHz stereo file becomes µ-law 8 kHz of the same length and pitch."""
    tone = np.frombuffer(tone_pcm16(440, 1000, 44100), dtype="<i2")
    stereo = np.repeat(tone, 2).tobytes()  # both channels the same: the downmix keeps the tone
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(stereo),
        b"WAVE",
        b"fmt ",
        16,
        1,
        2,
        44100,
        44100 * 4,
        4,
        16,
        b"data",
        len(stereo),
    )
    wav = tmp_path / "tone.wav"
    wav.write_bytes(header + stereo)
    ulaw = load_wav_ulaw(wav)
    assert len(ulaw) == pytest.approx(8000, abs=2)
    assert dominant_freq(ulaw_decode(ulaw), 8000) == pytest.approx(440, abs=5)
    (tmp_path / "bad.wav").write_bytes(b"not a wav file")
    with pytest.raises(CallerUsageError, match="not a RIFF/WAVE file"):
        load_wav_ulaw(tmp_path / "bad.wav")
    with pytest.raises(CallerUsageError, match="cannot read"):
        load_wav_ulaw(tmp_path / "missing.wav")
