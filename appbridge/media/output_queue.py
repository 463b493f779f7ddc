"""The one real-time output queue of a call.

Theory of operation (docs/protocol-session-v1.md, "Output: speech, files, audio and marks"):
`speak`, `play` and the app's own binary audio share one queue played in real time; new entries
queue behind earlier ones. The queue holds audio already encoded in the carrier's codec and knows
nothing of codecs or time: the process-wide media clock calls `pull_frame()` once per tick (20 ms)
and sends what it gets. Virtual time in tests is simply the count of pulls.

Entries, played first in, first out:

- *items* (`speak`/`play`): created open and empty when the command arrives, so their place is
  kept while the TTS or the HTTP fetch fills them (`append_audio`, `append_words`), then closed.
  An item reports `OutputStarted` with its first frame, then exactly one of `OutputDone` or
  `OutputInterrupted`.
- *raw audio* from the app's binary frames: never reported (it has no id);
  consecutive raw audio coalesces into one entry.
- *marks*: `MarkReached(cleared=False)` once everything queued before the mark was heard, or
  `MarkReached(cleared=True)` when `clear` dropped it.

"Heard" is one tick late on purpose: the frame pulled on tick N is on the wire during tick N, so
an item's `OutputDone` and the marks behind it fire on the first pull after its last frame.

Performance: `pull_frame` is O(1) and allocates at most the frame it returns (none when a stored
chunk is exactly one frame). Audio is kept as the immutable chunks it arrived in, with a read
cursor; consumed chunks are dropped in amortised O(1) batches (looping items keep theirs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

__all__ = [
    "MarkReached",
    "OutputDone",
    "OutputEvent",
    "OutputInterrupted",
    "OutputQueue",
    "OutputStarted",
    "QueueFull",
    "WordTiming",
    "heard_text",
]

#: Consumed chunks are dropped once at least this many have piled up and they are at least half
#: of the chunk list, which keeps the work per read amortised O(1).
_COMPACT_MIN_CHUNKS: Final = 32


class QueueFull(Exception):
    """Storing the chunk would queue more than the limit (`queue_full`: 120 s)."""


@dataclass(frozen=True, slots=True)
class WordTiming:
    """One spoken word, timed from the item's first byte of audio (for `heardText`)."""

    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class OutputStarted:
    """`output.started`: the item's first frame went out."""

    item_id: str


@dataclass(frozen=True, slots=True)
class OutputDone:
    """`output.done`: every frame of the item was heard. ``words`` are the item's timings, kept
    so that a `clear` landing before the far end played the item's tail can still report what
    was heard of it (``media/pacing.py``, ``HeardLine``)."""

    item_id: str
    heard_ms: int
    words: Sequence[WordTiming] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class OutputInterrupted:
    """`output.interrupted`: cut off by `clear`, `preempt` or a failure; 0 ms if never started."""

    item_id: str
    heard_ms: int
    heard_text: str


@dataclass(frozen=True, slots=True)
class MarkReached:
    """`mark { name, cleared }`."""

    name: str
    cleared: bool


OutputEvent: TypeAlias = OutputStarted | OutputDone | OutputInterrupted | MarkReached


def heard_text(words: Sequence[WordTiming], heard_ms: int) -> str:
    """`heardText`: the words spoken completely within the first ``heard_ms`` of an item."""
    if heard_ms <= 0:
        return ""
    return " ".join(
        text for word in words if word.end_ms <= heard_ms and (text := word.text.strip())
    )


class _Audio:
    """Append-only audio as the chunks it arrived in, with a read cursor."""

    __slots__ = ("chunks", "idx", "keep", "off", "remaining_bytes", "total_bytes")

    def __init__(self, keep: bool) -> None:
        self.chunks: list[bytes] = []
        self.idx = 0  # chunk being read
        self.off = 0  # read offset inside it
        self.keep = keep  # a looping item rewinds, so it keeps what was read
        self.total_bytes = 0
        self.remaining_bytes = 0

    def append(self, data: bytes) -> None:
        self.chunks.append(data)
        self.total_bytes += len(data)
        self.remaining_bytes += len(data)

    def _advance_chunk(self) -> None:
        self.idx += 1
        self.off = 0
        if not self.keep and self.idx >= _COMPACT_MIN_CHUNKS and 2 * self.idx >= len(self.chunks):
            del self.chunks[: self.idx]
            self.idx = 0

    def read(self, n_bytes: int) -> bytes:
        """Reads up to `n_bytes`; the caller makes sure something remains."""
        chunk = self.chunks[self.idx]
        off = self.off
        avail = len(chunk) - off
        if avail > n_bytes:
            self.off = off + n_bytes
            out = chunk[off : off + n_bytes]
        elif avail == n_bytes:
            out = chunk if off == 0 else chunk[off:]
            self._advance_chunk()
        else:
            parts = [chunk[off:]]
            got = avail
            self._advance_chunk()
            while got < n_bytes and self.idx < len(self.chunks):
                chunk = self.chunks[self.idx]
                need = n_bytes - got
                if len(chunk) > need:
                    parts.append(chunk[:need])
                    self.off = need
                    got = n_bytes
                else:
                    parts.append(chunk)
                    got += len(chunk)
                    self._advance_chunk()
            out = b"".join(parts)
        self.remaining_bytes -= len(out)
        return out

    def rewind(self) -> None:
        self.idx = 0
        self.off = 0
        self.remaining_bytes = self.total_bytes


class _Item:
    __slots__ = ("audio", "closed", "frames_pulled", "item_id", "loop", "started", "words")

    def __init__(self, item_id: str, loop: bool) -> None:
        self.item_id = item_id
        self.loop = loop
        self.audio = _Audio(keep=loop)
        self.closed = False
        self.started = False
        self.frames_pulled = 0
        self.words: list[WordTiming] = []


class _Raw:
    __slots__ = ("audio",)

    def __init__(self) -> None:
        self.audio = _Audio(keep=False)


class _Mark:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_Entry: TypeAlias = _Item | _Raw | _Mark


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    # Stored chunks must be immutable: the caller may reuse its buffer.
    return data if type(data) is bytes else bytes(data)


class OutputQueue:
    """One call's output queue (docs/protocol-session-v1.md, "Output events"); sans-I/O,
    frame-driven.

    Every mutating method returns the events it caused, in the order they happened, except the
    `append_*` methods, which only store data and return whether they did.
    """

    def __init__(
        self,
        frame_bytes: int,
        silence_frame: bytes,
        frame_ms: int = 20,
        max_queued_ms: int = 120_000,
    ) -> None:
        if frame_bytes <= 0 or frame_ms <= 0:
            raise ValueError("frame_bytes and frame_ms must be positive")
        if len(silence_frame) != frame_bytes:
            raise ValueError(
                f"silence_frame has {len(silence_frame)} bytes, expected {frame_bytes}"
            )
        if max_queued_ms < 0:
            raise ValueError("max_queued_ms must not be negative")
        self._frame_bytes = frame_bytes
        self._frame_ms = frame_ms
        self._silence = bytes(silence_frame)
        self._max_queued_ms = max_queued_ms
        self._max_queued_bytes = max_queued_ms * frame_bytes // frame_ms
        self._entries: deque[_Entry] = deque()
        self._items: dict[str, _Item] = {}
        self._queued_bytes = 0
        self._frames_pulled = 0
        self._underrun_frames = 0
        self._raw_dropped_bytes = 0

    # -- read-only state ------------------------------------------------------------------

    @property
    def frame_bytes(self) -> int:
        return self._frame_bytes

    @property
    def frame_ms(self) -> int:
        return self._frame_ms

    @property
    def silence_frame(self) -> bytes:
        return self._silence

    @property
    def max_queued_ms(self) -> int:
        return self._max_queued_ms

    @property
    def is_empty(self) -> bool:
        return not self._entries

    @property
    def head_item_id(self) -> str | None:
        """The item now playing or waiting at the head for its audio; None for raw audio."""
        if self._entries:
            head = self._entries[0]
            if type(head) is _Item:
                return head.item_id
        return None

    def has_item(self, item_id: str) -> bool:
        return item_id in self._items

    def item_audio_ms(self, item_id: str) -> int | None:
        """Length of the audio stored so far for the item (all of it, played or not); None if
        there is no such item. A streamed `speak` times its next piece's words from here."""
        item = self._items.get(item_id)
        return None if item is None else self._duration_ms(item)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def queued_ms(self) -> int:
        """Unplayed audio across all entries; a looping item counts what is left of this pass."""
        return self._queued_bytes * self._frame_ms // self._frame_bytes

    @property
    def frames_pulled(self) -> int:
        """Pulls that returned a frame (audio, padded audio or silence)."""
        return self._frames_pulled

    @property
    def underrun_frames(self) -> int:
        """Silence frames sent because a started, still open item had no audio ready."""
        return self._underrun_frames

    @property
    def raw_dropped_bytes(self) -> int:
        """Raw app audio thrown away unplayed by `clear` or `preempt`."""
        return self._raw_dropped_bytes

    # -- items ----------------------------------------------------------------------------

    def add_item(
        self, item_id: str, *, loop: bool = False, preempt: bool = False
    ) -> list[OutputEvent]:
        """Queues an open, empty item, keeping its place from the moment its command arrived.

        With `preempt`, the head entry is cut off (an item reports `OutputInterrupted`, raw audio is
        dropped silently) and the new item plays first; everything behind stays queued
        (docs/protocol-session-v1.md, ``preempt``). Raises ValueError when `item_id` is already
        queued.
        """
        if item_id in self._items:
            raise ValueError(f"item {item_id!r} is already queued")
        item = _Item(item_id, loop)
        self._items[item_id] = item
        entries = self._entries
        if not preempt or not entries:
            entries.append(item)
            return []
        events: list[OutputEvent] = []
        head = entries[0]
        if type(head) is _Item:
            entries.popleft()
            del self._items[head.item_id]
            self._queued_bytes -= head.audio.remaining_bytes
            events.append(self._interrupted(head))
        elif type(head) is _Raw:
            entries.popleft()
            self._drop_raw(head)
        entries.appendleft(item)
        return events

    def append_audio(self, item_id: str, data: bytes | bytearray | memoryview) -> bool:
        """Adds audio to an open item; False when the item is gone (cleared): drop the data.

        Raises `QueueFull` (storing nothing) if the chunk would queue more than
        `max_queued_ms`, and ValueError if the item was already closed.
        """
        item = self._items.get(item_id)
        if item is None:
            return False
        if item.closed:
            raise ValueError(f"item {item_id!r} is closed")
        if data:
            self._reserve(len(data))
            item.audio.append(_as_bytes(data))
        return True

    def append_words(self, item_id: str, words: Sequence[WordTiming]) -> bool:
        """Adds word timings (relative to the item's first audio byte); False if no such item."""
        item = self._items.get(item_id)
        if item is None:
            return False
        item.words.extend(words)
        return True

    def close_item(self, item_id: str) -> list[OutputEvent]:
        """No more audio will come for the item; it ends once what it has was heard.

        Returns no events today (completion is seen by `pull_frame`); it returns a list so
        every mutation is handled alike. Unknown items are ignored.
        """
        item = self._items.get(item_id)
        if item is not None:
            item.closed = True
        return []

    def discard_item(self, item_id: str) -> list[OutputEvent]:
        """Removes a failed item (e.g. the `play` fetch failed).

        A started item reports `OutputInterrupted`; one that never started vanishes silently
        (the caller reports the failure itself, e.g. `play_fetch_failed`). Marks that it was
        the last thing in front of fire now.
        """
        item = self._items.pop(item_id, None)
        if item is None:
            return []
        was_head = self._entries[0] is item
        self._entries.remove(item)
        self._queued_bytes -= item.audio.remaining_bytes
        events: list[OutputEvent] = []
        if item.started:
            events.append(self._interrupted(item))
        if was_head:
            self._fire_head_marks(events)
        return events

    # -- raw audio and marks ----------------------------------------------------------------

    def append_raw(self, data: bytes | bytearray | memoryview) -> bool:
        """Queues the app's own audio; extends the tail entry when it is raw audio too.

        Returns False only for empty data (nothing stored). Raises `QueueFull` (storing
        nothing) if the chunk would queue more than `max_queued_ms`.
        """
        if not data:
            return False
        self._reserve(len(data))
        entries = self._entries
        tail = entries[-1] if entries else None
        if type(tail) is not _Raw:
            tail = _Raw()
            entries.append(tail)
        tail.audio.append(_as_bytes(data))
        return True

    def add_mark(self, name: str) -> list[OutputEvent]:
        """Queues a mark; on an empty queue it is reached at once."""
        if not self._entries:
            return [MarkReached(name, cleared=False)]
        self._entries.append(_Mark(name))
        return []

    # -- clear ------------------------------------------------------------------------------

    def clear(self, unheard: Mapping[str, int] | None = None) -> list[OutputEvent]:
        """Empties the queue (docs/protocol-session-v1.md, ``clear``), reporting every item and mark
        in queue order.

        The head item reports what was heard of it; items that never started report 0 ms and
        "" ; marks report `cleared=True`; raw audio is dropped silently. ``unheard`` counts, by
        item id, frames already pulled that the far end will now never play (a carrier's
        lead, dropped with the queue): they do not count as heard.
        """
        events: list[OutputEvent] = []
        for entry in self._entries:
            if isinstance(entry, _Item):
                lost = unheard.get(entry.item_id, 0) if unheard else 0
                events.append(self._interrupted(entry, lost))
            elif isinstance(entry, _Mark):
                events.append(MarkReached(entry.name, cleared=True))
            else:
                self._drop_raw(entry)
        self._entries.clear()
        self._items.clear()
        self._queued_bytes = 0
        return events

    # -- the media clock tick ----------------------------------------------------------------

    def pull_frame(self) -> tuple[bytes | None, list[OutputEvent]]:
        """Returns the frame to send on this tick, or None when there is nothing to play.

        First retires what was heard: an item whose audio was all pulled on an earlier tick
        and that is closed reports `OutputDone` (a looping one rewinds instead), drained raw
        audio goes, and marks that come to the head fire. Then the head plays: a full frame; a
        closed tail shorter than a frame, padded with silence; or the silence frame while an
        open item waits for audio (an underrun once the item has started).
        """
        events: list[OutputEvent] = []
        entries = self._entries
        fb = self._frame_bytes
        while entries:
            head = entries[0]
            if isinstance(head, _Mark):
                entries.popleft()
                events.append(MarkReached(head.name, cleared=False))
                continue
            audio = head.audio
            remaining = audio.remaining_bytes
            if isinstance(head, _Raw):
                if remaining == 0:
                    entries.popleft()
                    continue
                frame = self._read_frame(audio)
                self._frames_pulled += 1
                return frame, events
            if remaining == 0 and head.closed:
                if audio.total_bytes == 0:
                    # An empty item (an empty last `speak`): heard at once, in zero time.
                    entries.popleft()
                    del self._items[head.item_id]
                    events.append(OutputStarted(head.item_id))
                    events.append(OutputDone(head.item_id, 0))
                    continue
                if not head.loop:
                    entries.popleft()
                    del self._items[head.item_id]
                    events.append(OutputDone(head.item_id, self._duration_ms(head), head.words))
                    continue
                audio.rewind()
                self._queued_bytes += audio.total_bytes
                remaining = audio.remaining_bytes
            if remaining >= fb or (remaining and head.closed):
                frame = self._read_frame(audio)
                if not head.started:
                    head.started = True
                    events.append(OutputStarted(head.item_id))
                head.frames_pulled += 1
                self._frames_pulled += 1
                return frame, events
            # Open and short of a frame: wait for the TTS or the fetch.
            if head.started:
                self._underrun_frames += 1
            self._frames_pulled += 1
            return self._silence, events
        return None, events

    # -- internals ----------------------------------------------------------------------------

    def _read_frame(self, audio: _Audio) -> bytes:
        frame = audio.read(self._frame_bytes)
        self._queued_bytes -= len(frame)
        if len(frame) < self._frame_bytes:
            frame += self._silence[len(frame) :]
        return frame

    def _reserve(self, n_bytes: int) -> None:
        if self._queued_bytes + n_bytes > self._max_queued_bytes:
            raise QueueFull(
                f"queueing {n_bytes} more bytes would exceed {self._max_queued_ms} ms of output"
            )
        self._queued_bytes += n_bytes

    def _drop_raw(self, raw: _Raw) -> None:
        self._raw_dropped_bytes += raw.audio.remaining_bytes
        self._queued_bytes -= raw.audio.remaining_bytes

    def _duration_ms(self, item: _Item) -> int:
        return item.audio.total_bytes * self._frame_ms // self._frame_bytes

    def _interrupted(self, item: _Item, unheard_frames: int = 0) -> OutputInterrupted:
        heard_ms = max(0, item.frames_pulled - unheard_frames) * self._frame_ms
        if not item.loop:
            heard_ms = min(heard_ms, self._duration_ms(item))
        return OutputInterrupted(item.item_id, heard_ms, heard_text(item.words, heard_ms))

    def _fire_head_marks(self, events: list[OutputEvent]) -> None:
        entries = self._entries
        while entries and type(entries[0]) is _Mark:
            mark = entries.popleft()
            assert type(mark) is _Mark
            events.append(MarkReached(mark.name, cleared=False))
