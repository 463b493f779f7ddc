"""Call-control rules (docs/protocol-session-v1.md, "Call control"): hold gating, handoff limits,
DTMF tone timing."""

from __future__ import annotations

import numpy as np
import pytest

from appbridge.calls.control import ALLOWED_ON_HOLD, MAX_HANDOFFS, CallControl
from appbridge.media.dtmf import GAP_MS, PAUSE_MS, TONE_MS, dtmf_pcm16
from appbridge.protocol.session_v1 import COMMAND_TYPES
from appbridge.testing.audio import decode_dtmf


def test_on_hold_only_resume_hangup_transfer_and_handoff_pass() -> None:
    control = CallControl()
    assert all(control.gate(kind) is None for kind in COMMAND_TYPES)
    assert control.hold() is True
    assert control.hold() is False  # already on hold
    for kind in COMMAND_TYPES:
        verdict = control.gate(kind)
        if kind in ALLOWED_ON_HOLD:
            assert verdict is None, kind
        else:
            assert verdict is not None and verdict[0] == "on_hold", kind
    assert {"resume", "hangup", "transfer", "handoff"} == ALLOWED_ON_HOLD
    assert control.resume() is True
    assert control.gate("speak") is None
    assert control.resume() is False


def test_at_most_five_handoffs_and_failed_ones_do_not_count() -> None:
    control = CallControl()
    for _ in range(MAX_HANDOFFS - 1):
        assert control.begin_handoff() is None
        control.end_handoff(True)
    assert control.begin_handoff() is None
    control.end_handoff(False)  # unreachable target: not counted
    assert control.begin_handoff() is None
    control.end_handoff(True)
    assert control.handoffs == MAX_HANDOFFS
    assert control.begin_handoff() == "at most 5 handoffs per call"


def test_one_handoff_or_transfer_at_a_time() -> None:
    control = CallControl()
    assert control.begin_handoff() is None
    assert control.gate("handoff") == ("bad_message", "a handoff is already under way")
    assert control.gate("transfer") is not None
    assert control.gate("speak") is None
    control.end_handoff(True)
    control.transfer_pending = "cold"
    assert control.gate("transfer") is not None


@pytest.mark.parametrize("rate_hz", [8000, 16000])
def test_dtmf_tones_decode_back_with_the_standard_timing(rate_hz: int) -> None:
    digits = "1234567890*#ABCD"
    pcm = dtmf_pcm16(digits, rate_hz)
    per_digit = (TONE_MS + GAP_MS) * rate_hz // 1000
    assert len(pcm) == 2 * per_digit * len(digits)
    assert decode_dtmf(pcm, rate_hz) == digits


def test_dtmf_pause_and_exact_timing() -> None:
    rate = 8000
    pcm = np.frombuffer(dtmf_pcm16("5,5", rate), dtype="<i2")
    tone_n, gap_n, pause_n = (rate * ms // 1000 for ms in (TONE_MS, GAP_MS, PAUSE_MS))
    assert len(pcm) == 2 * (tone_n + gap_n) + pause_n
    assert np.all(pcm[tone_n : tone_n + gap_n + pause_n] == 0)  # gap then pause: silence
    assert np.max(np.abs(pcm[:tone_n])) > 15000  # loud enough (about -7 dBm0 per tone)
    assert np.max(np.abs(pcm)) < 32767  # never clipped
    assert decode_dtmf(pcm.tobytes(), rate) == "55"


def test_dtmf_rejects_non_digits() -> None:
    with pytest.raises(ValueError):
        dtmf_pcm16("12x", 8000)
    assert dtmf_pcm16("", 8000) == b""
