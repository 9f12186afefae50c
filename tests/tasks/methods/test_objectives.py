"""tasks/methods/objectives.py: what a training step tokenizes."""

import pandas as pd
import pytest
import torch

from tasks.config.training import COMPILE_PAD
from tasks.encoders.budget import char_budget, cut_texts
from tasks.encoders.models import sentence_model
from tasks.methods.objectives import features, token_counts
from tests.helpers import DEMO_DOCS, mixed_lengths


def test_a_long_training_text_is_cut_before_tokenizing_and_gives_the_same_tokens(tiny_dir, monkeypatch):
    model = sentence_model(tiny_dir, max_length=32)
    long = " ".join(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(50))  # natural text
    assert len(long) > 10 * char_budget(32)
    seen, tokenize = [], model.tokenizer.__call__
    monkeypatch.setattr(type(model.tokenizer), "__call__",
                        lambda self, texts, *a, **kw: seen.extend(map(len, texts)) or tokenize(texts, *a, **kw))
    cut = features(model, [long, "a short one"])
    assert max(seen) == char_budget(32)
    whole = model.preprocess([long, "a short one"])  # tokenized whole, then truncated
    assert max(seen) == len(long)
    assert cut["input_ids"].tolist() == whole["input_ids"].tolist()


def test_group_by_length_counts_the_tokens_a_step_gets_without_its_padding(tiny_dir):
    model = sentence_model(tiny_dir, max_length=32)
    texts = ["a", "a short one", *pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(6)]  # some over 32
    counts = token_counts(model, texts)
    assert counts[:2] == [3, 5]  # [CLS] a [SEP]; [CLS] a short one [SEP]: the batch's padding to 32 left out
    assert max(counts) == 32  # cut to max_length


@pytest.mark.parametrize("compiled", [False, True])
def test_a_step_gets_the_tensors_sentence_transformers_gives(tiny_dir, compiled):
    # features converts the tokenizer's lists itself (token_arrays), faster than transformers' conversion
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
