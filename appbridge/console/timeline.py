"""One call's timeline for the console: numbered entries in a bounded ring, and the cutting of
messages down to what the console may keep (docs/operations.md, "The console and the softphone").

At most :data:`MAX_ENTRIES` entries are kept; the oldest go first and are counted in
``dropped``. A message is kept parsed, with its strings cut to :data:`MAX_STRING` characters and
the whole to about :data:`MAX_DATA_BYTES` of JSON. Nothing secret is kept: fields named like a
secret are blanked, URLs keep only scheme://host:port (net/plaintext.py ``redact_url``), and the
configured secrets are taken out of every string (logs.py ``redact``).
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import Any, Final

from appbridge.logs import REDACTED, redact
from appbridge.net.plaintext import redact_url

MAX_ENTRIES: Final = 2000
MAX_STRING: Final = 500
MAX_DATA_BYTES: Final = 4096
MAX_ITEMS: Final = 50  # of a list, or of an object's keys
MAX_DEPTH: Final = 8
SUMMARY_CHARS: Final = 120
#: Field names whose values are never kept.
_SECRET_NAME: Final = re.compile(r"(?i)secret|token|password|signature|signing|api_?key|auth")
_URL: Final = re.compile(r"(?i)^(wss?|https?)://")
#: Fields a message's summary is made of, in order of preference.
_SUMMARY_FIELDS: Final = ("text", "transcript", "reason", "digit", "name", "message", "code")


def _cut_string(value: str) -> str:
    if _URL.match(value):
        return redact_url(value)
    value = redact(value)
    return value if len(value) <= MAX_STRING else value[:MAX_STRING] + "…"


def cut(value: Any, depth: int = 0) -> Any:
    """``value`` (parsed JSON) with secrets out and strings, lists and depth bounded."""
    if isinstance(value, str):
        return _cut_string(value)
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return "…"
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if i >= MAX_ITEMS:
                out["…"] = f"{len(value) - MAX_ITEMS} more fields"
                break
            name = str(key)[:100]
            out[name] = REDACTED if _SECRET_NAME.search(name) else cut(item, depth + 1)
        return out
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return "…"
        items = [cut(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"… {len(value) - MAX_ITEMS} more")
        return items
    return value


def bounded(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (cut already) within :data:`MAX_DATA_BYTES` of JSON: the fields that fit, in
    order, and ``"truncated": true`` when some did not."""
    if len(json.dumps(data, ensure_ascii=False)) <= MAX_DATA_BYTES:
        return data
    out: dict[str, Any] = {"truncated": True}
    size = len('{"truncated": true}')
    for key, item in data.items():
        piece = len(json.dumps({key: item}, ensure_ascii=False))
        if size + piece > MAX_DATA_BYTES:
            continue
        out[key] = item
        size += piece
    return out


def parse_message(raw: bytes) -> tuple[str, str, dict[str, Any] | None]:
    """A JSON message's ``type`` (or Twilio's ``event``), summary and kept data."""
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "invalid", f"not JSON ({len(raw)} bytes)", None
    if not isinstance(parsed, dict):
        return "invalid", f"not a JSON object ({len(raw)} bytes)", None
    kind = parsed.get("type", parsed.get("event"))
    type_ = kind if isinstance(kind, str) else "unknown"
    data = bounded(cut(parsed))
    return type_[:100], summarise(data), data


def summarise(data: dict[str, Any]) -> str:
    for name in _SUMMARY_FIELDS:
        value = data.get(name)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            text = f"{name}: {value}"
            return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS] + "…"
    return ""


class Timeline:
    """Entries numbered from 1, at most ``limit`` of them."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=limit)
        self.seq = 0
        self.dropped = 0

    def add(
        self,
        ms: int,
        dir_: str | None,
        kind: str,
        type_: str,
        summary: str,
        data: dict[str, Any] | None,
    ) -> None:
        if len(self._entries) == self._entries.maxlen:
            self.dropped += 1
        self.seq += 1
        self._entries.append(
            {
                "seq": self.seq,
                "ms": ms,
                "dir": dir_,
                "kind": kind,
                "type": type_,
                "summary": summary,
                "data": data,
            }
        )

    def after(self, seq: int) -> list[dict[str, Any]]:
        """The entries numbered above ``seq``, oldest first."""
        entries = self._entries
        if not entries:
            return []
        first = entries[0]["seq"]
        start = max(0, seq - first + 1)
        return [entries[i] for i in range(start, len(entries))]

    def __len__(self) -> int:
        return len(self._entries)
