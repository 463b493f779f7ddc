"""A request for a call held by another node, relayed to that node (docs/scaling.md,
"Any node answers for any call").

The target is always the ``internal_url`` a live node announced in Redis, never an address
taken from the request. The request is signed (:mod:`appbridge.cluster.auth`) and sent to the
owner's internal route (:mod:`appbridge.cluster.internal_routes`); its status, body and content
type come back unchanged, so the caller sees what the owner would have answered it directly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httpx
from starlette.responses import Response

from appbridge.http.errors import error

if TYPE_CHECKING:
    from appbridge.cluster.membership import NodeInfo
    from appbridge.cluster.service import ClusterService

log = logging.getLogger(__name__)

#: Where the internal routes live on every node.
INTERNAL_PREFIX = "/internal"


def unavailable() -> Response:
    """The answer for a call that is not here while Redis cannot say where it is."""
    return error(
        503,
        "cluster_unavailable",
        "the call is not on this node and the cluster directory is unreachable",
    )


async def forward(
    cluster: ClusterService,
    node: NodeInfo,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> Response:
    """Send ``method path`` (an internal route) to ``node`` with ``headers`` and relay its
    answer; 503 when it does not answer within the forwarding timeout."""
    # Signed over the decoded path, which is what the receiver's router sees.
    headers = {**(headers or {}), **cluster.signed_headers(method, unquote(path))}
    cluster.gw.metrics.cluster_forwarded += 1
    try:
        answer = await cluster.http.request(
            method, node.internal_url + path, content=body, headers=headers
        )
    except httpx.HTTPError as exc:
        log.warning("cluster: %s %s to node %s failed: %s", method, path, node.node_id, exc)
        return error(
            503, "node_unreachable", f"node {node.node_id} holding the call did not answer"
        )
    relayed = Response(answer.content, status_code=answer.status_code)
    for name in ("content-type", "location", "www-authenticate"):
        value = answer.headers.get(name)
        if value is not None:
            relayed.headers[name] = value
    return relayed
