"""What ``gather`` waits for, as a sans-I/O state machine: events and ``now`` in, a result out.

Theory of operation
-------------------
``gather`` asks for the caller's next input: a speech turn (docs/protocol-session-v1.md, "Turn and
transcript events") or DTMF digits (``dtmf { digit }``). The protocol has no ``gather`` command, so
it is built from events alone.

- **Waiting.** The timeout runs from the start, or, with a prompt, from the moment the prompt
  stopped playing (as a telephony "gather with a nested say" does: the caller is given the full
  timeout after hearing the question). Input during the prompt counts.
- **Speech.** ``turn.user_started`` suspends the timeout: a caller who is talking is not cut off.
  The gateway's turn detector bounds the turn itself (``turn.ended`` with ``abandoned: true``
  after 10 s of nothing). A ``turn.ended`` with text ends the gather; an abandoned or empty one
  restarts the timeout from then.
- **Digits.** The first keypress turns the gather into a digit gather (later turn events are
  ignored). It ends on a terminator key (not included in the digits), when ``max_digits`` keys
  were pressed, or when ``digit_timeout_s`` passes after a key with what was pressed so far.

No clock is read here: every method takes ``now`` (seconds, monotonic) and :meth:`deadline`
says when :meth:`on_timer` is due, so the rules are tested by stepping time by hand.
"""

from __future__ import annotations

from appbridge.protocol.session_v1 import (
    DtmfEvent,
    TurnEnded,
    TurnLikelyEnded,
    TurnResumed,
    TurnUserStarted,
)
from appbridge.sdk.events import GatherResult

__all__ = ["GatherState"]

_DTMF_KEYS = frozenset("0123456789*#ABCD")


class GatherState:
    """One ``gather`` call. Feed it events with :meth:`on_event`; it answers a result once."""

    def __init__(
        self,
        *,
        now: float,
        timeout_s: float,
        speech: bool = True,
        dtmf: bool = True,
        max_digits: int | None = None,
        terminators: str = "#",
        digit_timeout_s: float | None = None,
        awaiting_prompt: bool = False,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if not speech and not dtmf:
            raise ValueError("gather needs speech, dtmf or both")
        if max_digits is not None and max_digits < 1:
            raise ValueError("max_digits must be at least 1")
        unknown = set(terminators) - _DTMF_KEYS
        if unknown:
            raise ValueError(f"terminators must be DTMF keys, not {''.join(sorted(unknown))!r}")
        self.timeout_s = timeout_s
        self.digit_timeout_s = timeout_s if digit_timeout_s is None else digit_timeout_s
        if self.digit_timeout_s <= 0:
            raise ValueError("digit_timeout_s must be positive")
        self.speech = speech
        self.dtmf = dtmf
        self.max_digits = max_digits
        self.terminators = terminators
        self.digits = ""
        self.speaking = False
        self.result: GatherResult | None = None
        self._deadline: float | None = None if awaiting_prompt else now + timeout_s
        self._awaiting_prompt = awaiting_prompt

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def input_started(self) -> bool:
        """The caller pressed a key or started talking (the prompt can stop playing)."""
        return bool(self.digits) or self.speaking or self.finished

    def wants(self, event: object) -> bool:
        """Whether ``event`` is input for this gather (then the session does not also yield it)."""
        if self.finished:
            return False
        if isinstance(event, DtmfEvent):
            return self.dtmf
        if isinstance(event, TurnUserStarted | TurnLikelyEnded | TurnResumed | TurnEnded):
            return self.speech and not self.digits
        return False

    def deadline(self) -> float | None:
        """When :meth:`on_timer` is due; ``None`` while nothing can time out."""
        return None if self.finished else self._deadline

    def prompt_finished(self, now: float) -> None:
        """The prompt stopped playing: the timeout starts now, unless input already did."""
        if not self._awaiting_prompt:
            return
        self._awaiting_prompt = False
        if not self.finished and not self.digits and not self.speaking:
            self._deadline = now + self.timeout_s

    def on_event(self, event: object, now: float) -> GatherResult | None:
        """Takes one event of the session; returns the result when this event ended the gather."""
        if self.finished:
            return None
        if isinstance(event, DtmfEvent):
            if self.dtmf:
                return self._on_digit(event.digit, now)
        elif isinstance(event, TurnUserStarted):
            if self.speech and not self.digits:
                self.speaking = True
                self._deadline = None
        elif isinstance(event, TurnEnded) and self.speech and not self.digits:
            self.speaking = False
            if event.abandoned or not event.text.strip():
                self._deadline = None if self._awaiting_prompt else now + self.timeout_s
                return None
            return self._finish(GatherResult("speech", text=event.text, turn=event))
        return None

    def on_timer(self, now: float) -> GatherResult | None:
        """Call at or after :meth:`deadline`; returns the result when the gather timed out."""
        if self.finished or self._deadline is None or now < self._deadline:
            return None
        if self.digits:
            return self._finish(GatherResult("dtmf", digits=self.digits))
        return self._finish(GatherResult("timeout"))

    def _on_digit(self, digit: str, now: float) -> GatherResult | None:
        self.speaking = False
        if digit in self.terminators:
            return self._finish(GatherResult("dtmf", digits=self.digits, terminator=digit))
        self.digits += digit
        if self.max_digits is not None and len(self.digits) >= self.max_digits:
            return self._finish(GatherResult("dtmf", digits=self.digits))
        self._deadline = now + self.digit_timeout_s
        return None

    def _finish(self, result: GatherResult) -> GatherResult:
        self.result = result
        self._deadline = None
        return result
