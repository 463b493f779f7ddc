"""One call's timeline for the console: numbered entries in bounded rings, and the cutting of
messages down to what the console may keep (docs/operations.md, "The console and the softphone").

At most :data:`MAX_ENTRIES` entries are kept, of which :data:`SAMPLES_KEPT` levels and frame
counts, and messages within :data:`MAX_EVENT_BYTES`: a call's record stays small however long
it lasts. The oldest go first and are counted in ``dropped``. A message is kept parsed, with
its strings cut to :data:`MAX_STRING` characters and the whole to about :data:`MAX_DATA_BYTES`
of JSON. Nothing secret is kept: fields named like a
secret are blanked, URLs keep only scheme://host:port (net/plaintext.py ``redact_url``), and the
configured secrets are taken out of every string (logs.py ``redact``).
"""

from __future__ import annotations

import heapq
import json
import re
import sys
from array import array
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from appbridge.logs import REDACTED, redact
from appbridge.net.plaintext import redact_url
from appbridge.protocol import json_bounds
from appbridge.protocol.json_bounds import TOO_DEEP, JsonBodyError, top_level_strings

MAX_ENTRIES: Final = 2000
#: Of those, levels and frame counts: the last half minute or so (4 levels and up to 4 counts a
#: second), what the console's meters and audio lines show.
SAMPLES_KEPT: Final = 240
#: What the messages and state changes of one call may hold in all (their data, estimated).
MAX_EVENT_BYTES: Final = 256 * 1024
#: The estimated size of a kept message or state change besides its data and summary.
ENTRY_BYTES: Final = 160
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
        parsed = json_bounds.loads(raw)
    except JsonBodyError as exc:
        if str(exc) != TOO_DEEP:
            return "invalid", f"not JSON ({len(raw)} bytes)", None
        named = top_level_strings(raw, ("type", "event"))
        named_type = named.get("type", named.get("event", "invalid"))
        return named_type[:100], f"{TOO_DEEP} ({len(raw)} bytes)", None
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


#: The directions of frame counts, by their code in a :class:`SampleRing` (0 is a level).
_DIRS: Final = (None, "caller_in", "caller_out", "to_app", "from_app")
_DIR_CODES: Final = {d: n for n, d in enumerate(_DIRS) if d is not None}


class SampleRing:
    """The last ``size`` levels and frame counts in flat arrays: about 33 bytes each, and
    nothing for the garbage collector to walk."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._seq = array("q", bytes(8 * size))
        self._ms = array("q", bytes(8 * size))
        self._code = array("b", bytes(size))
        self._a = array("d", bytes(8 * size))
        self._b = array("d", bytes(8 * size))
        self._next = 0  # where the next sample goes
        self.count = 0

    def add(self, seq: int, ms: int, code: int, a: float, b: float) -> bool:
        """Store one; True when it replaced the oldest."""
        i = self._next
        self._seq[i], self._ms[i], self._code[i], self._a[i], self._b[i] = seq, ms, code, a, b
        self._next = (i + 1) % self.size
        full = self.count == self.size
        if not full:
            self.count += 1
        return full

    def newest_first(self) -> Iterator[tuple[int, int, int, float, float]]:
        for k in range(1, self.count + 1):
            i = (self._next - k) % self.size
            yield self._seq[i], self._ms[i], self._code[i], self._a[i], self._b[i]


def _sample_entry(seq: int, ms: int, code: int, a: float, b: float) -> dict[str, Any]:
    if code == 0:
        summary = f"in {a:.1f} dBFS, out {b:.1f} dBFS"
        data: dict[str, Any] = {"in_dbfs": a, "out_dbfs": b}
        return _entry(seq, ms, None, "level", "level", summary, data)
    frames, size = int(a), int(b)
    summary = f"{frames} frames, {size} bytes"
    return _entry(
        seq, ms, _DIRS[code], "audio", "frames", summary, {"frames": frames, "bytes": size}
    )


def _entry(
    seq: int, ms: int, dir_: str | None, kind: str, type_: str, summary: str, data: Any
) -> dict[str, Any]:
    return {
        "seq": seq,
        "ms": ms,
        "dir": dir_,
        "kind": kind,
        "type": type_,
        "summary": summary,
        "data": data,
    }


#: A message or state change as stored: (seq, ms, dir, kind, type, summary, data as JSON, size).
Event = tuple[int, int, str | None, str, str, str, bytes | None, int]


class Timeline:
    """Entries numbered from 1, at most ``limit`` of them, in two rings: messages and state
    changes (their data kept as compact JSON, within ``event_bytes``), and the frequent samples
    (levels and frame counts, at most ``samples_kept``, in a :class:`SampleRing`). A full ring
    drops its oldest entry, counted in ``dropped``."""

    def __init__(
        self,
        limit: int = MAX_ENTRIES,
        samples_kept: int = SAMPLES_KEPT,
        event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self._events: deque[Event] = deque(maxlen=limit - samples_kept)
        self._samples = SampleRing(samples_kept)
        self._event_bytes = 0
        self.event_bytes_limit = event_bytes
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
        """A message or a state change."""
        blob = None if data is None else json.dumps(data, separators=(",", ":")).encode()
        size = ENTRY_BYTES + len(summary) + (len(blob) if blob is not None else 0)
        events = self._events
        if len(events) == events.maxlen:
            self._drop_event()
        while events and self._event_bytes + size > self.event_bytes_limit:
            self._drop_event()
        self.seq += 1
        events.append((self.seq, ms, dir_, kind, sys.intern(type_), summary, blob, size))
        self._event_bytes += size

    def _drop_event(self) -> None:
        self._event_bytes -= self._events.popleft()[7]
        self.dropped += 1

    def add_level(self, ms: int, in_dbfs: float, out_dbfs: float) -> None:
        self.seq += 1
        self.dropped += self._samples.add(self.seq, ms, 0, in_dbfs, out_dbfs)

    def add_frames(self, ms: int, dir_: str, frames: int, size: int) -> None:
        self.seq += 1
        self.dropped += self._samples.add(self.seq, ms, _DIR_CODES[dir_], frames, size)

    def after(self, seq: int) -> list[dict[str, Any]]:
        """The entries numbered above ``seq``, oldest first."""
        events: list[dict[str, Any]] = []
        for number, ms, dir_, kind, type_, summary, blob, _ in reversed(self._events):
            if number <= seq:
                break
            data = json.loads(blob) if blob is not None else None
            events.append(_entry(number, ms, dir_, kind, type_, summary, data))
        samples: list[dict[str, Any]] = []
        for sample in self._samples.newest_first():
            if sample[0] <= seq:
                break
            samples.append(_sample_entry(*sample))
        events.reverse()
        samples.reverse()
        return list(heapq.merge(events, samples, key=lambda e: int(e["seq"])))

    def __len__(self) -> int:
        return len(self._events) + self._samples.count
