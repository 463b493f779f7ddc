"""The reader of ``[cluster]``: a node's identity, its Redis and how the other nodes reach it.

Without the section the gateway is one node and nothing here runs (docs/configuration.md,
``[cluster]``; docs/scaling.md). Every problem is recorded on the :class:`Reader` with its key
path, as the other section readers do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from appbridge.config.model import ClusterConfig
from appbridge.config.schema import Reader, check_http_base_url, check_redis_url, describe

CLUSTER_KEYS: Final = ("node_id", "redis_url", "internal_url", "secret")
# A node's name appears in Redis keys and in every call's ``node`` field: a safe, short word.
NODE_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


def parse_cluster(reader: Reader, data: Mapping[str, Any]) -> ClusterConfig | None:
    table = reader.table(data, "cluster", "cluster")
    if table is None:
        return None
    reader.check_keys("cluster", table, CLUSTER_KEYS)
    node_id = reader.string(table, "node_id", "cluster.node_id", required=True) or ""
    if node_id and NODE_ID_RE.fullmatch(node_id) is None:
        reader.problem(
            "cluster.node_id",
            f"expected 1-64 characters of A-Z a-z 0-9 . _ -, got {describe(node_id)}",
        )
    redis_url = (
        reader.string(table, "redis_url", "cluster.redis_url", required=True, secret=True) or ""
    )
    if redis_url:
        message = check_redis_url(redis_url)
        if message is not None:
            reader.problem("cluster.redis_url", message)
    internal_url = reader.string(table, "internal_url", "cluster.internal_url", required=True)
    if internal_url:
        message = check_http_base_url(internal_url)
        if message is not None:
            reader.problem("cluster.internal_url", message)
    secret = reader.string(table, "secret", "cluster.secret", required=True, secret=True) or ""
    return ClusterConfig(node_id, redis_url, internal_url or "", secret)
