"""Barge-in rules (docs/turn-taking.md, "Barge-in"), in virtual time.

A partial transcript that may still grow into an acknowledgment ("I" of "I see") does not start
a turn; the endpointer's early partials come at the speech offsets asked for; a partial decode
is the quick one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

from appbridge.speech.providers.local_stt import LocalSttStream, Recognition, shared_whisper_engine
from appbridge.turn.backchannel import is_backchannel, may_become_backchannel, words_of
from appbridge.turn.detector import Backchannel, Phase, TurnDetector, UserStarted
from appbridge.turn.vad import Segmenter, Utterance
from tests.unit.test_local_stt import (
    SENTENCES,
    ScriptedSegmenter,
    needs_model,
    settle,
    silence,
    telephone_speech,
    to_16k,
    utterance,
)
from tests.unit.test_turn_detector import T0, Say, at, kinds, run


@pytest.mark.parametrize("text", ["I", "all", "got", "Yeah, I", "oh", "makes", "for"])
def test_prefixes_of_acknowledgments_may_become_one(text: str) -> None:
    assert may_become_backchannel(text, "en-US")


@pytest.mark.parametrize("text", ["I would", "cancel", "Can", "okay so", "", "yes"])
def test_other_starts_cannot(text: str) -> None:
    assert not may_become_backchannel(text, "en-US")


def test_full_acknowledgments_may_become_one_and_other_languages_use_their_list() -> None:
    assert may_become_backchannel("I see.", "en-GB")
    assert may_become_backchannel("de", "es-ES")  # "de acuerdo"
    assert not may_become_backchannel("de", "en-US")
    assert not may_become_backchannel("okay okay okay okay okay", "en-US")


def test_partial_prefix_of_an_acknowledgment_does_not_start_the_turn() -> None:
    det = TurnDetector(T0)
    events = run(det, [(0.5, 0.9)], [Say(0.7, "I", partial=True), Say(1.2, "I see.")])
    assert kinds(events) == ["Backchannel"]
    assert events[0] == (pytest.approx(1.2), Backchannel("I see."))
    assert det.phase is Phase.IDLE


def test_partial_that_grows_past_the_prefix_starts_the_turn_when_it_does() -> None:
    det = TurnDetector(T0)
    says = [Say(0.7, "I", partial=True), Say(0.9, "I would like", partial=True), Say(2.1, "x")]
    events = run(det, [(0.5, 2.0)], says)
    assert at(events, UserStarted) == [pytest.approx(0.9)]


def test_final_text_that_is_only_a_prefix_is_a_turn() -> None:
    # "I." as a final is a complete utterance: not an acknowledgment, so a turn.
    det = TurnDetector(T0)
    events = run(det, [(0.5, 0.9)], [Say(1.2, "I.")])
    assert at(events, UserStarted) == [pytest.approx(1.2)]


def test_guard_can_be_turned_off() -> None:
    det = TurnDetector(T0)
    det.guard_prefixes = False
    events = run(det, [(0.5, 0.9)], [Say(0.7, "I", partial=True), Say(1.2, "I see.")])
    assert at(events, UserStarted) == [pytest.approx(0.7)]


def test_segmenter_early_partials_at_the_offsets_then_every_second() -> None:
    speech = telephone_speech(SENTENCES[2])  # about 2.9 s
    audio = to_16k(silence(500) + speech + silence(1000))
    seg = Segmenter(early_partials_ms=(200, 400))
    out: list[Utterance] = []
    for i in range(0, len(audio), 640):
        out.extend(seg.feed(audio[i : i + 640]))
    finals = [u for u in out if u.final]
    partials = [u for u in out if not u.final]
    assert len(finals) == 1
    start = finals[0].start_ms
    # After about 200 and 400 ms of speech, counted with the 200 ms of audio kept before it.
    first, second = (p.end_ms - start for p in partials[:2])
    assert 360 <= first <= 480 and 560 <= second <= 720, (first, second)
    assert len(partials) >= 3
    assert all(finals[0].pcm16.startswith(p.pcm16) for p in partials)


# ---------------------------------------------------------------------------------------------
# The local STT's side: partials decoded as previews, short finals prompted with acknowledgments


class RecordingEngine:
    """Records whether each decode was asked as a final."""

    workers = 1
    backlog = 0

    def __init__(self) -> None:
        self.finals: list[bool] = []

    def submit(
        self, pcm16: bytes, hint_ids: Sequence[int], *, final: bool = True
    ) -> Future[Recognition]:
        self.finals.append(final)
        future: Future[Recognition] = Future()
        future.set_result(Recognition("", 0.0))
        return future


async def test_stream_asks_partials_as_previews_and_finals_in_full() -> None:
    engine = RecordingEngine()
    seg = ScriptedSegmenter()
    stream = LocalSttStream(engine, asyncio.get_running_loop(), "en-US", 16000, [], seg)
    seg.next = [utterance(0, False)]
    stream.feed(b"")
    await settle()
    seg.next = [utterance(0, True)]
    stream.feed(b"")
    await settle()
    assert engine.finals == [False, True]
    await stream.aclose()


@needs_model
@pytest.mark.parametrize("word", ["mm-hmm", "okay", "yeah"])
def test_short_final_of_an_acknowledgment_reads_as_one(word: str) -> None:
    engine = shared_whisper_engine()
    pcm = to_16k(silence(200) + telephone_speech(word) + silence(100))
    text = engine.submit(pcm, []).result().text
    assert is_backchannel(text, "en-US"), text
    assert "got it" not in text.lower()  # the prompt is not echoed


@needs_model
@pytest.mark.parametrize("answer", ["No.", "Hello?", "Not really."])
def test_short_answers_are_not_turned_into_acknowledgments(answer: str) -> None:
    engine = shared_whisper_engine()
    pcm = to_16k(silence(200) + telephone_speech(answer) + silence(100))
    final = engine.submit(pcm, []).result().text
    preview = engine.submit(pcm, [], final=False).result().text
    assert words_of(final) == words_of(answer), final
    assert not is_backchannel(final, "en-US")
    assert preview  # a preview decode of the same audio has words too
