"""Which utterances are backchannels: short acknowledgments that are not a turn.

docs/protocol-session-v1.md, "Interruptions": short acknowledgments ("uh-huh") arrive as
``turn.backchannel`` and never produce ``turn.user_started``. Deciding that needs words, so the rule
is on the transcript: an utterance is a backchannel when its text, lower-cased and stripped of
punctuation, is made only of acknowledgment phrases of the caller's language (plus the universal
"mm-hmm" family), with at most :data:`MAX_BACKCHANNEL_WORDS` words. "yeah okay" and "uh-huh, right"
are backchannels; "yeah I need help" and "okay so" are not. "yes" and "no" are answers, never
backchannels.

Speech recognisers spell these sounds many ways: Whisper writes "uh-huh" as "Uh-uh." and
"mm-hmm" as "Mm-mm." on telephone audio, so those spellings are in the list too (docs/turn-taking.md
has the measurement).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_BACKCHANNEL_WORDS", "is_backchannel", "may_become_backchannel", "words_of"]

#: Longer utterances are never backchannels, whatever their words.
MAX_BACKCHANNEL_WORDS: Final = 4

_UNIVERSAL: Final = (
    "uh-huh", "uh huh", "uhuh", "uh-uh", "mm-hmm", "mm hmm", "mmhmm", "mm-mm", "mhm", "mm", "mmm",
    "hmm", "hm", "ok", "okay", "ah", "oh",
)  # fmt: skip

# Phrases per primary language subtag (BCP-47), lower case, words separated by one space.
_BY_LANGUAGE: Final[dict[str, tuple[str, ...]]] = {
    "en": (
        "yeah", "yep", "yup", "ya", "right", "sure", "alright", "all right", "i see", "got it",
        "gotcha", "cool", "great", "exactly", "true", "okay okay", "oh okay", "uh", "huh",
        "makes sense", "for sure",
    ),
    "es": ("sí", "si", "ajá", "aja", "vale", "claro", "bueno", "ya", "okey", "de acuerdo", "ah ya"),
    "fr": ("oui", "ouais", "d'accord", "voilà", "bien sûr", "ah oui", "exactement", "hum"),
    "de": ("ja", "genau", "stimmt", "klar", "richtig", "alles klar", "aha", "achso", "ach so"),
    "it": ("sì", "si", "certo", "va bene", "esatto", "giusto", "ah ecco", "ecco"),
    "pt": ("sim", "tá", "ta", "certo", "claro", "uhum", "aham", "tá bom", "exato"),
    "nl": ("ja", "oké", "precies", "klopt", "inderdaad", "prima"),
}  # fmt: skip

_WORD_RE: Final = re.compile(r"[^\W_]+(?:['-][^\W_]+)*", re.UNICODE)


def words_of(text: str) -> list[str]:
    """The words of a transcript, lower-cased, with punctuation dropped (hyphens and apostrophes
    inside a word are kept: "uh-huh", "d'accord")."""
    return _WORD_RE.findall(text.lower())


def _phrases(language: str) -> dict[int, frozenset[tuple[str, ...]]]:
    primary = language.split("-", 1)[0].lower()
    by_len: dict[int, set[tuple[str, ...]]] = {}
    for phrase in (*_UNIVERSAL, *_BY_LANGUAGE.get(primary, ())):
        words = tuple(phrase.split(" "))
        by_len.setdefault(len(words), set()).add(words)
    return {n: frozenset(s) for n, s in by_len.items()}


_CACHE: dict[str, dict[int, frozenset[tuple[str, ...]]]] = {}


def _phrases_of(language: str) -> dict[int, frozenset[tuple[str, ...]]]:
    phrases = _CACHE.get(language)
    if phrases is None:
        phrases = _CACHE.setdefault(language, _phrases(language))
    return phrases


def is_backchannel(text: str, language: str = "en") -> bool:
    """True when ``text`` is only acknowledgment phrases of ``language`` (see module docstring).

    Empty text is not a backchannel (it is nothing at all).
    """
    words = words_of(text)
    if not words or len(words) > MAX_BACKCHANNEL_WORDS:
        return False
    return _covered(words, _phrases_of(language))[-1]


def may_become_backchannel(text: str, language: str = "en") -> bool:
    """True when ``text``, the start of an utterance still being spoken, could still end as a
    backchannel: acknowledgment phrases, the last one perhaps cut short ("I" of "I see", "all" of
    "all right"). A partial transcript like that must not start a turn (docs/turn-taking.md,
    "Barge-in")."""
    words = words_of(text)
    if not words or len(words) > MAX_BACKCHANNEL_WORDS:
        return False
    phrases = _phrases_of(language)
    covered = _covered(words, phrases)
    if covered[-1]:
        return True
    for i in range(len(words)):
        if covered[i]:
            tail = tuple(words[i:])
            for n in range(len(tail) + 1, max(phrases) + 1):
                if any(p[: len(tail)] == tail for p in phrases.get(n, frozenset())):
                    return True
    return False


def _covered(words: list[str], phrases: dict[int, frozenset[tuple[str, ...]]]) -> list[bool]:
    longest = max(phrases)
    # Can words[:i] be cut into phrases? (a tiny dynamic programme; at most 4 words)
    covered = [True] + [False] * len(words)
    for i in range(len(words)):
        if not covered[i]:
            continue
        for n in range(1, min(longest, len(words) - i) + 1):
            if tuple(words[i : i + n]) in phrases.get(n, frozenset()):
                covered[i + n] = True
    return covered
