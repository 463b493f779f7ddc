"""Status callbacks of a call placed through Twilio that reached a node other than the one that
placed it, forwarded to that node (docs/scaling.md, "Calls placed through Twilio").

Twilio posts ``/twilio/status`` to ``server.public_url``, the load balancer, so a callback may
land on any node. The node that placed the call names itself in the callback's URL
(carriers/twilio_outbound.py); the landing node checks Twilio's signature as it would for its
own call, then sends the form on to :data:`STATUS_ROUTE` of that node, signed with the cluster
secret, and answers Twilio with the owner's answer. The named node is trusted only as far as a
live node announced its ``internal_url`` in Redis: nothing is sent to an address taken from the
request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode

from appbridge.cluster.forward import INTERNAL_PREFIX, forward
from appbridge.cluster.redis_link import RedisUnavailable

if TYPE_CHECKING:
    from appbridge.cluster.service import ClusterService

log = logging.getLogger(__name__)

#: The owner's half, under the internal prefix; ``{dial_id}`` is the dial's id.
STATUS_ROUTE: Final = INTERNAL_PREFIX + "/twilio/status/{dial_id}"
FORM_TYPE: Final = "application/x-www-form-urlencoded"

Answer = tuple[int, str, bytes]
#: What a single node answers a callback for no dial it tracks: Twilio is told it was taken.
IGNORED: Final[Answer] = (204, "text/plain", b"")
UNAVAILABLE: Final[Answer] = (
    503,
    "application/json",
    b'{"error":"cluster_unavailable","message":"the cluster directory is unreachable"}',
)


async def forward_status(
    cluster: ClusterService, owner: str, dial_id: str, pairs: list[tuple[str, str]]
) -> Answer:
    """Send a verified status callback to the live node ``owner``: its answer, :data:`IGNORED`
    when that node is not live (its calls are gone with it), 503 when Redis cannot say."""
    try:
        node = await cluster.node(owner)
    except RedisUnavailable:
        return UNAVAILABLE
    if node is None:
        log.info("twilio status: dial %s of node %s, which is not live; ignored", dial_id, owner)
        return IGNORED
    answer = await forward(
        cluster,
        node,
        "POST",
        STATUS_ROUTE.format(dial_id=dial_id),
        body=urlencode(pairs).encode(),
        headers={"content-type": FORM_TYPE},
    )
    ctype = answer.headers.get("content-type", "text/plain")
    return answer.status_code, ctype, bytes(answer.body)
