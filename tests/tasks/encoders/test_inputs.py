"""tasks/encoders/inputs.py: what a training step gets, from texts or from the ids the tokens stage stored."""

import numpy as np
import pandas as pd
import pytest
import torch

from tasks.config.training import COMPILE_PAD
from tasks.encoders.budget import char_budget, cut_texts
from tasks.encoders.inputs import NO_WORD, Tokens, features, padded_tokens, tokenize, word_tokenize
from tasks.encoders.models import sentence_model
from tests.helpers import DEMO_DOCS, mixed_lengths


def test_a_long_training_text_is_cut_before_tokenizing_and_gives_the_same_tokens(tiny_dir, monkeypatch):
    model = sentence_model(tiny_dir, max_length=32)
    long = " ".join(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(50))  # natural text
    assert len(long) > 10 * char_budget(32)
    seen, call = [], model.tokenizer.__call__
    monkeypatch.setattr(type(model.tokenizer), "__call__",
                        lambda self, texts, *a, **kw: seen.extend(map(len, texts)) or call(texts, *a, **kw))
    cut = features(model, [long, "a short one"])
    assert max(seen) == char_budget(32)
    whole = model.preprocess([long, "a short one"])  # tokenized whole, then truncated
    assert max(seen) == len(long)
    assert cut["input_ids"].tolist() == whole["input_ids"].tolist()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_step_gets_the_tensors_sentence_transformers_gives(tiny_dir, compiled):
    # tokenize converts the tokenizer's lists itself (token_arrays), faster than transformers' conversion
    model = sentence_model(tiny_dir, max_length=64, compile=compiled)
    texts = mixed_lengths(40)
    ours = features(model, texts)
    lists = model.preprocess(texts, processing_kwargs={"common": {"return_tensors": None}})
    assert isinstance(lists["input_ids"], list)  # the tokenizer's lists, which token_arrays converts
    kwargs = {"text": {"pad_to_multiple_of": COMPILE_PAD}} if compiled else None
    theirs = model.preprocess(cut_texts(texts, 64), processing_kwargs=kwargs)
    assert ours.keys() == theirs.keys() == {"input_ids", "token_type_ids", "attention_mask", "modality"}
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key].dtype == torch.int64 and torch.equal(ours[key], theirs[key])
    assert ours["input_ids"].shape[1] == (64 if compiled else theirs["attention_mask"].sum(1).max())
    assert features(model, []) == {}


def stored(encoded: dict) -> list[Tokens]:
    """Unpadded ids (and words) as the tokens stage stores them: int32 arrays."""
    words = encoded.get("word_ids") or [None] * len(encoded["input_ids"])
    return [Tokens(np.array(i, np.int32), None if w is None else np.array(w, np.int32))
            for i, w in zip(encoded["input_ids"], words)]


def same(ours: dict, theirs: dict) -> bool:
    return ours.keys() == theirs.keys() and all(
        torch.equal(v, theirs[k]) if isinstance(v, torch.Tensor) else v == theirs[k] for k, v in ours.items())


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_stored_ids_padded_give_the_tensors_their_texts_give(tiny_dir, compiled, side):
    model = sentence_model(tiny_dir, max_length=64 if compiled else 48, compile=compiled)
    model.tokenizer.padding_side = side
    texts = mixed_lengths(40)
    if compiled:  # rows of 45 tokens at most, so that padding rounds the longest up to 64
        texts = [t for t, ids in zip(texts, tokenize(model, texts, padded=False)["input_ids"]) if len(ids) <= 45]
    unpadded = tokenize(model, texts, padded=False)
    lengths = [len(ids) for ids in unpadded["input_ids"]]
    assert COMPILE_PAD < max(lengths) <= 45 if compiled else max(lengths) == 48  # uncompiled: some cut at 48
    assert min(lengths) < 20  # unpadded
    ours, theirs = features(model, stored(unpadded)), features(model, texts)
    assert same(ours, theirs) and ours["input_ids"].dtype == torch.int64
    assert ours["input_ids"].shape[1] == (2 * COMPILE_PAD if compiled else 48)
    assert (theirs["attention_mask"][:, 0 if side == "left" else -1] == 0).any()  # padded on that side
    words = word_tokenize(model, texts, padded=False)
    ours, theirs = padded_tokens(model, stored(words), words=True), word_tokenize(model, texts)
    assert same(ours, theirs) and (ours["word_ids"] == NO_WORD).any() and ours["word_ids"].max() > 5


def test_whole_word_masking_without_stored_words_is_refused(tiny_dir):
    model = sentence_model(tiny_dir, max_length=32)
    with pytest.raises(ValueError, match="word_ids"):
        padded_tokens(model, stored(tokenize(model, ["a text", "another one"], padded=False)), words=True)
