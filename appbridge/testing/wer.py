"""Word error rate, as the recogniser evaluations and tests score transcripts.

Words are lower-cased runs of letters, digits and apostrophes (a hyphen splits), and a number's
digits are spelled one by one ("15" is "one five"), so that "15" and "one five" are the same
words; WER is the word-level Levenshtein distance over the reference's length.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["normalise_words", "word_error_rate"]

_DIGITS: Final = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def normalise_words(text: str) -> list[str]:
    words: list[str] = []
    for word in re.findall(r"[a-z0-9']+", text.lower().replace("-", " ")):
        if word.isdigit():
            words.extend(_DIGITS[int(d)] for d in word)
        else:
            words.append(word)
    return words


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance over words, divided by the reference's word count."""
    ref, hyp = normalise_words(reference), normalise_words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))
