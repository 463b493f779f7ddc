"""``POST /twilio/status``: the status callback of a call the gateway placed through Twilio
(docs/protocol-twilio.md, "Outbound calls"; carriers/twilio_outbound.py).

Twilio signs the callback like the voice webhook, over ``public_url`` + path + query and the
form, so the check is made on whichever node it reaches. What the form says is then applied to
the dial it names (:func:`apply_status`) or, clustered, sent on to the node that placed the dial
when that is another one (docs/scaling.md, "Calls placed through Twilio"): the query's
:data:`~appbridge.carriers.twilio_outbound.NODE_QUERY` names it, and Twilio's signature covers it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from appbridge.carriers.twilio_outbound import DIAL_ID_RE, NODE_QUERY
from appbridge.cluster import cluster_of
from appbridge.protocol.signing import verify_twilio

if TYPE_CHECKING:
    from appbridge.carriers.services import CarrierServices

log = logging.getLogger(__name__)

#: An HTTP answer as the routes render it: (status, content type, body).
Answer = tuple[int, str, bytes]


async def handle_status_callback(
    gw: CarrierServices, url: str, pairs: list[tuple[str, str]], signature: str | None
) -> Answer:
    """``POST /twilio/status``: (status, content type, body). Signed like the voice webhook
    (docs/protocol-twilio.md, "X-Twilio-Signature"): 403 on a mismatch, and nothing changes.
    Clustered, a callback of another node's dial goes on to that node once checked here."""
    cfg = gw.config.twilio
    if cfg is None:
        return 404, "application/json", b'{"error":"not_found","message":"Twilio is not enabled"}'
    params: dict[str, list[str]] = {}
    for name, value in pairs:
        params.setdefault(name, []).append(value)
    if cfg.auth_token and not verify_twilio(cfg.auth_token, url, params, signature or ""):
        gw.metrics.bad_signatures += 1
        return (
            403,
            "application/json",
            b'{"error":"forbidden","message":"X-Twilio-Signature does not match"}',
        )
    query = dict(parse_qsl(urlsplit(url).query))
    dial_id = query.get("dial", "")
    owner = query.get(NODE_QUERY, "")
    found = gw.twilio_outbound
    cluster = cluster_of(gw)
    if (
        cluster is not None
        and owner
        and owner != cluster.node_id
        and (found is None or found.dial(dial_id) is None)
        and DIAL_ID_RE.fullmatch(dial_id)
    ):
        from appbridge.cluster.dial_relay import forward_status

        return await forward_status(cluster, owner, dial_id, pairs)
    return apply_status(gw, dial_id, pairs)


def apply_status(gw: CarrierServices, dial_id: str, pairs: list[tuple[str, str]]) -> Answer:
    """A verified status callback applied to this node's dial: on a direct callback, or one
    another node forwarded (http/routes_twilio.py). One for no dial tracked here is ignored."""
    form = dict(pairs)
    found = gw.twilio_outbound
    if found is None or not found.on_status(dial_id, form):
        log.debug("twilio status: callback for no dial we track (%s)", form.get("CallSid"))
    return 204, "text/plain", b""
