"""In-band DTMF tones (ITU-T Q.23 frequencies, Q.24 timing) for carriers that cannot carry
RFC 4733 events, such as a Twilio Media Stream (docs/protocol-session-v1.md, ``dtmf.send``).

Each digit is the sum of one low-group and one high-group sine, ``tone_ms`` long, followed by
``gap_ms`` of silence; ``,`` is a pause of ``pause_ms``. The defaults (100 ms on, 100 ms off,
about -7 dBm0 per tone) are well inside Q.24's acceptance limits (at least 40 ms of tone and 40 ms
of pause), so every standard decoder detects each press exactly once.
"""

from __future__ import annotations

import numpy as np

LOW_HZ = {
    "1": 697,
    "2": 697,
    "3": 697,
    "A": 697,
    "4": 770,
    "5": 770,
    "6": 770,
    "B": 770,
    "7": 852,
    "8": 852,
    "9": 852,
    "C": 852,
    "*": 941,
    "0": 941,
    "#": 941,
    "D": 941,
}
HIGH_HZ = {
    "1": 1209,
    "4": 1209,
    "7": 1209,
    "*": 1209,
    "2": 1336,
    "5": 1336,
    "8": 1336,
    "0": 1336,
    "3": 1477,
    "6": 1477,
    "9": 1477,
    "#": 1477,
    "A": 1633,
    "B": 1633,
    "C": 1633,
    "D": 1633,
}
TONE_MS = 100
GAP_MS = 100
PAUSE_MS = 500
# Each tone at about -7 dBm0: 0.3 of full scale; the pair peaks at 0.6, far from clipping.
TONE_AMPLITUDE = 0.3 * 32767


def dtmf_pcm16(
    digits: str,
    rate_hz: int,
    *,
    tone_ms: int = TONE_MS,
    gap_ms: int = GAP_MS,
    pause_ms: int = PAUSE_MS,
) -> bytes:
    """Little-endian pcm16 for ``digits`` (0-9 * # A-D, and ``,`` for a pause)."""
    tone_n = rate_hz * tone_ms // 1000
    gap = np.zeros(rate_hz * gap_ms // 1000, dtype=np.float64)
    pause = np.zeros(rate_hz * pause_ms // 1000, dtype=np.float64)
    t = np.arange(tone_n, dtype=np.float64) / rate_hz
    # A 5 ms raised-cosine ramp at each end keeps the tone's spectrum clean (no clicks).
    ramp_n = min(tone_n // 2, rate_hz * 5 // 1000)
    envelope = np.ones(tone_n)
    if ramp_n:
        ramp = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, ramp_n))
        envelope[:ramp_n] = ramp
        envelope[-ramp_n:] = ramp[::-1]
    parts: list[np.ndarray] = []
    for digit in digits.upper():
        if digit == ",":
            parts.append(pause)
            continue
        if digit not in LOW_HZ:
            raise ValueError(f"not a DTMF digit: {digit!r}")
        tone = np.sin(2 * np.pi * LOW_HZ[digit] * t) + np.sin(2 * np.pi * HIGH_HZ[digit] * t)
        parts.append(tone * envelope * TONE_AMPLITUDE)
        parts.append(gap)
    if not parts:
        return b""
    samples = np.concatenate(parts)
    return np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()
