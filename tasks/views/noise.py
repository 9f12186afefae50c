"""The noise view's word deletion: TSDAE's input is its crop with words deleted (docs/methods.md §3).

The noise is ours: sentence-transformers' widely copied example keeps each word with probability
0.6, i.e. deletes 40%; the paper deletes 60%. Words are whitespace tokens (the paper used NLTK's
tokenizer; whitespace needs no extra package and keeps punctuation attached to its word).
"""

from __future__ import annotations

import numpy as np


def deletion_mask(n_words: int, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Which of n words survive: each is deleted with probability `ratio`; at least one is kept
    (the paper's floor)."""
    if n_words == 0:
        return np.zeros(0, bool)
    keep = rng.random(n_words) >= ratio
    if not keep.any():
        keep[rng.integers(n_words)] = True
    return keep


def keep_words(text: str, keep: np.ndarray) -> str:
    """The words of `text` that `keep` (a deletion mask drawn for this many words) marks."""
    words = text.split()
    if len(words) != len(keep):
        raise ValueError(f"a deletion mask of {len(keep)} words for a text of {len(words)}")
    return " ".join(w for w, k in zip(words, keep) if k) if words else text
