"""The output queue (appbridge.media.output_queue); virtual time is the count of pulls."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from appbridge.media.codecs import PCMU_8K
from appbridge.media.output_queue import (
    MarkReached,
    OutputDone,
    OutputEvent,
    OutputInterrupted,
    OutputQueue,
    OutputStarted,
    QueueFull,
    WordTiming,
)

FB = PCMU_8K.frame_bytes()  # 160 bytes = 20 ms of 8 kHz µ-law
SILENCE = PCMU_8K.silence(20)


def _queue(max_queued_ms: int = 120_000) -> OutputQueue:
    return OutputQueue(FB, SILENCE, frame_ms=20, max_queued_ms=max_queued_ms)


def _frames(n: int, value: int = 1) -> bytes:
    return bytes((value,)) * (FB * n)


def _item(q: OutputQueue, item_id: str, n_frames: int, value: int = 1, **kw: bool) -> None:
    assert q.add_item(item_id, **kw) == []
    if n_frames:
        assert q.append_audio(item_id, _frames(n_frames, value))
    assert q.close_item(item_id) == []


# -- construction ------


def test_constructor_checks_the_silence_frame() -> None:
    with pytest.raises(ValueError, match="silence_frame"):
        OutputQueue(FB, SILENCE[:-1])
    with pytest.raises(ValueError):
        OutputQueue(0, b"")


def test_empty_queue_pulls_nothing() -> None:
    q = _queue()
    assert q.is_empty
    assert q.pull_frame() == (None, [])
    assert q.frames_pulled == 0
    assert q.head_item_id is None


# -- started / done timing ------


def test_item_started_with_first_frame_done_one_tick_after_last() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(1, 1) + _frames(1, 2) + _frames(1, 3))
    q.close_item("a")
    assert q.head_item_id == "a"
    assert q.queued_ms == 60
    assert q.pull_frame() == (_frames(1, 1), [OutputStarted("a")])
    assert q.pull_frame() == (_frames(1, 2), [])
    assert q.pull_frame() == (_frames(1, 3), [])
    assert q.queued_ms == 0
    assert q.has_item("a")  # the last frame is only now on the wire
    assert q.pull_frame() == (None, [OutputDone("a", 60)])
    assert q.is_empty
    assert not q.has_item("a")
    assert q.frames_pulled == 3


def test_next_item_starts_on_the_tick_the_previous_is_done() -> None:
    q = _queue()
    _item(q, "a", 1, 1)
    _item(q, "b", 1, 2)
    assert q.pull_frame() == (_frames(1, 1), [OutputStarted("a")])
    assert q.pull_frame() == (_frames(1, 2), [OutputDone("a", 20), OutputStarted("b")])
    assert q.pull_frame() == (None, [OutputDone("b", 20)])


def test_done_heard_ms_is_the_audio_duration_with_a_padded_tail() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", b"\x07" * (FB + FB // 2))  # 30 ms
    q.close_item("a")
    assert q.pull_frame()[0] == b"\x07" * FB
    assert q.pull_frame()[0] == b"\x07" * (FB // 2) + SILENCE[: FB // 2]
    assert q.pull_frame() == (None, [OutputDone("a", 30)])


def test_closed_empty_item_starts_and_finishes_at_once() -> None:
    q = _queue()
    _item(q, "empty", 0)
    _item(q, "b", 1, 9)
    assert q.pull_frame() == (
        _frames(1, 9),
        [OutputStarted("empty"), OutputDone("empty", 0), OutputStarted("b")],
    )
    q2 = _queue()
    _item(q2, "empty", 0)
    assert q2.pull_frame() == (None, [OutputStarted("empty"), OutputDone("empty", 0)])


def test_open_item_without_audio_holds_its_place_with_silence() -> None:
    q = _queue()
    q.add_item("a")
    _item(q, "b", 1, 2)
    assert q.pull_frame() == (SILENCE, [])  # not started: nothing heard yet
    assert q.underrun_frames == 0  # waiting for the first audio is not an underrun
    q.append_audio("a", _frames(1, 1))
    q.close_item("a")
    assert q.pull_frame() == (_frames(1, 1), [OutputStarted("a")])
    assert q.pull_frame() == (_frames(1, 2), [OutputDone("a", 20), OutputStarted("b")])


def test_streaming_item_starved_then_resumed() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(1, 1))
    assert q.pull_frame() == (_frames(1, 1), [OutputStarted("a")])
    assert q.pull_frame() == (SILENCE, [])
    assert q.pull_frame() == (SILENCE, [])
    assert q.underrun_frames == 2
    q.append_audio("a", _frames(1, 2) + b"\x03" * (FB // 2))
    assert q.pull_frame() == (_frames(1, 2), [])
    assert q.pull_frame() == (SILENCE, [])  # half a frame: wait for more while open
    assert q.underrun_frames == 3
    q.append_audio("a", b"\x03" * (FB // 2))
    assert q.pull_frame() == (b"\x03" * FB, [])
    q.close_item("a")
    assert q.pull_frame() == (None, [OutputDone("a", 60)])
    assert q.frames_pulled == 6


def test_frame_sized_chunks_are_returned_without_copying() -> None:
    q = _queue()
    q.add_item("a")
    chunk = _frames(1, 5)
    q.append_audio("a", chunk)
    frame, _ = q.pull_frame()
    assert frame is chunk


def test_many_small_chunks_play_in_order() -> None:
    q = _queue()
    q.add_item("a")
    pieces = [bytes((i % 251,)) * 7 for i in range(1000)]
    for piece in pieces:
        q.append_audio("a", bytearray(piece))
    q.close_item("a")
    out = b""
    while True:
        frame, _ = q.pull_frame()
        if frame is None:
            break
        assert len(frame) == FB
        out += frame
    expected = b"".join(pieces)
    assert out[: len(expected)] == expected
    assert out[len(expected) :] == SILENCE[: len(out) - len(expected)]


def test_append_to_closed_item_is_a_bug() -> None:
    q = _queue()
    _item(q, "a", 1)
    with pytest.raises(ValueError, match="closed"):
        q.append_audio("a", b"\x00")


def test_duplicate_item_id_is_refused() -> None:
    q = _queue()
    q.add_item("a")
    with pytest.raises(ValueError, match="already queued"):
        q.add_item("a")


def test_item_audio_ms() -> None:
    q = _queue()
    q.add_item("a")
    assert q.item_audio_ms("a") == 0
    q.append_audio("a", _frames(3))
    q.pull_frame()
    assert q.item_audio_ms("a") == 60  # played or not
    assert q.item_audio_ms("nope") is None


# -- marks ------


def test_mark_on_empty_queue_fires_at_once() -> None:
    q = _queue()
    assert q.add_mark("m") == [MarkReached("m", cleared=False)]
    assert q.is_empty


def test_mark_after_item_fires_one_tick_after_its_last_frame() -> None:
    q = _queue()
    _item(q, "a", 2)
    assert q.add_mark("m") == []
    assert q.pull_frame()[1] == [OutputStarted("a")]
    assert q.pull_frame()[1] == []
    assert q.pull_frame() == (None, [OutputDone("a", 40), MarkReached("m", False)])


def test_marks_between_items_and_after_raw_audio() -> None:
    q = _queue()
    q.append_raw(_frames(1, 1))
    q.add_mark("m1")
    _item(q, "a", 1, 2)
    q.add_mark("m2")
    q.add_mark("m3")
    assert q.pull_frame() == (_frames(1, 1), [])
    assert q.pull_frame() == (_frames(1, 2), [MarkReached("m1", False), OutputStarted("a")])
    assert q.pull_frame() == (
        None,
        [OutputDone("a", 20), MarkReached("m2", False), MarkReached("m3", False)],
    )


def test_mark_waits_for_a_drained_item_that_is_still_open() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(1))
    q.add_mark("m")
    q.pull_frame()
    assert q.pull_frame() == (SILENCE, [])
    q.close_item("a")
    assert q.pull_frame() == (None, [OutputDone("a", 20), MarkReached("m", False)])


# -- clear ------


def test_clear_reports_everything_in_queue_order() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(5))
    q.append_words("a", [WordTiming(0, 30, "hello"), WordTiming(30, 90, "there")])
    q.add_mark("m1")
    q.add_item("b")
    q.append_raw(b"\x02" * 300)
    q.add_mark("m2")
    _item(q, "c", 2)
    q.pull_frame()
    q.pull_frame()
    assert q.clear() == [
        OutputInterrupted("a", 40, "hello"),
        MarkReached("m1", cleared=True),
        OutputInterrupted("b", 0, ""),
        MarkReached("m2", cleared=True),
        OutputInterrupted("c", 0, ""),
    ]
    assert q.raw_dropped_bytes == 300
    assert q.is_empty
    assert q.queued_ms == 0
    assert not q.has_item("a")
    assert q.pull_frame() == (None, [])
    assert q.append_audio("a", _frames(1)) is False  # the TTS drops what comes late


def test_clear_of_a_fully_pulled_item_reports_it_interrupted() -> None:
    q = _queue()
    _item(q, "a", 1)
    q.pull_frame()
    assert q.clear() == [OutputInterrupted("a", 20, "")]


def test_clear_on_empty_queue() -> None:
    assert _queue().clear() == []


# -- preempt ------


def test_preempt_interrupts_the_head_and_keeps_the_rest_in_order() -> None:
    q = _queue()
    _item(q, "a", 3, 1)
    q.append_words("a", [WordTiming(0, 20, "one"), WordTiming(20, 40, "two")])
    q.add_mark("m")
    _item(q, "b", 1, 2)
    q.pull_frame()
    assert q.add_item("p", preempt=True) == [OutputInterrupted("a", 20, "one")]
    assert q.head_item_id == "p"
    assert not q.has_item("a")
    q.append_audio("p", _frames(1, 3))
    q.close_item("p")
    assert q.pull_frame() == (_frames(1, 3), [OutputStarted("p")])
    assert q.pull_frame() == (
        _frames(1, 2),
        [OutputDone("p", 20), MarkReached("m", False), OutputStarted("b")],
    )
    assert q.pull_frame() == (None, [OutputDone("b", 20)])


def test_preempt_interrupts_a_head_item_still_waiting_for_audio() -> None:
    q = _queue()
    q.add_item("a")
    q.pull_frame()
    assert q.add_item("p", preempt=True) == [OutputInterrupted("a", 0, "")]


def test_preempt_drops_raw_audio_at_the_head_silently() -> None:
    q = _queue()
    q.append_raw(_frames(3, 1))
    _item(q, "b", 1, 2)
    q.pull_frame()
    assert q.add_item("p", preempt=True) == []
    assert q.raw_dropped_bytes == 2 * FB
    q.append_audio("p", _frames(1, 3))
    q.close_item("p")
    assert q.pull_frame() == (_frames(1, 3), [OutputStarted("p")])
    assert q.pull_frame() == (_frames(1, 2), [OutputDone("p", 20), OutputStarted("b")])


def test_preempt_on_empty_queue_just_queues() -> None:
    q = _queue()
    assert q.add_item("p", preempt=True) == []
    assert q.head_item_id == "p"


# -- loop ------


def test_loop_rewinds_until_cleared() -> None:
    q = _queue()
    q.add_item("music", loop=True)
    q.append_audio("music", _frames(1, 1) + _frames(1, 2))
    q.append_words("music", [WordTiming(0, 40, "la")])
    q.close_item("music")
    assert q.pull_frame() == (_frames(1, 1), [OutputStarted("music")])
    assert q.pull_frame() == (_frames(1, 2), [])
    assert q.queued_ms == 0
    for _ in range(3):
        assert q.pull_frame() == (_frames(1, 1), [])
        assert q.queued_ms == 20  # a loop counts what is left of this pass, once
        assert q.pull_frame() == (_frames(1, 2), [])
    assert q.pull_frame() == (_frames(1, 1), [])
    assert q.clear() == [OutputInterrupted("music", 180, "la")]


def test_loop_of_nothing_ends_at_once() -> None:
    q = _queue()
    _item(q, "music", 0, loop=True)
    assert q.pull_frame() == (None, [OutputStarted("music"), OutputDone("music", 0)])


# -- heard_text ------


@pytest.mark.parametrize(
    ("pulls", "heard_ms", "text"),
    [
        (0, 0, ""),
        (9, 180, ""),
        (10, 200, "hello"),
        (19, 380, "hello"),
        (20, 400, "hello big"),
        (30, 600, "hello big world"),
    ],
)
def test_heard_text_boundaries(pulls: int, heard_ms: int, text: str) -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(30))
    words = [
        WordTiming(0, 200, "hello"),
        WordTiming(200, 400, " big "),
        WordTiming(400, 600, "world"),
    ]
    assert q.append_words("a", words)
    for _ in range(pulls):
        q.pull_frame()
    assert q.clear() == [OutputInterrupted("a", heard_ms, text)]


def test_heard_ms_is_capped_at_the_audio_length() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", b"\x01" * (FB + FB // 2))
    q.close_item("a")
    q.pull_frame()
    q.pull_frame()
    assert q.clear() == [OutputInterrupted("a", 30, "")]


def test_append_words_to_unknown_item() -> None:
    assert _queue().append_words("x", [WordTiming(0, 1, "x")]) is False


# -- discard ------


def test_discard_unstarted_item_is_silent() -> None:
    q = _queue()
    _item(q, "a", 1)
    q.add_item("b")
    assert q.discard_item("b") == []
    assert not q.has_item("b")
    assert q.append_audio("b", _frames(1)) is False
    assert q.discard_item("nope") == []


def test_discard_started_head_reports_interrupted_and_releases_marks() -> None:
    q = _queue()
    q.add_item("a")
    q.append_audio("a", _frames(1))
    q.add_mark("m")
    _item(q, "b", 1)
    q.pull_frame()
    assert q.discard_item("a") == [OutputInterrupted("a", 20, ""), MarkReached("m", False)]
    assert q.head_item_id == "b"


def test_discard_waiting_head_releases_marks() -> None:
    q = _queue()
    q.add_item("a")
    q.add_mark("m")
    assert q.discard_item("a") == [MarkReached("m", False)]
    assert q.is_empty


# -- raw audio ------


def test_raw_audio_coalesces_and_pads_its_tail() -> None:
    q = _queue()
    assert q.append_raw(b"\x01" * 100)
    assert q.append_raw(b"\x02" * 100)
    assert q.queued_ms == 25
    assert q.pull_frame() == (b"\x01" * 100 + b"\x02" * 60, [])
    assert q.pull_frame() == (b"\x02" * 40 + SILENCE[40:], [])
    assert q.pull_frame() == (None, [])
    assert q.append_raw(b"") is False


def test_raw_audio_extended_between_pulls_keeps_playing() -> None:
    q = _queue()
    q.append_raw(_frames(1, 1))
    assert q.pull_frame() == (_frames(1, 1), [])
    q.append_raw(_frames(1, 2))
    assert q.pull_frame() == (_frames(1, 2), [])


def test_raw_audio_on_either_side_of_an_item_stays_apart() -> None:
    q = _queue()
    q.append_raw(b"\x01" * 100)
    _item(q, "a", 1, 2)
    q.append_raw(b"\x03" * 100)
    assert q.pull_frame() == (b"\x01" * 100 + SILENCE[100:], [])
    assert q.pull_frame() == (_frames(1, 2), [OutputStarted("a")])
    assert q.pull_frame() == (b"\x03" * 100 + SILENCE[100:], [OutputDone("a", 20)])
    assert q.head_item_id is None


# -- the queue limit ------


def test_queue_full_at_120_seconds() -> None:
    q = _queue()
    q.add_item("a")
    one_minute = _frames(3000)
    assert q.append_audio("a", one_minute)
    assert q.append_audio("a", one_minute)
    assert q.queued_ms == 120_000
    with pytest.raises(QueueFull):
        q.append_audio("a", b"\x00")
    with pytest.raises(QueueFull):
        q.append_raw(b"\x00")
    assert q.queued_ms == 120_000
    assert q.item_audio_ms("a") == 120_000  # nothing of the refused chunks was stored
    q.pull_frame()
    with pytest.raises(QueueFull):
        q.append_raw(_frames(1) + b"\x00")
    assert q.append_raw(_frames(1))
    assert q.queued_ms == 120_000


def test_clear_frees_the_limit() -> None:
    q = _queue(max_queued_ms=100)
    q.append_raw(_frames(5))
    with pytest.raises(QueueFull):
        q.append_raw(b"\x00")
    q.clear()
    assert q.append_raw(_frames(5))


# -- property: every item and mark is reported exactly once ------


class QueueMachine(RuleBasedStateMachine):
    """Random command sequences; item ids are picked by index from those added so far."""

    def __init__(self) -> None:
        super().__init__()
        self.q = _queue(max_queued_ms=400)
        self.n = 0
        self.ids: list[str] = []
        self.open_ids: list[str] = []
        self.started: set[str] = set()
        self.ended: dict[str, OutputEvent] = {}
        self.discarded_unstarted: set[str] = set()
        self.marks_added: list[str] = []
        self.marks_reached: dict[str, bool] = {}
        self.added_before_mark: dict[str, set[str]] = {}

    def _take(self, events: list[OutputEvent]) -> None:
        for ev in events:
            if isinstance(ev, OutputStarted):
                assert ev.item_id not in self.started
                assert ev.item_id not in self.ended
                self.started.add(ev.item_id)
            elif isinstance(ev, OutputDone | OutputInterrupted):
                assert ev.item_id in self.ids
                assert ev.item_id not in self.ended, f"{ev.item_id} reported twice"
                if isinstance(ev, OutputDone):
                    assert ev.item_id in self.started
                elif ev.item_id not in self.started:
                    assert (ev.heard_ms, ev.heard_text) == (0, "")
                self.ended[ev.item_id] = ev
            else:
                assert ev.name not in self.marks_reached, f"mark {ev.name} reported twice"
                if not ev.cleared:
                    resolved = set(self.ended) | self.discarded_unstarted
                    assert self.added_before_mark[ev.name] <= resolved
                self.marks_reached[ev.name] = ev.cleared

    def _new_name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    @staticmethod
    def _pick(ids: list[str], index: int) -> str | None:
        return ids[index % len(ids)] if ids else None

    @rule(loop=st.booleans(), preempt=st.booleans())
    def add_item(self, loop: bool, preempt: bool) -> None:
        item_id = self._new_name("i")
        self.ids.append(item_id)
        self.open_ids.append(item_id)
        self._take(self.q.add_item(item_id, loop=loop, preempt=preempt))

    @rule(index=st.integers(0, 99), n_bytes=st.integers(0, 500))
    def append_audio(self, index: int, n_bytes: int) -> None:
        item_id = self._pick(self.open_ids, index)
        if item_id is None:
            return
        before = self.q.queued_bytes
        try:
            stored = self.q.append_audio(item_id, b"\x11" * n_bytes)
        except QueueFull:
            assert self.q.queued_bytes == before
            return
        assert stored == self.q.has_item(item_id)

    @rule(index=st.integers(0, 99), words=st.integers(0, 3))
    def append_words(self, index: int, words: int) -> None:
        item_id = self._pick(self.ids, index)
        if item_id is None:
            return
        batch = [WordTiming(i * 20, i * 20 + 20, f"w{i}") for i in range(words)]
        assert self.q.append_words(item_id, batch) == self.q.has_item(item_id)

    @rule(index=st.integers(0, 99))
    def close(self, index: int) -> None:
        item_id = self._pick(self.open_ids, index)
        if item_id is None:
            return
        self.open_ids.remove(item_id)
        self._take(self.q.close_item(item_id))

    @rule(index=st.integers(0, 99))
    def discard(self, index: int) -> None:
        item_id = self._pick(self.ids, index)
        if item_id is None:
            return
        present = self.q.has_item(item_id)
        if present and item_id not in self.started:
            self.discarded_unstarted.add(item_id)  # before the marks it releases are checked
        events = self.q.discard_item(item_id)
        self._take(events)
        assert not self.q.has_item(item_id)
        if not present:
            assert events == []
        elif item_id in self.started:
            assert item_id in self.ended

    @rule()
    def add_mark(self) -> None:
        name = self._new_name("m")
        self.marks_added.append(name)
        self.added_before_mark[name] = set(self.ids)
        self._take(self.q.add_mark(name))

    @rule(n_bytes=st.integers(0, 400))
    def append_raw(self, n_bytes: int) -> None:
        try:
            self.q.append_raw(b"\x22" * n_bytes)
        except QueueFull:
            pass

    @rule()
    def clear(self) -> None:
        self._take(self.q.clear())
        assert self.q.is_empty

    @rule(ticks=st.integers(1, 8))
    def pull(self, ticks: int) -> None:
        for _ in range(ticks):
            frame, events = self.q.pull_frame()
            self._take(events)
            assert frame is None or len(frame) == FB

    @invariant()
    def accounting(self) -> None:
        assert 0 <= self.q.queued_bytes <= 400 * FB // 20
        for item_id in self.ids:
            # Still queued, or finished: never both.
            assert not (self.q.has_item(item_id) and item_id in self.ended)

    def teardown(self) -> None:
        self._take(self.q.clear())
        assert not any(self.q.has_item(item_id) for item_id in self.ids)
        assert set(self.marks_added) == set(self.marks_reached)
        # Every item was reported exactly once, except those discarded before they started.
        assert set(self.ids) - set(self.ended) == self.discarded_unstarted
        assert not self.discarded_unstarted & set(self.ended)


QueueMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_queue_state_machine = QueueMachine.TestCase


def test_discarded_unstarted_items_are_the_only_unreported_ones() -> None:
    q = _queue()
    _item(q, "a", 1)
    q.add_item("b")
    events = q.discard_item("b") + q.clear()
    assert events == [OutputInterrupted("a", 0, "")]
