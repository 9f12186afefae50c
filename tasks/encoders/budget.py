"""The character budget every tokenizing path cuts a text to before tokenizing (embed, training,
MTEB, summaries): a tokenizer reads a whole text and only then truncates, so a 50 MB document took
7.5 GB and ~55 s per model. Cut first, memory and time per text are bounded whatever its size.

English runs ~4-5 characters a token and a WordPiece word over 100 characters is one [UNK], so the
first max_length tokens come from the kept part unless the text is mostly whitespace or such words.
"""

CHARS_PER_TOKEN = 32


def char_budget(max_length: int) -> int:
    return max_length * CHARS_PER_TOKEN


def cut_texts(texts: list[str], max_length: int) -> list[str]:
    """`texts` cut to the budget of `max_length` tokens (what fits is kept as it is)."""
    budget = char_budget(max_length)
    return [text[:budget] for text in texts]


def over_budget(texts: list[str], max_length: int) -> int:
    """How many of `texts` `cut_texts` cuts."""
    budget = char_budget(max_length)
    return sum(len(text) > budget for text in texts)
