"""Training speech for bench/onset_probe.py: sentences and acknowledgments in many voices.

docs/turn-taking.md, "Barge-in": the probe asks whether the sound of an utterance's first 240 to
440 ms tells a sentence from an acknowledgment. It learns from clips made here, at bench time, and
never from the clips bench/bargein.py measures: other sentences (:data:`TRAIN_SENTENCES`), the
same closed set of acknowledgments plus more of them, and other voices:

* eSpeak NG's English voices with its voice variants (``gmw/en-US+m3`` and so on), at four
  speaking rates; bench/speech_corpus.py's eSpeak clips use the two voices without a variant;
* six voices built from recordings (Debian ``flite``: kal, kal16, slt, awb, rms; ``festival``
  with ``festvox-us-slt-hts``), each slowed and sped up, Flite's also lowered and raised in
  pitch. The probe holds each recorded voice out in turn, so the voice it is tested on is never
  one it learned from.

Every clip goes through 8 kHz µ-law (:func:`bench.speech_corpus.telephone`). A label is 1 for a
sentence whose first word is not an acknowledgment, 0 for an acknowledgment or a sentence that
begins with one ("Okay so what about tomorrow?"), which an early decision must not take for a
turn.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from appbridge.speech.providers.local import LocalTtsProvider
from appbridge.testing.spoken import synthesise
from bench.speech_corpus import BACKCHANNELS, telephone

__all__ = ["RECORDED", "TRAIN_SENTENCES", "Sample", "espeak_samples", "recorded_samples"]

#: Things callers say that are not in bench/speech_corpus.py's SENTENCES.
TRAIN_SENTENCES: Final = (
    "I'd like to book an appointment for next week.",
    "I have a question about my last bill.",
    "I think there is a mistake on my statement.",
    "I was charged twice for the same order.",
    "I lost my card yesterday evening.",
    "I can't hear you very well.",
    "I'm calling to report a problem with my water heater.",
    "I just moved and need to set up service.",
    "I never got the confirmation email.",
    "I would rather speak to a person.",
    "Is my order on its way?",
    "Is the office open on Saturday?",
    "Is it possible to pay in installments?",
    "Can I change the delivery date?",
    "Can you repeat that please?",
    "Can somebody call me back later today?",
    "Could I get a refund for the broken chair?",
    "Could you check the status of my claim?",
    "Would it be possible to reschedule my visit?",
    "Will the technician come before noon?",
    "When will my new phone arrive?",
    "When does the sale end?",
    "What is the fee for a late payment?",
    "What are your opening hours on Sunday?",
    "Why was my account suspended?",
    "Where can I pick up my parcel?",
    "Who is responsible for the repairs?",
    "How long will the wait be?",
    "How do I reset my router?",
    "How many points do I have left?",
    "Which plan includes international calls?",
    "My son broke the screen on his tablet.",
    "My payment did not go through.",
    "My name is Daniel Harris.",
    "My account number is four five six seven.",
    "My flight was cancelled this morning.",
    "Our dishwasher is leaking all over the floor.",
    "Our meeting has to move to Thursday.",
    "The lights in the hallway keep flickering.",
    "The app crashes every time I open it.",
    "The bill is higher than usual this month.",
    "The train was forty minutes late.",
    "This is the third time I have called.",
    "This order is not what I asked for.",
    "That sounds too expensive for me.",
    "There is a strange noise coming from the engine.",
    "There was no answer at the front desk.",
    "Please send a technician to my house.",
    "Please remove me from your mailing list.",
    "Please transfer me to the sales team.",
    "Tell me more about the premium plan.",
    "Give me a minute to find my card.",
    "Let me check my calendar first.",
    "Put me through to customer service.",
    "Hello, is anyone there?",
    "Hi, I'm returning a missed call.",
    "Good morning, I need some help.",
    "Thanks, but I still have a problem.",
    "Thank you for calling me back.",
    "Excuse me, could you speak louder?",
    "Sorry, I didn't catch that.",
    "Sorry to bother you so late.",
    "Actually, I need to add something.",
    "Unfortunately the part is still missing.",
    "Maybe we can try again on Monday.",
    "Perhaps you could email me instead.",
    "Honestly I expected a faster reply.",
    "Yesterday the internet was down for hours.",
    "Tomorrow would be better for me.",
    "Last month I paid the full amount.",
    "Next time please leave a message.",
    "Every morning the alarm goes off by itself.",
    "Somebody else used my account.",
    "Someone from your company called me.",
    "Nobody told me about the extra charge.",
    "Nothing has changed since my last call.",
    "Most of the items were damaged.",
    "Both of my cards were declined.",
    "Four people will join us for dinner.",
    "Two tickets for the evening show please.",
    "Ten minutes ago the power went out.",
    "Twelve boxes were delivered to the wrong address.",
    "Eight thirty tomorrow works for me.",
    "Fifteen dollars seems like a lot.",
    "Three of the bulbs are broken.",
    "Do you deliver on weekends?",
    "Does the price include tax?",
    "Did you receive my documents?",
    "Have you found my reservation?",
    "Has the package been shipped yet?",
    "Are there any seats left on the train?",
    "Was my complaint forwarded to the manager?",
    "We need a bigger room for the party.",
    "We are still waiting for the plumber.",
    "We moved to a new address last spring.",
    "You said it would be fixed by now.",
    "You sent me the wrong size.",
    "Your website will not let me log in.",
    "He wants to cancel his membership.",
    "She needs a copy of the receipt.",
    "They promised me a discount.",
    "It stopped working after the update.",
    "It seems the meter reading is wrong.",
    "Just a quick question about my balance.",
    "Only one of the doors is locking.",
    "Any chance of an earlier slot?",
    "Another thing, the invoice has the wrong name.",
    "After the storm the roof started leaking.",
    "Before I forget, my email has changed.",
    "Since Monday the heating has been off.",
    "Because of the delay I missed my connection.",
    "If possible I'd like a window seat.",
    "When I try to pay the page freezes.",
    "Without a receipt can I still return it?",
    "Unless it is free I will pass.",
    "Even the manager could not help.",
    "No, that's not my address.",
    "Nope, that is the wrong number.",
    "Not really, I need something cheaper.",
    "Never mind, I found it.",
    "Yes, I'd like to renew my subscription.",
    "Yes please, send it by post.",
    "Definitely not, I never ordered that.",
    "Absolutely, let's do Friday.",
    "Probably around six in the evening.",
    "Usually I pay by bank transfer.",
    "Everything was fine until yesterday.",
    "Nobody answered when I rang the bell.",
    "Send the form to my work address.",
    "Check if there is a cheaper option.",
    "Book a taxi for seven in the morning.",
    "Cancel the appointment on Wednesday.",
    "Change my pin number please.",
    "Connect me with the billing department.",
    "Help me understand this charge.",
    "Stop sending me text messages.",
    "Find the nearest charging station.",
    "Order another bottle of the same wine.",
    "Play my voicemail messages.",
    "Read me my last three transactions.",
    "Schedule a call with my advisor.",
    "Add my wife to the account.",
    "Remind me about the payment on Friday.",
    "Show me the cheapest flights to Boston.",
    "Turn off the automatic renewals.",
    "Upgrade my plan to unlimited data.",
    "Email me the tracking number.",
    "Call my mobile instead of the landline.",
    "Delete the old address from my profile.",
)

#: Acknowledgments beyond bench/speech_corpus.py's BACKCHANNELS, to learn from.
ACK_EXTRA: Final = (
    "uh huh", "mm hmm", "ok", "yeah yeah", "yes okay", "right right", "sure sure", "oh I see",
    "okay got it", "mhm", "alright", "cool", "great", "exactly", "oh right", "yep yep",
    "okay okay", "oh", "ah okay", "true",
)  # fmt: skip

#: Sentences that open with an acknowledgment: labelled 0, since their start is one.
ACK_SENTENCES: Final = (
    "Okay so what about tomorrow?", "Yeah I think that works.", "Right, and the price?",
    "Sure, go ahead.", "Oh, I forgot to ask.", "All right, thanks.",
)  # fmt: skip

#: eSpeak NG voice variants (espeak-ng-data/voices/!v) that sound like a person talking.
ESPEAK_VARIANTS: Final = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "Alex", "Andy", "Annie",
    "aunty", "benjamin", "caleb", "Denis", "edward", "Gene", "grandma", "grandpa", "ian", "john",
    "linda", "Mike", "norbert", "paul", "quincy", "robert", "steph", "victor", "adam", "anika",
    "belinda", "Lee", "Michael",
)  # fmt: skip

#: Recorded voices: name -> its base pitch in Hz (Flite's int_f0_target_mean), 0 for Festival.
RECORDED: Final = {"kal": 100, "kal16": 100, "slt": 170, "awb": 110, "rms": 100, "festival": 0}


@dataclass(frozen=True, slots=True)
class Sample:
    """One training clip: 8 kHz telephone pcm16, its label, and the voice it came from."""

    text: str
    label: int
    voice: str
    pcm16: bytes


class _VariantTts(LocalTtsProvider):
    """The local TTS speaking one eSpeak voice identifier, variant included."""

    def __init__(self, identifier: str, rate_wpm: int) -> None:
        super().__init__(rate_wpm=rate_wpm)
        self.identifier = identifier

    def espeak_identifier(self, voice_id: str) -> str:
        return self.identifier


def espeak_samples() -> Iterator[Sample]:
    """Per variant, base voice and rate: every acknowledgment, 6 more, 8 sentences and one
    sentence opening with an acknowledgment (about 8,000 clips)."""
    rng = random.Random(7)
    for variant in ESPEAK_VARIANTS:
        for base in ("gmw/en-US", "gmw/en"):
            for rate in (130, 165, 200, 235):
                texts = [(w, 0) for w in (*BACKCHANNELS, *rng.sample(ACK_EXTRA, 6))]
                texts += [(s, 1) for s in rng.sample(TRAIN_SENTENCES, 8)]
                texts += [(s, 0) for s in rng.sample(ACK_SENTENCES, 1)]
                tts = _VariantTts(f"{base}+{variant}", rate)
                for text, label in texts:
                    pcm, hz = synthesise(tts, text)
                    yield Sample(text, label, f"espeak:{variant}", telephone(pcm, hz))


def recorded_samples(voice: str) -> Iterator[Sample]:
    """Every acknowledgment and half the sentences, at three speeds and (Flite) three pitches;
    nothing when the voice's program is missing."""
    if shutil.which("text2wave" if voice == "festival" else "flite") is None:
        return
    texts = [(a, 0) for a in (*BACKCHANNELS, *ACK_EXTRA, *ACK_SENTENCES)]
    texts += [(s, 1) for s in TRAIN_SENTENCES]
    rng = random.Random(3)
    base = RECORDED[voice]
    pitches = (0.0,) if voice == "festival" else (0.0, base * 0.8, base * 1.25)
    for stretch in (0.8, 1.0, 1.25):
        for pitch in pitches:
            for text, label in texts:
                if label == 1 and rng.random() < 0.5:
                    continue
                yield Sample(text, label, voice, _recorded(voice, text, stretch, pitch))


def _recorded(voice: str, text: str, stretch: float, pitch: float) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/said.wav"
        if voice == "festival":
            argv = ["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)"]
            argv += ["-eval", f"(Parameter.set 'Duration_Stretch {stretch})", "-o", path]
            subprocess.run(argv, input=text.encode(), check=True, capture_output=True)
        else:
            argv = ["flite", "-voice", voice, "--setf", f"duration_stretch={stretch}"]
            if pitch:
                argv += ["--setf", f"int_f0_target_mean={pitch}"]
            subprocess.run([*argv, "-t", text, "-o", path], check=True, capture_output=True)
        with wave.open(path, "rb") as wav:
            return telephone(wav.readframes(wav.getnframes()), wav.getframerate())
