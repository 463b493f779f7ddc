"""Telephone speech for the turn-taking benches (bench/bargein.py, bench/stt_eval.py).

docs/turn-taking.md, "Barge-in" and "Choosing it": the recogniser and the detector are measured on
what a call carries, 8 kHz G.711 µ-law. Two sources, both made or read on this machine at bench
time, nothing downloaded:

* eSpeak NG (the gateway's own ``local`` TTS) speaks the sentences and the acknowledgments, at a
  few speaking rates and voices, and the result goes through µ-law at 8 kHz and back;
* the same sentences in voices built from recorded speech, which sound less robotic than eSpeak's
  formant synthesis: Festival's HTS voice ``cmu_us_slt_arctic_hts`` (Debian ``festival``,
  ``festvox-us-slt-hts``) and Flite's ``rms`` and ``awb`` (Debian ``flite``); a voice whose
  program is missing is skipped;
* human recordings: the prompts of Debian's ``asterisk-core-sounds-en-wav`` (Allison Smith,
  CC-BY-SA 3.0), 8 kHz telephone prompts read from the installed package, not copied here.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from appbridge.media.codecs import PCMU_8K, AudioFormat, Converter
from appbridge.testing.spoken import espeak
from appbridge.testing.wer import word_error_rate

__all__ = [
    "ASTERISK_ACKNOWLEDGMENTS",
    "ASTERISK_PROMPTS",
    "BACKCHANNELS",
    "SENTENCES",
    "Clip",
    "asterisk_clips",
    "backchannel_clips",
    "recorded_backchannel_clips",
    "recorded_voice_clips",
    "sentence_clips",
    "silence",
    "speak",
    "word_error_rate",
]

RATE_HZ: Final = 8000

#: Plain things a caller says to a voice agent.
SENTENCES: Final = (
    "I would like to check the balance of my account.",
    "Can you tell me when the store opens tomorrow?",
    "The package arrived yesterday but the box was damaged.",
    "Could you send the invoice to my email address?",
    "I need to change my flight to next Friday.",
    "What time does the pharmacy close tonight?",
    "My internet connection keeps dropping every evening.",
    "Please cancel my order and refund the payment.",
    "I am calling about the letter I received last week.",
    "Do you have any appointments available on Monday morning?",
    "The driver never showed up at the pickup point.",
    "How much does it cost to add another line?",
    "I forgot my password and cannot log in.",
    "Can I speak to someone in the billing department?",
    "We would like a table for four people at seven.",
    "The heating in my apartment stopped working.",
    "Where is the nearest branch to the city center?",
    "I want to update the address on my account.",
    "Is there a charge for paying with a credit card?",
    "Send me a text message when the repair is done.",
)

#: Acknowledgments a caller says while the agent talks (appbridge/turn/backchannel.py).
BACKCHANNELS: Final = (
    "uh-huh", "mm-hmm", "okay", "yeah", "right", "sure", "yep", "I see", "got it",
    "all right", "oh okay", "yeah okay",
)  # fmt: skip

_SOUNDS: Final = Path("/usr/share/asterisk/sounds/en_US_f_Allison")

#: Prompts of asterisk-core-sounds-en (file stem -> what is said).
ASTERISK_PROMPTS: Final[dict[str, str]] = {
    "one-moment-please": "One moment please.",
    "please-try-again": "Please try again.",
    "please-try-call-later": "Please try your call again later.",
    "all-circuits-busy-now": "All circuits are busy now.",
    "pls-hold-while-try": "Please hold while we try to connect you.",
    "something-terribly-wrong": "Something is terribly wrong.",
    "tt-weasels": "Weasels have eaten our phone system.",
    "queue-thankyou": "Thank you for your patience.",
    "vm-nobodyavail": "Nobody is available to take your call at the moment.",
    "conf-onlyperson": "You are currently the only person in this conference.",
    "hello-world": "Hello world.",
    "vm-goodbye": "Goodbye.",
}


@dataclass(frozen=True, slots=True)
class Clip:
    """One utterance, 8 kHz pcm16 after the µ-law round trip, and what it says."""

    name: str
    text: str
    pcm16: bytes

    @property
    def seconds(self) -> float:
        return len(self.pcm16) / 2 / RATE_HZ


_TO_ULAW: dict[int, Converter] = {}
_FROM_ULAW: Final = Converter(PCMU_8K, AudioFormat("pcm16", RATE_HZ))


def telephone(pcm16: bytes, rate_hz: int) -> bytes:
    """``pcm16`` at ``rate_hz`` through G.711 µ-law at 8 kHz, back as 8 kHz pcm16."""
    to_ulaw = Converter(AudioFormat("pcm16", rate_hz), PCMU_8K)
    return _FROM_ULAW.convert(to_ulaw.convert(pcm16))


def speak(text: str, *, rate_wpm: int = 175, voice_index: int = 0) -> bytes:
    """``text`` spoken by eSpeak NG, as 8 kHz telephone pcm16."""
    pcm, rate = espeak(text, rate_wpm=rate_wpm, voice_index=voice_index)
    return telephone(pcm, rate)


def silence(ms: int) -> bytes:
    return bytes(RATE_HZ * ms // 1000 * 2)


def sentence_clips() -> list[Clip]:
    return [Clip(f"espeak-{i:02d}", s, speak(s)) for i, s in enumerate(SENTENCES)]


def backchannel_clips() -> list[Clip]:
    """Each acknowledgment at three speaking rates and two voices: about 0.25 to 0.9 s."""
    clips = []
    for word in BACKCHANNELS:
        for rate in (140, 175, 220):
            for voice in (0, 1):
                clips.append(
                    Clip(
                        f"{word}@{rate}v{voice}",
                        word,
                        speak(word, rate_wpm=rate, voice_index=voice),
                    )
                )
    return clips


#: A voice's command: (text, WAV path) -> its command line and what goes to its stdin.
VoiceCommand = Callable[[str, str], tuple[list[str], bytes | None]]


def _festival_hts(text: str, wav: str) -> tuple[list[str], bytes | None]:
    return ["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)", "-o", wav], text.encode()


def _flite(voice: str) -> VoiceCommand:
    return lambda text, wav: (["flite", "-voice", voice, "-t", text, "-o", wav], None)


#: Voices built from recordings (module doc): name -> (its program, its command line and input).
RECORDED_VOICES: Final[dict[str, tuple[str, VoiceCommand]]] = {
    "festival-slt-hts": ("text2wave", _festival_hts),
    "flite-rms": ("flite", _flite("rms")),
    "flite-awb": ("flite", _flite("awb")),
}


def recorded_voice_clips() -> dict[str, list[Clip]]:
    """The sentences in each of :data:`RECORDED_VOICES` whose program is installed."""
    out = {}
    for voice, (program, command) in RECORDED_VOICES.items():
        if shutil.which(program) is not None:
            out[voice] = [
                Clip(f"{voice}-{i:02d}", s, _said(command, s)) for i, s in enumerate(SENTENCES)
            ]
    return out


def recorded_backchannel_clips() -> list[Clip]:
    """Each acknowledgment in each of :data:`RECORDED_VOICES` whose program is installed."""
    return [
        Clip(f"{word}@{voice}", word, _said(command, word))
        for voice, (program, command) in RECORDED_VOICES.items()
        if shutil.which(program) is not None
        for word in BACKCHANNELS
    ]


def _said(command: VoiceCommand, text: str) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/said.wav"
        argv, stdin = command(text, path)
        subprocess.run(argv, input=stdin, check=True, capture_output=True)
        with wave.open(path, "rb") as wav:
            pcm = wav.readframes(wav.getnframes())
            rate = wav.getframerate()
    return telephone(pcm, rate)


#: The one acknowledgment-like word among those prompts: the digit "oh" (stem -> what is said).
ASTERISK_ACKNOWLEDGMENTS: Final[dict[str, str]] = {"digits/oh": "oh"}


def asterisk_clips(prompts: dict[str, str] = ASTERISK_PROMPTS) -> list[Clip]:
    """The human prompts, empty when asterisk-core-sounds-en-wav is not installed."""
    clips = []
    for stem, text in prompts.items():
        path = _SOUNDS / f"{stem}.wav"
        if not path.is_file():
            continue
        with wave.open(str(path), "rb") as wav:
            pcm = wav.readframes(wav.getnframes())
            rate = wav.getframerate()
        clips.append(Clip(f"asterisk-{stem}", text, telephone(pcm, rate)))
    return clips
