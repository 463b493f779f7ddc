"""Voice activity detection on every 20 ms caller frame (docs/turn-taking.md).

The turn detector needs one bit per frame, "is the caller making speech sounds", for every frame
of every live call, so the cost per frame matters more than anything else here. WebRTC's VAD (the
``webrtcvad-wheels`` package: Google's GMM classifier in C, no model files) answers it in about
2 µs per 20 ms frame on this machine (``tests/unit/test_vad.py`` measures it; docs/turn-taking.md
has the figure), against hundreds of µs for a neural VAD.

Rates: the WebRTC VAD takes 8, 16, 32 or 48 kHz and frames of 10, 20 or 30 ms. A call's session rate
is 8, 16 or 24 kHz (docs/protocol-session-v1.md, ``session.start``: ``pcm16`` at 8, 16 or 24 kHz);
24 kHz frames are resampled to 16 kHz with audioop's linear-interpolation resampler, whose state is
kept between frames (a 20 ms frame costs about 1 µs more). Everything the classifier looks at lies
below 4 kHz, so the 16 kHz copy loses nothing it uses.

The energy gate: a frame quieter than ``min_dbfs`` is never speech. Line noise and comfort noise
sometimes fool the GMM; real speech on a phone line sits around -30 to -15 dBFS, so a gate at
-55 dBFS removes false triggers without touching quiet talkers.

Sans-I/O: the class holds only the classifier and the resampler state. One instance per stream,
since the WebRTC VAD keeps adaptive noise estimates between frames. :class:`Segmenter` builds
utterances from the same per-frame decisions, for recognisers that are not streaming.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Final

import _webrtcvad
import webrtcvad
from mypy_extensions import mypyc_attr

from appbridge.media.resample import RatecvState, ratecv

with warnings.catch_warnings():
    # audioop is deprecated in 3.11/3.12 (removed in 3.13, where audioop-lts provides it).
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = [
    "FRAME_MS_CHOICES",
    "SESSION_RATES_HZ",
    "Segmenter",
    "Utterance",
    "Vad",
    "frame_dbfs",
]

#: Frame lengths the WebRTC VAD accepts.
FRAME_MS_CHOICES: Final = (10, 20, 30)
#: Session rates a call may feed (``session.start``), and the rate the classifier runs at.
SESSION_RATES_HZ: Final[dict[int, int]] = {8000: 8000, 16000: 16000, 24000: 16000}
#: The floor of :func:`frame_dbfs`: a frame of digital silence (all zeros) reads this.
SILENCE_DBFS: Final = -96.0
_FULL_SCALE: Final = 32768.0


def frame_dbfs(pcm16: bytes) -> float:
    """RMS level of a pcm16 frame in dB relative to full scale (a full-scale square wave reads 0).

    Floored at -96 dBFS, the dynamic range of 16-bit PCM, so that silence has a finite level.
    """
    if len(pcm16) < 2:
        return SILENCE_DBFS
    if len(pcm16) & 1:
        pcm16 = pcm16[:-1]
    rms = audioop.rms(pcm16, 2)
    if rms <= 0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 20.0 * math.log10(rms / _FULL_SCALE))


class Vad:
    """Speech or not, per frame of signed 16-bit little-endian mono PCM at ``rate_hz``.

    ``aggressiveness`` is the WebRTC mode, 0 (least likely to call noise silence) to 3 (most
    likely). 2 is the default: in our tests it keeps every word of telephone-band speech and
    turns a noise floor into silence. ``min_dbfs`` is the energy gate (None turns it off).
    """

    __slots__ = (
        "_frame_bytes",
        "_handle",
        "_inner_rate_hz",
        "_min_rms",
        "_rate_hz",
        "_state",
    )

    def __init__(
        self,
        rate_hz: int,
        aggressiveness: int = 2,
        *,
        frame_ms: int = 20,
        min_dbfs: float | None = -55.0,
    ) -> None:
        if rate_hz not in SESSION_RATES_HZ:
            raise ValueError(
                f"VAD rate must be one of {sorted(SESSION_RATES_HZ)} Hz, not {rate_hz}"
            )
        if frame_ms not in FRAME_MS_CHOICES:
            raise ValueError(f"VAD frames must be 10, 20 or 30 ms, not {frame_ms}")
        if not 0 <= aggressiveness <= 3:
            raise ValueError("aggressiveness must be within 0..3")
        self._rate_hz = rate_hz
        self._inner_rate_hz = SESSION_RATES_HZ[rate_hz]
        self._frame_bytes = rate_hz * frame_ms // 1000 * 2
        # webrtcvad's `Vad.is_speech` is a Python method around the C entry point
        # `_webrtcvad.process(handle, rate, frame, samples)`: called per frame, the wrapper cost
        # more than the call, so the frame goes straight to C (its length is checked above).
        # Only the handle is kept: the capsule owns the classifier's memory and frees it itself.
        self._handle = webrtcvad.Vad(aggressiveness)._vad
        self._state: RatecvState | None = None
        self._min_rms = 0 if min_dbfs is None else int(_FULL_SCALE * 10.0 ** (min_dbfs / 20.0))

    @property
    def rate_hz(self) -> int:
        return self._rate_hz

    @property
    def frame_bytes(self) -> int:
        """The exact byte length :meth:`is_speech` takes."""
        return self._frame_bytes

    def is_speech(self, pcm16_frame: bytes) -> bool:
        """Classify one frame of exactly :attr:`frame_bytes` bytes.

        Raises ValueError for any other length: the classifier itself only takes whole 10/20/30 ms
        frames, and a silent wrong answer would shift every turn event.
        """
        if len(pcm16_frame) != self._frame_bytes:
            raise ValueError(
                f"VAD frame must be {self._frame_bytes} bytes at {self._rate_hz} Hz, "
                f"got {len(pcm16_frame)}"
            )
        if self._min_rms and audioop.rms(pcm16_frame, 2) < self._min_rms:
            # Still resample, so the resampler's history stays continuous.
            if self._inner_rate_hz != self._rate_hz:
                _, self._state = ratecv(
                    pcm16_frame, self._rate_hz, self._inner_rate_hz, self._state
                )
            return False
        frame = pcm16_frame
        if self._inner_rate_hz != self._rate_hz:
            frame, self._state = ratecv(
                pcm16_frame, self._rate_hz, self._inner_rate_hz, self._state
            )
            # 24 kHz to 16 kHz is an exact 3:2 ratio, so each frame yields the same count; guard
            # anyway against a one-sample wobble of the interpolator.
            want = len(pcm16_frame) * self._inner_rate_hz // self._rate_hz
            if len(frame) != want:
                frame = (frame + bytes(want))[:want]
        return bool(_webrtcvad.process(self._handle, self._inner_rate_hz, frame, len(frame) // 2))

    def reset(self) -> None:
        """Forget the resampler history (the classifier's noise estimate adapts on its own)."""
        self._state = None


# ---------------------------------------------------------------------------------------------
# Utterances: the endpointer of streaming STT (sans-I/O)


@dataclass(frozen=True, slots=True)
class Utterance:
    """Audio to transcribe (pcm16 at the segmenter's rate), numbered from 0 in the stream.
    Times are ms of stream audio from its first sample."""

    index: int
    pcm16: bytes
    start_ms: int
    end_ms: int
    final: bool


@mypyc_attr(allow_interpreted_subclasses=True)  # tests script utterances through a subclass
class Segmenter:
    """Cuts a pcm16 stream (16 kHz by default) into utterances for a recogniser that transcribes
    whole windows, such as Whisper (``appbridge.speech.providers.local_stt``).

    Speech starts after ``onset_frames`` speech frames in a row (as in the turn detector) and
    keeps ``pre_roll_ms`` of audio before it, so word onsets the VAD missed are still heard.
    While an utterance grows, each ``partial_every_ms`` of speech emits a partial utterance (the
    audio so far); ``early_partials_ms`` adds partials after that much speech from the onset, so
    the first words reach the turn detector in time for barge-in (docs/turn-taking.md,
    "Barge-in"); ``endpoint_ms`` of silence closes it with a final one, cut ``tail_ms`` after
    the last speech frame; one longer than ``max_utterance_ms`` is cut there and goes on as the
    next utterance. Times are ms of stream audio from its first sample.
    """

    FRAME_MS: Final = 20

    def __init__(
        self,
        *,
        rate_hz: int = 16000,
        vad_aggressiveness: int = 2,
        endpoint_ms: int = 250,
        partial_every_ms: int = 1000,
        max_utterance_ms: int = 20_000,
        pre_roll_ms: int = 200,
        tail_ms: int = 100,
        onset_frames: int = 2,
        early_partials_ms: tuple[int, ...] = (),
    ) -> None:
        self._vad = Vad(rate_hz, vad_aggressiveness, frame_ms=self.FRAME_MS)
        self._early_ms = tuple(sorted(early_partials_ms))
        self._speech_ms = 0
        self._next_early = 0
        self._frame_bytes = self._vad.frame_bytes
        self._endpoint_ms = endpoint_ms
        self._partial_every_ms = partial_every_ms
        self._max_utterance_ms = max_utterance_ms
        self._pre_roll: deque[bytes] = deque(maxlen=max(onset_frames, pre_roll_ms // 20))
        self._tail_ms = tail_ms
        self._onset_frames = onset_frames
        self._carry = b""
        self._frames_seen = 0
        self._run = 0
        self._in_utterance = False
        self._buf = bytearray()
        self._start_frame = 0
        self._last_speech_frame = 0
        self._silence_ms = 0
        self._speech_since_partial_ms = 0
        self._index = 0

    @property
    def in_utterance(self) -> bool:
        return self._in_utterance

    def feed(self, pcm16: bytes) -> list[Utterance]:
        data = self._carry + pcm16
        out: list[Utterance] = []
        whole = len(data) - len(data) % self._frame_bytes
        for offset in range(0, whole, self._frame_bytes):
            self._frame(data[offset : offset + self._frame_bytes], out)
        self._carry = data[whole:]
        return out

    def flush(self) -> list[Utterance]:
        """The final of an utterance still open (end of the stream)."""
        return [self._finish()] if self._in_utterance else []

    def _frame(self, frame: bytes, out: list[Utterance]) -> None:
        speech = self._vad.is_speech(frame)
        self._frames_seen += 1
        self._run = self._run + 1 if speech else 0
        if not self._in_utterance:
            self._pre_roll.append(frame)
            if self._run >= self._onset_frames:
                self._in_utterance = True
                self._buf = bytearray(b"".join(self._pre_roll))
                self._pre_roll.clear()
                self._start_frame = self._frames_seen - len(self._buf) // self._frame_bytes
                self._last_speech_frame = self._frames_seen
                self._silence_ms = 0
                self._speech_since_partial_ms = self._run * self.FRAME_MS
                self._speech_ms = self._run * self.FRAME_MS
                self._next_early = 0
            return
        self._buf += frame
        if speech:
            self._silence_ms = 0
            self._last_speech_frame = self._frames_seen
            self._speech_since_partial_ms += self.FRAME_MS
            self._speech_ms += self.FRAME_MS
        else:
            self._silence_ms += self.FRAME_MS
        if self._silence_ms >= self._endpoint_ms:
            out.append(self._finish())
        elif len(self._buf) // self._frame_bytes * self.FRAME_MS >= self._max_utterance_ms:
            out.append(self._finish())
            self._in_utterance = True  # speech goes on: the next utterance starts here
            self._buf = bytearray()
            self._start_frame = self._frames_seen
            self._last_speech_frame = self._frames_seen
            self._speech_since_partial_ms = 0
        elif self._speech_since_partial_ms >= self._partial_every_ms or self._early_due():
            self._speech_since_partial_ms = 0
            out.append(self._utterance(bytes(self._buf), self._frames_seen, final=False))

    def _early_due(self) -> bool:
        if (
            self._next_early >= len(self._early_ms)
            or self._speech_ms < self._early_ms[self._next_early]
        ):
            return False
        while (
            self._next_early < len(self._early_ms)
            and self._speech_ms >= self._early_ms[self._next_early]
        ):
            self._next_early += 1
        return True

    def _finish(self) -> Utterance:
        end_frame = min(self._frames_seen, self._last_speech_frame + self._tail_ms // 20)
        keep = (end_frame - self._start_frame) * self._frame_bytes
        utterance = self._utterance(bytes(self._buf[:keep]), end_frame, final=True)
        self._index += 1
        self._in_utterance = False
        self._buf = bytearray()
        self._run = 0
        return utterance

    def _utterance(self, pcm16: bytes, end_frame: int, *, final: bool) -> Utterance:
        return Utterance(
            self._index,
            pcm16,
            self._start_frame * self.FRAME_MS,
            end_frame * self.FRAME_MS,
            final,
        )
