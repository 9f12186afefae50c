"""tasks/views/noise.py: the noise view's word deletion."""

import numpy as np
import pytest

from tasks.views.noise import deletion_mask, keep_words


def delete_words(text: str, ratio: float, rng: np.random.Generator) -> str:
    return keep_words(text, deletion_mask(len(text.split()), ratio, rng))


def test_word_deletion_deletes_sixty_percent_not_forty():
    rng = np.random.default_rng(0)
    text = " ".join(f"w{i}" for i in range(10_000))
    kept = delete_words(text, 0.6, rng).split()
    assert abs(len(kept) / 10_000 - 0.4) < 0.015  # the copied example's bug would keep 60%
    assert kept == [w for w in text.split() if w in set(kept)]  # order preserved


def test_word_deletion_always_keeps_one_word():
    rng = np.random.default_rng(1)
    assert all(delete_words("alone", 0.99, rng) == "alone" for _ in range(50))
    assert all(len(delete_words("two words here", 0.999, rng).split()) == 1 for _ in range(50))


def test_a_mask_drawn_for_another_word_count_is_refused():
    with pytest.raises(ValueError, match="mask of 2 words for a text of 3"):
        keep_words("three words here", np.ones(2, bool))
