"""The turn detector: when the caller starts and stops talking (docs/turn-taking.md).

Theory of operation
-------------------
Sans-I/O, time is an argument. Two inputs: one VAD bit per caller frame (:meth:`on_frame`, every
20 ms) and the STT's transcripts (:meth:`on_transcript`, partial and final). Timers are data:
:meth:`next_deadline` says when the detector next needs to be woken, :meth:`on_timer` wakes it.
Every method returns the events that became due, in order. Times are seconds (floats), the same
clock for every call; a frame's ``now`` is when it arrived (the end of its audio).

Speech onset: a frame counts as speech once ``onset_frames`` (2) speech frames in a row arrived;
the run's first frame is the onset. A lone click is not speech.

Phases: IDLE, CANDIDATE (speech heard, not yet known to be a turn), TURN (``UserStarted`` sent).

* IDLE --speech--> CANDIDATE.
* CANDIDATE --> TURN with ``UserStarted`` as soon as either (a) ``confirm_speech_s`` (0.7 s) have
  passed between the onset and a speech frame, or (b) a transcript of the candidate holds a word
  that is not a backchannel word (:mod:`appbridge.turn.backchannel`), and, for a partial, the
  text cannot still grow into one ("I" may become "I see": ``guard_prefixes``). This is why
  ``UserStarted`` waits: a backchannel must never produce it (docs/protocol-session-v1.md,
  "Interruptions"). Cost: up to 0.7 s from onset for an utterance the STT has not yet transcribed;
  a short answer ("No.") starts its turn when its final transcript arrives. Why no earlier
  decision: docs/turn-taking.md, "Barge-in" (``partial_needs_speech`` is a variant compared there,
  off by default).
* CANDIDATE --> IDLE with ``Backchannel(text)`` when the caller is silent and a final transcript
  arrived since the last speech frame, and everything transcribed is acknowledgment phrases.
  Silently, when it is empty (a cough), or when ``candidate_wait_s`` (2 s) of silence pass with no
  decision; ``owed_final_wait_s`` (5 s) more while the STT owes a final, so that a short answer
  ("No.") decoded late on a loaded machine is still a turn.
* TURN, in a pause: ``LikelyEnded(text)`` at the last speech frame + the hold (200 ms, at most half
  the patience wait), then ``Ended`` at the last speech frame + the wait, once a final transcript
  arrived after the last speech frame (the text is complete); without one, ``final_wait_s``
  (1.5 s) later with what it has. While the STT says it owes a final (:meth:`on_final_owed`: one
  is being decoded), ``Ended`` waits for it, up to ``owed_final_wait_s`` (5 s) after the wait: on
  a loaded machine the final's text is then sent, not the preview's. Speech after
  ``LikelyEnded`` sends ``Resumed``.
* ``LikelyEnded`` needs a recognised word (there is nothing to prepare a reply to before that);
  when the first words arrive after the hold, it is sent at once.
* TURN with no recognised word at all: no ``LikelyEnded``/``Ended`` by the pause timers; instead
  ``Ended(abandoned=True, text="")`` exactly ``abandon_s`` (10 s) after ``UserStarted``
  (docs/turn-taking.md, "The rules").

The wait (docs/turn-taking.md has the measured figures):

* ``patience`` sets the base: low 0.3 s, normal 0.7 s, high 1.2 s of silence.
* It adapts within a call. After ``Resumed`` (the caller paused past ``LikelyEnded`` and went on),
  a bonus is raised to ``max(bonus + 0.1 s, pause + 0.25 s - base)``, at most 0.6 s: the same pause
  would not end their turn next time. Each turn that ends without a ``Resumed`` lowers it 0.05 s.
* The words shape it, once a transcript arrived after the last speech frame (it covers the pause):
  text ending in "?" waits ``x0.6``, in "." or "!" ``x0.8`` (a finished sentence); text ending in
  "...", ",", or a word that cannot end a sentence ("and", "the", "to", "um") waits ``x1.5``.
  Never more than 3 s.

Estimates: while a candidate or turn is open, each frame at least ``estimate_interval_s`` (0.1 s)
after the last estimate produces ``Estimate``: speaking (eot 0, kind "speech") or in a pause (eot
rising linearly from 0 to 1 over the current wait, kind "pause").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, TypeAlias

from appbridge.speech.base import Transcript
from appbridge.turn.backchannel import is_backchannel, may_become_backchannel, words_of

__all__ = [
    "PATIENCE_WAIT_S",
    "Backchannel",
    "Ended",
    "Estimate",
    "LikelyEnded",
    "Patience",
    "Phase",
    "Resumed",
    "TurnDetector",
    "TurnEvent",
    "TurnTiming",
    "UserStarted",
]

Patience: TypeAlias = Literal["low", "normal", "high"]

#: Silence after the last speech frame before ``Ended``, before adaptation
#: (docs/turn-taking.md, "Patience and the wait").
PATIENCE_WAIT_S: Final[dict[str, float]] = {"low": 0.3, "normal": 0.7, "high": 1.2}

# Float slack for deadline comparisons: times are sums of 20 ms steps.
_EPS: Final = 1e-6


@dataclass(frozen=True, slots=True)
class UserStarted:
    """``turn.user_started``."""


@dataclass(frozen=True, slots=True)
class LikelyEnded:
    """``turn.likely_ended``: the text heard so far."""

    text: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """``turn.resumed``."""


@dataclass(frozen=True, slots=True)
class Ended:
    """``turn.ended``. ``duration_ms`` runs from the turn's first speech frame to the end of its
    last one; ``confidence`` is the mean of its final transcripts' confidences. ``without_final``
    (not sent to the app; counted on ``/metrics``): the STT was on but no final arrived after the
    last speech frame in time, so the text may be a preview's."""

    text: str
    language: str
    confidence: float
    duration_ms: int
    abandoned: bool
    without_final: bool = False


@dataclass(frozen=True, slots=True)
class Backchannel:
    """``turn.backchannel``."""

    text: str


@dataclass(slots=True, init=False)
class Estimate:
    """``turn.estimate``: ``kind`` is ``"speech"`` or ``"pause"``.

    Five a second per call, so ``__init__`` is written out and the class is not frozen: the
    one ``dataclasses`` would generate runs interpreted even compiled (appbridge/compiled.py),
    and a frozen one sets each field through ``object.__setattr__``. Nothing changes one after
    it is made.
    """

    eot: float
    speaking: bool
    kind: str

    def __init__(self, eot: float, speaking: bool, kind: str) -> None:
        self.eot = eot
        self.speaking = speaking
        self.kind = kind


TurnEvent: TypeAlias = UserStarted | LikelyEnded | Resumed | Ended | Backchannel | Estimate


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """Every constant of the rules above, so tests and operators can see them in one place."""

    frame_s: float = 0.020
    onset_frames: int = 2
    confirm_speech_s: float = 0.7
    likely_hold_s: float = 0.2
    final_wait_s: float = 1.5
    owed_final_wait_s: float = 5.0
    candidate_wait_s: float = 2.0
    abandon_s: float = 10.0
    estimate_interval_s: float = 0.1
    resume_step_s: float = 0.1
    resume_margin_s: float = 0.25
    max_bonus_s: float = 0.6
    bonus_decay_s: float = 0.05
    max_wait_s: float = 3.0
    question_factor: float = 0.6
    sentence_end_factor: float = 0.8
    hanging_factor: float = 1.5


class Phase(Enum):
    IDLE = "idle"
    CANDIDATE = "candidate"
    TURN = "turn"


# Words after which a sentence cannot be over, per primary language subtag.
_HANGING_WORDS: Final[dict[str, str]] = {
    "en": "and or but so because to the a an of for with in on at from my your our their his her "
    "its this that which who if than as um uh er erm like is are was were i'm i'd i've we're i",
    "es": "y o pero que de del el la los las un una para con en por porque mi su",
    "fr": "et ou mais que de du le la les un une pour avec en à parce mon ma euh",
    "de": "und oder aber dass der die das den dem ein eine für mit in weil mein äh",
}
_HANGING: Final[dict[str, frozenset[str]]] = {
    lang: frozenset(words.split(" ")) for lang, words in _HANGING_WORDS.items()
}


def _patience(value: str) -> Patience:
    if value == "low":
        return "low"
    if value == "normal":
        return "normal"
    if value == "high":
        return "high"
    raise ValueError(f"patience must be low, normal or high, not {value!r}")


class TurnDetector:
    """One caller's turns. See the module docstring for every rule."""

    def __init__(
        self,
        now: float,
        patience: str = "normal",
        language: str = "en-US",
        *,
        timing: TurnTiming | None = None,
        emit_estimates: bool = True,
        transcripts: bool = True,
    ) -> None:
        # ``transcripts=False``: no STT behind this detector (``speech.stt = "none"``). Turns
        # then end on the pause timers alone, with empty text; nothing waits for words.
        self._transcripts = transcripts
        # A partial that may still become a backchannel does not start a turn (rule 3).
        self.guard_prefixes = True
        # When set, a partial starts a turn only while the caller is still speaking (a variant
        # measured for early partials, docs/turn-taking.md "Barge-in"; off by default).
        self.partial_needs_speech = False
        self._t = timing or TurnTiming()
        self._patience: Patience = _patience(patience)
        self._language = language
        self.emit_estimates = emit_estimates
        self._now = now
        self._phase = Phase.IDLE
        self._run = 0
        self._run_start = now
        self._speaking = False
        self._bonus_s = 0.0
        self._last_estimate_at: float | None = None
        self._final_owed = False  # the STT is decoding a final it has not delivered
        self._clear_turn(now)

    def _clear_turn(self, now: float) -> None:
        self._seg_start = now
        self._last_speech = now
        self._started_at = now
        self._likely_sent = False
        self._resumed_in_turn = False
        self._finals: list[Transcript] = []
        self._partial: Transcript | None = None
        self._fresh_final = False  # a final arrived after the last speech frame
        self._fresh_text = False  # any transcript arrived after the last speech frame
        self._words_seen = False

    # -- settings (``listen.update`` applies from now on) ----------------------------------

    @property
    def patience(self) -> Patience:
        return self._patience

    def set_patience(self, patience: str) -> None:
        """Takes effect at once: a pause in progress is measured against the new wait."""
        self._patience = _patience(patience)

    @property
    def language(self) -> str:
        return self._language

    def set_language(self, tag: str) -> None:
        """The language reported by ``Ended`` when no transcript names one, and whose
        backchannel and sentence-end words apply."""
        self._language = tag

    # -- state for the shell ---------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The latest time any input carried."""
        return self._now

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def speaking(self) -> bool:
        return self._speaking

    @property
    def final_owed(self) -> bool:
        """What :meth:`on_final_owed` last said."""
        return self._final_owed

    @property
    def bonus_s(self) -> float:
        """The adaptation added to the patience wait for this caller."""
        return self._bonus_s

    def wait_s(self) -> float:
        """The silence that ends the current turn, with adaptation and the text's shape."""
        base = PATIENCE_WAIT_S[self._patience] + self._bonus_s
        factor = self._text_factor() if self._fresh_text else 1.0
        return min(self._t.max_wait_s, base * factor)

    def hold_s(self) -> float:
        """Silence before ``LikelyEnded``."""
        return min(self._t.likely_hold_s, PATIENCE_WAIT_S[self._patience] / 2)

    def reset(self, now: float) -> None:
        """Forget any candidate or turn without an event (the caller went on hold)."""
        self._now = max(self._now, now)
        self._phase = Phase.IDLE
        self._run = 0
        self._speaking = False
        self._clear_turn(self._now)

    # -- inputs ----------------------------------------------------------------------------------

    def on_frame(self, now: float, is_speech: bool) -> list[TurnEvent]:
        """One caller frame's VAD decision."""
        now = self._advance(now)
        events = self._fire_due(now)
        if is_speech:
            self._run += 1
            if self._run == 1:
                self._run_start = now
        else:
            self._run = 0
            self._speaking = False
        if self._run >= self._t.onset_frames:
            onset = self._run_start if self._run == self._t.onset_frames else None
            self._on_speech(now, onset, events)
        if (
            self.emit_estimates
            and self._phase is not Phase.IDLE
            and (
                self._last_estimate_at is None
                or now - self._last_estimate_at >= self._t.estimate_interval_s - _EPS
            )
        ):
            self._last_estimate_at = now
            events.append(self._estimate(now))
        return events

    def on_transcript(self, now: float, transcript: Transcript) -> list[TurnEvent]:
        """A partial or final transcript of the caller's speech."""
        now = self._advance(now)
        events = self._fire_due(now)
        if self._phase is Phase.IDLE:
            return events  # late text of a turn that already ended, or noise: dropped
        if transcript.is_final:
            if transcript.text.strip():
                self._finals.append(transcript)
            self._partial = None
            if not self._speaking:
                self._fresh_final = True
        else:
            self._partial = transcript if transcript.text.strip() else None
        if not self._speaking:
            self._fresh_text = True
        has_words = bool(words_of(self._text()))
        if self._phase is Phase.CANDIDATE:
            text = self._text()
            if (
                has_words
                and not is_backchannel(text, self._language)
                and not self._may_be_ack(text)
            ):
                self._start_turn(now, events)
            elif not self._speaking and self._fresh_final:
                if has_words:
                    events.append(Backchannel(text))
                self._end_candidate(now)
                return events
        elif has_words:
            self._words_seen = True
        events.extend(self._fire_due(now))
        return events

    def on_final_owed(self, now: float, owed: bool) -> list[TurnEvent]:
        """The STT started (``owed``) or stopped owing a final transcript of audio it was fed.
        A provider that cannot tell never calls this, and ``Ended`` gives up on a missing final
        after ``final_wait_s``; an owed one is waited for up to ``owed_final_wait_s``."""
        now = self._advance(now)
        self._final_owed = owed
        return self._fire_due(now)

    def next_deadline(self) -> float | None:
        """When :meth:`on_timer` must next be called, or None when nothing is pending."""
        due = self._deadline()
        return None if due is None else due[0]

    def on_timer(self, now: float) -> list[TurnEvent]:
        """Fire every deadline up to ``now``."""
        return self._fire_due(self._advance(now))

    # -- internals -------------------------------------------------------------------------------

    def _advance(self, now: float) -> float:
        # Time never runs backwards inside the core, whatever the shell passes.
        if now > self._now:
            self._now = now
        return self._now

    def _on_speech(self, now: float, onset: float | None, events: list[TurnEvent]) -> None:
        if self._phase is Phase.IDLE:
            self._phase = Phase.CANDIDATE
            self._clear_turn(onset if onset is not None else now)
        elif self._phase is Phase.TURN and onset is not None and self._likely_sent:
            events.append(Resumed())
            self._adapt(onset - self._last_speech)
            self._likely_sent = False
            self._resumed_in_turn = True
        self._speaking = True
        self._last_speech = now
        self._fresh_final = False
        self._fresh_text = False
        if (
            self._phase is Phase.CANDIDATE
            and now - self._seg_start >= self._t.confirm_speech_s - _EPS
        ):
            self._start_turn(now, events)

    def _start_turn(self, now: float, events: list[TurnEvent]) -> None:
        self._phase = Phase.TURN
        self._started_at = now
        self._words_seen = bool(words_of(self._text()))
        events.append(UserStarted())

    def _may_be_ack(self, text: str) -> bool:
        # A partial ("I", "all") may still grow into an acknowledgment ("I see", "all right").
        if self._partial is None:
            return False
        if self.partial_needs_speech and not self._speaking:
            return True
        return self.guard_prefixes and may_become_backchannel(text, self._language)

    def _end_candidate(self, now: float) -> None:
        self._phase = Phase.IDLE
        self._clear_turn(now)

    def _adapt(self, pause_s: float) -> None:
        base = PATIENCE_WAIT_S[self._patience]
        raised = max(
            self._bonus_s + self._t.resume_step_s, pause_s + self._t.resume_margin_s - base
        )
        self._bonus_s = min(self._t.max_bonus_s, raised)

    def _text(self) -> str:
        parts = [t.text.strip() for t in self._finals]
        if self._partial is not None:
            parts.append(self._partial.text.strip())
        return " ".join(p for p in parts if p)

    def _text_factor(self) -> float:
        text = self._text().rstrip()
        if not text:
            return 1.0
        if text.endswith(("...", "\u2026", ",", ";", ":", "-")):
            return self._t.hanging_factor
        if text.endswith("?"):
            return self._t.question_factor
        if text.endswith((".", "!")):
            return self._t.sentence_end_factor
        words = words_of(text)
        hanging = _HANGING.get(self._language.split("-", 1)[0].lower(), frozenset())
        if words and words[-1] in hanging:
            return self._t.hanging_factor
        return 1.0

    def _deadline(self) -> tuple[float, str] | None:
        """The earliest pending timer and what it does (ties go to the name first in
        alphabetical order, as ``min`` over the pairs would). Runs twice per caller frame, so
        the idle and speaking cases return before any arithmetic."""
        phase = self._phase
        if phase is Phase.IDLE:
            return None
        if phase is Phase.CANDIDATE:
            if self._speaking:
                return None
            drop_at = self._last_speech + self._t.candidate_wait_s
            if self._final_owed:
                drop_at += self._t.owed_final_wait_s
            return (drop_at, "candidate")
        words = self._words_seen or not self._transcripts
        best: tuple[float, str] | None = None
        if not words:
            best = (self._started_at + self._t.abandon_s, "abandon")
        if not self._speaking and words:
            end_at = self._last_speech + self.wait_s()
            likely_at = self._last_speech + self.hold_s()
            if not self._likely_sent and likely_at < end_at - _EPS:
                best = (likely_at, "likely")
            if self._final_owed:
                end_at += self._t.owed_final_wait_s
            elif not self._fresh_final and self._transcripts:
                end_at += self._t.final_wait_s
            if best is None or (end_at, "end") < best:
                best = (end_at, "end")
        return best

    def _fire_due(self, now: float) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        while True:
            due = self._deadline()
            if due is None or due[0] > now + _EPS:
                return events
            what = due[1]
            if what == "likely":
                self._likely_sent = True
                events.append(LikelyEnded(self._text()))
            elif what == "candidate":
                text = self._text()
                if words_of(text) and is_backchannel(text, self._language):
                    events.append(Backchannel(text))
                self._end_candidate(now)
            elif what == "abandon":
                events.append(self._ended(abandoned=True))
            else:
                events.append(self._ended(abandoned=False))

    def _ended(self, *, abandoned: bool) -> Ended:
        duration_ms = max(0, round((self._last_speech - self._seg_start + self._t.frame_s) * 1000))
        if abandoned:
            event = Ended("", self._language, 0.0, duration_ms, True)
        else:
            scored = [t for t in self._finals if words_of(t.text)]
            if scored:
                confidence = sum(t.confidence for t in scored) / len(scored)
                language = scored[-1].language or self._language
            elif self._partial is not None:
                confidence = self._partial.confidence
                language = self._partial.language or self._language
            else:
                confidence, language = 0.0, self._language
            confidence = min(1.0, max(0.0, confidence))
            missing = self._transcripts and (self._final_owed or not self._fresh_final)
            event = Ended(self._text(), language, confidence, duration_ms, False, missing)
            if not self._resumed_in_turn:
                self._bonus_s = max(0.0, self._bonus_s - self._t.bonus_decay_s)
        self._phase = Phase.IDLE
        self._run = 0
        self._speaking = False
        self._clear_turn(self._now)
        return event

    def _estimate(self, now: float) -> Estimate:
        if self._speaking:
            return Estimate(0.0, True, "speech")
        wait = self.wait_s()
        silence = max(0.0, now - self._last_speech)
        eot = 1.0 if wait <= 0 else min(1.0, silence / wait)
        return Estimate(round(eot, 3), False, "pause")
