"""Telling tasks apart: normalized text, and near-duplicates by word overlap."""

from __future__ import annotations

import re
import unicodedata

__all__ = ["Deduper", "normalize"]

_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def normalize(text: str) -> str:
    """Lower case, accents and punctuation dropped, whitespace folded."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = text.replace("'", "")  # "Verne's" and "Vernes" are the same word
    return " ".join(_WORD.findall(text.lower()))


def _shingles(words: list[str]) -> set[tuple[str, ...]]:
    if len(words) < 3:
        return {tuple(words)}
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


class Deduper:
    """Accepts a text unless it repeats, or nearly repeats, one accepted before.

    Near-duplicates: the Jaccard overlap of word 3-grams is at least `threshold`. Numbers are
    words, so "add 2 and 3" and "add 2 and 4" stay distinct tasks.
    """

    def __init__(self, threshold: float = 0.8) -> None:
        self.threshold = threshold
        self._exact: set[str] = set()
        self._grams: list[set[tuple[str, ...]]] = []

    def add(self, text: str) -> bool:
        norm = normalize(text)
        if not norm or norm in self._exact:
            return False
        grams = _shingles(norm.split())
        for other in self._grams:
            overlap = len(grams & other) / len(grams | other)
            if overlap >= self.threshold:
                return False
        self._exact.add(norm)
        self._grams.append(grams)
        return True
