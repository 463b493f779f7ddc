"""What the offline STT counts for ``/metrics`` (docs/operations.md, "Metrics"; docs/speech.md).

An operator running the ``local`` recogniser needs to see whether it keeps up: a decoder that
falls behind makes every turn end late (docs/turn-taking.md, "The rules", 5). The engine counts
its decodes on its worker threads (:class:`DecodeStats`, one per kind, under the engine's lock);
the provider's streams count their back-pressure decisions and how long each final took to
arrive (:class:`SttStats`, on the event loop). The collector reads both only when scraped.

The delay histogram is a prometheus_client ``Histogram`` that belongs to no registry: it is
observed once per final, a few times a minute per call, never per frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from prometheus_client import Histogram

__all__ = ["FINAL_DELAY_BUCKETS_S", "DecodeStats", "SttStats", "final_delay_histogram"]

#: Upper bounds, in seconds, of the final-delay buckets. Idle, a final arrives about 0.2 s after
#: its utterance closes; past 1.5 s a turn waits for it (``final_wait_s``); past 5 s it gives up.
FINAL_DELAY_BUCKETS_S: Final = (0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0)


def final_delay_histogram() -> Histogram:
    return Histogram(
        "appbridge_stt_final_delay_seconds",
        "From the local STT closing an utterance to its final transcript being delivered.",
        buckets=FINAL_DELAY_BUCKETS_S,
        registry=None,
    )


@dataclass(slots=True)
class SttStats:
    """Counters of a provider's streams (appbridge/speech/providers/local_stt.py, "Back-pressure"),
    and the delay of each final from its utterance's close to its delivery by ``results()``."""

    finals: int = 0
    partials: int = 0
    partials_dropped: int = 0
    partials_coalesced: int = 0
    finals_coalesced: int = 0
    final_delay: Histogram = field(default_factory=final_delay_histogram)


@dataclass(slots=True)
class DecodeStats:
    """One kind of decode (``final`` or ``partial``): how many ran, the audio they covered and
    the wall time they took. Busy time over audio time is the recogniser's real-time factor."""

    decodes: int = 0
    audio_s: float = 0.0
    busy_s: float = 0.0
