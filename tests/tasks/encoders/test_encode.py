"""tasks/encoders/encode.py: a text is cut to a character budget before it is tokenized, so a huge
document costs what a normal one does, and keeps the vector it would have had."""

import subprocess
import sys

import numpy as np
import pandas as pd
import torch

from tasks.encoders import budget
from tasks.encoders.budget import char_budget
from tasks.encoders.encode import MODEL_MASK, PooledEncoder
from tests.helpers import DEMO_DOCS, REPO


def test_a_long_text_is_cut_before_tokenizing_and_keeps_its_vector(tiny_dir, monkeypatch):
    abstracts = pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(200)
    long = " ".join(abstracts)  # natural text, far over the budget
    assert len(long) > 10 * char_budget(64)
    encoder = PooledEncoder(tiny_dir, device="cpu")
    tokenized, tokenize = [], encoder.tokenizer.__call__
    monkeypatch.setattr(type(encoder.tokenizer), "__call__",
                        lambda self, texts, **kw: tokenized.extend(map(len, texts)) or tokenize(texts, **kw))
    cut = encoder.encode([long, "a short one"], max_length=64)
    assert max(tokenized) == char_budget(64)
    monkeypatch.setattr(budget, "CHARS_PER_TOKEN", 10**9)  # no cut: the whole text tokenized, then truncated
    whole = encoder.encode([long, "a short one"], max_length=64)
    assert max(tokenized) == len(long)
    np.testing.assert_array_equal(cut, whole)


# A 50 MB document tokenized whole took 7.47 GB of memory and ~55 s (issue 27).
# The peak is this process's own (VmHWM): ru_maxrss after exec also counts the parent's peak at the fork,
# which in a long test session is already over 2 GB.
HUGE = """
import re, sys
from pathlib import Path
from tasks.encoders.encode import PooledEncoder
vector = PooledEncoder(sys.argv[1], device="cpu").encode(["word " * 10_000_000], max_length=256)
print(vector.shape, int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1]) // 1024)
"""


def test_a_50_mb_document_is_encoded_in_bounded_memory(tiny_dir):
    done = subprocess.run([sys.executable, "-c", HUGE, tiny_dir], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shape, peak_mb = done.stdout.rsplit(")", 1)
    assert shape == "(1, 32" and int(peak_mb) < 2000  # the process with torch and the model: ~700 MB


def test_a_batch_gets_the_tensors_the_tokenizer_would_give(tiny_dir):
    # _inputs converts the tokenizer's lists itself (models.token_arrays), faster than transformers' conversion
    encoder = PooledEncoder(tiny_dir, device="cpu")
    texts = list(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(20)) + ["A short one."]
    ours = encoder._inputs(texts, 64)
    theirs = encoder.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    assert ours.keys() == {*theirs.keys(), MODEL_MASK} and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # SDPA's mask, made on the host: True where a token takes part, none for a batch without padding
    assert torch.equal(ours[MODEL_MASK], theirs["attention_mask"][:, None, None, :].bool())
    assert encoder._inputs(texts[:1], 64)[MODEL_MASK] is None


def test_a_batch_runs_without_reading_the_device_and_gives_the_model_s_own_vectors(tiny_dir, monkeypatch):
    # On a GPU reading a value back waits for every batch queued before it: the model's own check for padding
    # (transformers' mask) did, once per batch. Here any tensor read as a Python value during a batch counts.
    encoder = PooledEncoder(tiny_dir, device="cpu")
    texts = list(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(7)) + ["A short one."]
    reads, read = [], torch.Tensor.__bool__
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append(t.shape) or read(t))
    for batch in (texts, texts[:1]):  # padded, and one text: no padding
        inputs = encoder._inputs(batch, 64)
        assert (inputs[MODEL_MASK] is None) == (len(batch) == 1)
        reads.clear()
        vectors = encoder._pooled(inputs, [encoder.n_layers])()
        assert reads == []
        encoder.host_mask = False  # the model makes its mask itself, reading the 2-D one back
        own = encoder._pooled(encoder._inputs(batch, 64), [encoder.n_layers])()
        assert len(reads) == 1
        np.testing.assert_array_equal(vectors, own)
        encoder.host_mask = True


def test_the_next_batch_starts_before_a_batch_s_vectors_are_read(tiny_dir, monkeypatch):
    # On a GPU a batch's vectors come home (pinned memory, no wait) while the next batch runs.
    encoder, events = PooledEncoder(tiny_dir, device="cpu"), []
    started = encoder._pooled

    def pooled(batch: dict, layers: list[int]):
        n = sum(e.startswith("start") for e in events)
        events.append(f"start {n}")
        vectors = started(batch, layers)
        return lambda: events.append(f"read {n}") or vectors()

    monkeypatch.setattr(encoder, "_pooled", pooled)
    texts = list(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(7))
    chunks = list(encoder.encode_chunks(texts, 64, batch_size=3, chunk=3))
    assert events == ["start 0", "start 1", "read 0", "start 2", "read 1", "read 2"]
    assert [len(positions) for positions, _ in chunks] == [3, 3, 1]  # each chunk once all its vectors are home
