"""``--stt local``: the load bench with the gateway transcribing every caller (bench/README.md).

The default bench runs its apps with ``stt = "none"`` and its callers hum a 440 Hz tone, so it
measures the media path alone. With ``--stt local`` the apps listen with the offline recogniser
(docs/speech.md) and with ``--caller speech`` each caller speaks the telephone sentences of
:mod:`bench.speech_corpus` in turn (eSpeak NG through µ-law at 8 kHz), each followed by
``GAP_S`` of silence. The step then shows whether the recogniser keeps up, read from the
gateway's ``/metrics`` over the hold window (docs/operations.md, "Metrics"): how long each final
took from its utterance's close, the turns that ended without their final, the decoders'
real-time factor and what back-pressure dropped.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from appbridge.calls.listening import TURN_OUTCOMES
from appbridge.testing.audio import ulaw_encode
from bench.report import bound_cell, histogram_delta, number_cell, parse_histogram, parse_metric
from bench.speech_corpus import sentence_clips

__all__ = ["CALLER_ENV", "GAP_S", "drive_speaker", "speech_ulaw", "stt_figures", "stt_line"]

#: How the bench's callers sound: "tone" (the default) or "speech" (bench/worker.py reads it).
CALLER_ENV: Final = "BENCH_CALLER"
#: Silence after each sentence: the caller waits for an answer, as on a call.
GAP_S: Final = 2.0
DELAY_METRIC: Final = "appbridge_stt_final_delay_seconds"


class Talker(Protocol):
    closed: bool

    def talk(self, ulaw: bytes) -> None: ...


def speech_ulaw() -> list[bytes]:
    """The corpus sentences as the callers send them, µ-law 8 kHz (2.1 to 3.0 s each)."""
    return [ulaw_encode(clip.pcm16) for clip in sentence_clips()]


async def drive_speaker(
    call: Talker,
    clips: list[bytes],
    seed: int,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Speak ``clips`` in turn, from a random one and a random phase, each followed by
    ``GAP_S`` of silence (the caller's ticker sends the silence). ``sleep`` is the clock's."""
    rng = random.Random(seed)
    index = rng.randrange(len(clips))
    await sleep(rng.uniform(0.0, GAP_S))
    while not call.closed:
        clip = clips[index % len(clips)]
        call.talk(clip)
        index += 1
        await sleep(len(clip) / 8000 + GAP_S)


def stt_figures(before: str, after: str) -> dict[str, Any]:
    """What the recogniser did between two ``/metrics`` expositions."""

    def grew(name: str, labels: dict[str, str] | None = None) -> float:
        return parse_metric(after, name, labels) - parse_metric(before, name, labels)

    delay = histogram_delta(
        parse_histogram(before, DELAY_METRIC), parse_histogram(after, DELAY_METRIC)
    )
    decodes: dict[str, Any] = {}
    for kind in ("final", "partial"):
        audio_s = grew("appbridge_stt_decoded_audio_seconds_total", {"kind": kind})
        busy_s = grew("appbridge_stt_decode_seconds_total", {"kind": kind})
        decodes[kind] = {
            "decodes": grew("appbridge_stt_decodes_total", {"kind": kind}),
            "audio_s": round(audio_s, 1),
            "busy_s": round(busy_s, 1),
            "real_time_factor": round(busy_s / audio_s, 3) if audio_s > 0 else None,
        }
    return {
        "finals": delay.count,
        "final_delay_s": {
            "mean": round(delay.sum / delay.count, 3) if delay.count else None,
            "p50_le": delay.quantile_bound(0.50),
            "p95_le": delay.quantile_bound(0.95),
            "max_le": delay.max_bound(),
        },
        "turns": {o: grew("appbridge_turns_total", {"outcome": o}) for o in TURN_OUTCOMES},
        "decodes": decodes,
        "partials_dropped": grew("appbridge_stt_partials_dropped_total"),
        "finals_coalesced": grew("appbridge_stt_finals_coalesced_total"),
        "finals_owed_at_end": parse_metric(after, "appbridge_stt_finals_owed"),
        "workers": parse_metric(after, "appbridge_stt_decode_workers"),
    }


def stt_line(figures: dict[str, Any]) -> str:
    """One line under the step's row: the recogniser's figures (bucket bounds for the delay)."""
    delay = figures["final_delay_s"]
    turns = figures["turns"]
    final, partial = figures["decodes"]["final"], figures["decodes"]["partial"]
    bounds = "/".join(bound_cell(delay[k]) for k in ("p50_le", "p95_le", "max_le"))
    return (
        f"  local STT ({figures['workers']:.0f} worker(s)): {figures['finals']} finals, delay "
        f"mean {number_cell(delay['mean'], 3)} s, p50/p95/max {bounds} s; turns started "
        f"{turns['started']:.0f}, ended {turns['ended']:.0f}, without their final "
        f"{turns['ended_without_final']:.0f}, abandoned {turns['abandoned']:.0f}, backchannels "
        f"{turns['backchannel']:.0f}; real-time factor finals {final['real_time_factor']} "
        f"({final['audio_s']} s of audio), partials {partial['real_time_factor']}; partials "
        f"dropped {figures['partials_dropped']:.0f}, finals merged "
        f"{figures['finals_coalesced']:.0f}, owed at the end {figures['finals_owed_at_end']:.0f}"
    )
