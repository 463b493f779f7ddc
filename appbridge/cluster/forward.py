"""Requests between nodes, both halves (docs/scaling.md, "Any node answers for any call").

:func:`forward` sends a request for a call held by another node to that node: always to the
``internal_url`` a live node announced in Redis, never to an address taken from the request,
signed (:mod:`appbridge.cluster.auth`) and aimed at the owner's route under
:data:`INTERNAL_PREFIX` (http/routes_calls.py, http/routes_twilio.py); its status, body and
content type come back unchanged, so the caller sees what the owner would have answered it.
:func:`internal_refusal` is the owner's check of such a request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httpx
from starlette.responses import JSONResponse, Response

from appbridge.cluster import auth

if TYPE_CHECKING:
    from appbridge.cluster.membership import NodeInfo
    from appbridge.cluster.service import ClusterService

log = logging.getLogger(__name__)

#: Where the internal routes live on every node.
INTERNAL_PREFIX = "/internal"


def error(status: int, code: str, message: str) -> JSONResponse:
    """The gateway's JSON error shape (docs/operations.md, "The `/v1` API")."""
    return JSONResponse({"error": code, "message": message}, status_code=status)


def internal_refusal(
    cluster: ClusterService | None, method: str, path: str, header: str | None
) -> Response | None:
    """The answer to an internal request not signed by a node of this cluster: 401 without a
    signature, 403 with a wrong or stale one; None to serve it."""
    if cluster is None:
        return error(404, "not_found", "this gateway is not part of a cluster")
    result = cluster.verify(method, path, header)
    if result is auth.AuthResult.MISSING:
        return error(401, "unauthorized", "a signed request of a cluster node is required")
    if result is auth.AuthResult.REFUSED:
        return error(403, "forbidden", "the cluster signature does not match or is stale")
    return None


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
