"""The gateway's own counters, exported on ``/metrics`` (docs/operations.md).

Kept apart from the gateway so that the engine and the carriers, which count, need not import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Metrics:
    app_unreachable: int = 0
    bad_signatures: int = 0
    carrier_bad_messages: int = 0
    app_bad_messages: int = 0
    calls_ended: dict[str, int] = field(default_factory=dict)
    # Audio frames dropped because the peer read too slowly (a sender never waits), by calls
    # already over; ``/metrics`` adds the live calls' own counts.
    audio_dropped_to_app: int = 0
    audio_dropped_to_carrier: int = 0
    # A cluster (docs/scaling.md): Redis command batches that failed or timed out, and requests
    # relayed to the node holding their call.
    cluster_redis_errors: int = 0
    cluster_forwarded: int = 0
    # Turn events sent to apps, by outcome (appbridge/calls/listening.py, TURN_OUTCOMES).
    turns: dict[str, int] = field(default_factory=dict)
