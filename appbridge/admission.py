"""Admission control (docs/configuration.md, ``[server]`` "Admission control"): past a configured
cap of live calls, while the process uses more than ``server.max_cpu_percent`` of a core, or
while the local recogniser is more than ``server.max_stt_lag_s`` behind, new calls are refused
cleanly (SIP 503 with Retry-After; Twilio TwiML ``<Reject>``) so the calls already
up keep their quality.

``CpuLoad`` is sans-I/O: it is fed ``(now, process CPU seconds)`` samples and answers the CPU
percentage over the last ``window_s`` seconds; the gateway samples it once a second.
"""

from __future__ import annotations

from collections import deque


class CpuLoad:
    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def sample(self, now: float, cpu_s: float) -> None:
        self._samples.append((now, cpu_s))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def percent(self) -> float | None:
        """CPU use over the window, in percent of one core; None before two samples."""
        if len(self._samples) < 2:
            return None
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (c1 - c0) / (t1 - t0) * 100.0)


def refusal(
    *,
    draining: bool,
    live_calls: int,
    max_calls: int,
    cpu_percent: float | None,
    max_cpu_percent: float | None,
    stt_lag_s: float = 0.0,
    max_stt_lag_s: float | None = None,
) -> str | None:
    """Why a new call must be refused, or None to take it. ``stt_lag_s``: how long the local
    recogniser's oldest owed final has waited; past ``max_stt_lag_s`` it is too far behind to
    take another caller (turns would end late for everyone)."""
    if draining:
        return "draining"
    if live_calls >= max_calls:
        return f"at the cap of {max_calls} calls"
    if max_cpu_percent is not None and cpu_percent is not None and cpu_percent >= max_cpu_percent:
        return f"CPU at {cpu_percent:.0f} % (limit {max_cpu_percent:g} %)"
    if max_stt_lag_s is not None and stt_lag_s >= max_stt_lag_s:
        return f"speech recognition {stt_lag_s:.1f} s behind (limit {max_stt_lag_s:g} s)"
    return None
