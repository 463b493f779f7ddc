"""The Redis keys of a cluster and the call records stored under them (docs/scaling.md,
"Redis keys").

Every key starts with :data:`PREFIX`. A node's hash and its call directory carry a TTL that its
heartbeat renews, so a node that dies leaves nothing behind once they expire.
"""

from __future__ import annotations

import json
from typing import Any, Final

PREFIX: Final = "appbridge:"
#: The set of node ids that have announced themselves (pruned when their hash is gone).
NODES: Final = PREFIX + "nodes"
#: What the other nodes see of a call in ``GET /v1/calls``, plus where it lives.
RECORD_FIELDS: Final = (
    "callRef",
    "sessionRef",
    "app",
    "direction",
    "from",
    "to",
    "carrier",
    "started",
    "state",
)


def node_key(node_id: str) -> str:
    """The node's hash: ``node_id``, ``internal_url``, ``max_calls``, ``live``, ``draining``."""
    return f"{PREFIX}node:{node_id}"


def calls_key(node_id: str) -> str:
    """The node's call directory: a hash of callRef → JSON record."""
    return f"{PREFIX}calls:{node_id}"


def callsid_key(call_sid: str) -> str:
    """The claim on a Twilio CallSid: the node whose webhook took the call."""
    return f"{PREFIX}twilio-callsid:{call_sid}"


def call_record(described: dict[str, Any], node_id: str) -> dict[str, Any]:
    """A call's directory record from its ``describe()``."""
    record = {name: described.get(name) for name in RECORD_FIELDS}
    record["node"] = node_id
    return record


def encode_record(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def decode_record(raw: str | bytes) -> dict[str, Any] | None:
    """A stored record, or None when it is not one (a record is never trusted to be well formed)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
