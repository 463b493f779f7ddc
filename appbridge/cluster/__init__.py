"""A cluster of gateways sharing one Redis (docs/scaling.md; docs/configuration.md, ``[cluster]``).

One concept per module: :mod:`~appbridge.cluster.keys` (the Redis key names and call records),
:mod:`~appbridge.cluster.redis_link` (every Redis call bounded, outages counted),
:mod:`~appbridge.cluster.membership` (a node's heartbeat and the live nodes),
:mod:`~appbridge.cluster.directory` (which node holds which call),
:mod:`~appbridge.cluster.auth` (signed requests between nodes),
:mod:`~appbridge.cluster.forward` (a request relayed to the node holding the call, and the
owner's check of it),
:mod:`~appbridge.cluster.stream_relay` (a Twilio Media Stream relayed to the call's node),
:mod:`~appbridge.cluster.dial_relay` (a status callback of a call placed through Twilio, sent
on to the node that placed it) and
:mod:`~appbridge.cluster.service` (the running whole, started and stopped with the gateway).
Without ``[cluster]`` none of it runs and the gateway is one node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appbridge.cluster.service import ClusterService


def cluster_of(services: object) -> ClusterService | None:
    """The gateway's cluster service, or None for a single node. Carriers type against
    protocols that do not name it, so they reach it through here."""
    return getattr(services, "cluster", None)
