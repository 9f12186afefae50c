"""The queries stage: the quality guard, the held-out draw, its keys and the artifact from a scripted
generator, also as the `queries` yardstick's; real generation, killed mid-way and resumed, is
tests/tasks/generation/test_pool.py's."""

import pytest

from storage.store import ArtifactStore
from tasks.config.base import DEFAULT_MODEL
from tasks.config.data import DataConfig
from tasks.config.queries import AskedQueries, AskingDocuments, QueriesConfig, query_sampling
from tasks.core.held_out import held_out_documents, held_out_queries, split_of
from tasks.core.stage import NoInputs
from tasks.encoders.models import resolve_model
from tasks.generation import generate
from tasks.generation.generate import Completion
from tasks.generation.pool import STATUSES
from tasks.ingest import INGEST
from tasks.queries import QUERIES, QueriesInputs, first_line, pool_key, query_status
from tasks.yardstick import YARDSTICK, YardstickInputs, YardstickJob, llm_queries_needed
from tests.helpers import DEMO_DOCS, demo_documents
from tests.tasks.test_summarize import SOURCE  # the same abstract the summaries' guard is tested on

COLUMNS = ["query_id", "doc_id", "sample", "query", "status", "split", "continuation", "finish", "tokens", "model",
           "backend", "sampling", "seed"]


@pytest.mark.parametrize("continuation, expected", [
    (" does aspirin prevent stroke\n", ("does aspirin prevent stroke", True)),
    ("  aspirin stroke risk  \nmore text\n", ("aspirin stroke risk", True)),
    (" a query cut off at the tok", ("a query cut off at the tok", False)),
    ("\nnothing on the first line", ("", True)),
    ("", ("", False)),
])
def test_a_query_is_the_first_line_stripped(continuation, expected):
    assert first_line(continuation) == expected


@pytest.mark.parametrize("query, ended, finish, expected", [
    ("does aspirin prevent stroke", True, "stop", "ok"),
    ("aspirin dose", True, "stop", "ok"),  # two words are a query
    ("aspirin", True, "stop", "empty"),
    ("?", True, "stop", "empty"),
    ("", False, "stop", "empty"),
    ("what is the effect of aspirin on the risk of strokes in", False, "length", "run_on"),
    ("aspirin stroke risk", False, "stop", "ok"),  # the end token before max_tokens: not a run-on
    ("lowers the risk of stroke in older adults", True, "stop", "repeat"),
    ("aspirin lowers the risk of heart attacks in children", True, "stop", "ok"),  # 3 of 7 trigrams copied
])
def test_quality_guard(query, ended, finish, expected):
    assert query_status(query, ended, finish, SOURCE) == expected


def test_held_out_split_is_a_stable_share_of_the_documents():
    ids = [f"doc-{i}" for i in range(600)]
    splits = [split_of(d, 0, 0.1) for d in ids]
    assert set(splits) == {"train", "held_out"}
    assert 0.06 <= splits.count("held_out") / len(ids) <= 0.14
    assert splits == [split_of(d, 0, 0.1) for d in ids]  # the same draw every time
    assert [split_of(d, 1, 0.1) for d in ids] != splits  # another seed, another draw
    assert {split_of(d, 0, 0.0) for d in ids} == {"train"}
    # A larger share holds out a superset: the draw ranks each document once.
    wider = {d for d in ids if split_of(d, 0, 0.3) == "held_out"}
    assert {d for d, s in zip(ids, splits) if s == "held_out"} <= wider and 0.25 <= len(wider) / len(ids) <= 0.35


def test_keys():
    """The stage's key hashes the whole config (as summarize's): prompt, sampling and LLM change it. The
    pool's key is the LLM and sampling only: another prompt, shard size, limit, backend or held-out draw
    reuses the pool's rows."""
    inputs = QueriesInputs(documents=INGEST.ref(DataConfig(path=str(DEMO_DOCS)), NoInputs()))
    job = QueriesConfig(llm="org/llm-a")  # a Hub name: its identity is the name, nothing is loaded
    key = QUERIES.ref(job, inputs).key
    for changed in (dict(prompt="Question:"), dict(sampling=query_sampling().model_copy(update=dict(n=5))),
                    dict(llm="org/llm-b")):
        assert QUERIES.ref(job.model_copy(update=changed), inputs).key != key, changed
    assert pool_key(job.model_copy(update=dict(llm="org/llm-b"))) != pool_key(job)
    assert pool_key(job.model_copy(update=dict(sampling=query_sampling().model_copy(update=dict(top_k=50))))) \
        != pool_key(job)
    for same in (dict(prompt="Question:"), dict(shard_size=3), dict(limit=10), dict(backend="vllm"),
                 dict(held_out=0.5), dict(seed=7)):
        assert pool_key(job.model_copy(update=same)) == pool_key(job), same


class ScriptedGenerator:
    """Per prompt: an ok query, the title copied (repeat), one word (empty), a run-on; counts the prompts."""

    name = "scripted"
    asked: list[str] = []

    def __init__(self, backend, model_dir, sampling):
        assert sampling.n == 4

    def generate(self, prompts):
        type(self).asked += prompts
        return [[Completion(" which scan finds appendicitis in women\n", "stop", 8),
                 Completion(f" {p.split(chr(10))[0]}\n", "stop", 12),
                 Completion(" appendicitis\n", "stop", 3),
                 Completion(" what is the best way to find out whether the", "length", 12)] for p in prompts]

    def close(self):
        pass


def test_artifact_has_n_queries_per_document_labelled_and_split(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "make_generator", ScriptedGenerator)
    monkeypatch.setattr(ScriptedGenerator, "asked", [])
    store = ArtifactStore(tmp_path / "store")
    docs = demo_documents(store, 12)
    # A local folder with a tokenizer stands in for the LLM: the documents are fitted to its context.
    job = QueriesConfig(llm=resolve_model(DEFAULT_MODEL), backend="transformers", limit=8, shard_size=3,
                        held_out=0.4, sampling=query_sampling().model_copy(update=dict(n=4)))
    ref = QUERIES.run(store, job, QueriesInputs(documents=docs))
    table = store.read_table(ref, "queries").to_pandas()
    assert list(table.columns) == COLUMNS and len(table) == 8 * 4 and table["query_id"].is_unique
    assert table.groupby("doc_id")["sample"].apply(list).tolist() == [[0, 1, 2, 3]] * 8
    assert table["status"].tolist() == ["ok", "repeat", "empty", "run_on"] * 8
    assert set(table["status"]) <= set(STATUSES)
    assert table.loc[0, "query"] == "which scan finds appendicitis in women"
    assert (table.groupby("doc_id")["split"].nunique() == 1).all()  # a document's queries share its split
    assert table["split"].tolist() == [split_of(d, 0, 0.4) for d in table["doc_id"]]
    assert set(table["split"]) == {"train", "held_out"}
    stats = store.read_table(ref, "stats").to_pandas()
    assert list(stats.columns) == ["status", "split", "count"] and stats["count"].sum() == len(table)
    extra = store.manifest(ref)["extra"]
    assert extra["generated"] == 32 and extra["reused"] == 0 and extra["cut"] == 0
    assert extra["status"] == dict(ok=8, empty=8, run_on=8, repeat=8)
    assert extra["held_out"] == table.drop_duplicates("doc_id")["split"].eq("held_out").sum()
    assert len(ScriptedGenerator.asked) == 8 and ScriptedGenerator.asked[0].endswith("\n" + job.prompt)
    assert len(store.pool("queries", pool_key(job)).shards()) == 3  # 3 + 3 + 2 documents
    assert store.pool("summaries", pool_key(job)).shards() == []  # a pool of their own

    # More documents: only the new ones are generated; the first eight keep their queries, ids and splits.
    more = store.read_table(QUERIES.run(store, job.model_copy(update=dict(limit=12)),
                                        QueriesInputs(documents=docs)), "queries").to_pandas()
    assert len(ScriptedGenerator.asked) == 12 and len(more) == 12 * 4
    assert more.merge(table, on=COLUMNS).shape[0] == len(table)


def test_the_yardstick_s_queries_are_written_for_its_held_out_documents_only(tmp_path, monkeypatch):
    """An AskedQueries job (the `queries` yardstick's): only the held-out documents are asked, at most `most` of them,
    every query `held_out`; the yardstick then asks each usable one for its own document."""
    monkeypatch.setattr(generate, "make_generator", ScriptedGenerator)
    monkeypatch.setattr(ScriptedGenerator, "asked", [])
    store = ArtifactStore(tmp_path / "store")
    docs = demo_documents(store, 40)
    ids = store.read_table(docs, "documents", ["doc_id"])["doc_id"].to_pylist()
    share = YardstickJob(kind="queries", held_out=0.3, seed=1)
    held = held_out_documents(ids, share)
    asking = AskingDocuments(held_out=0.3, seed=1, most=len(held) - 2)
    job = AskedQueries(llm=resolve_model(DEFAULT_MODEL), backend="transformers", asking=asking,
                       sampling=query_sampling().model_copy(update=dict(n=4)))
    table = store.read_table(QUERIES.run(store, job, QueriesInputs(documents=docs)), "queries").to_pandas()
    assert set(table["doc_id"]) < held and table["doc_id"].nunique() == len(held) - 2
    assert set(table["split"]) == {"held_out"} and len(ScriptedGenerator.asked) == len(held) - 2

    ref = YARDSTICK.run(store, share, YardstickInputs(documents=docs, generated=QUERIES.run(store, job, QueriesInputs(
        documents=docs))))
    asked = held_out_queries(store, ref).to_pandas()
    ok = table[table["status"] == "ok"]
    assert sorted(asked["query_id"]) == sorted(ok["query_id"]) and (asked.set_index("query_id")["doc_id"] ==
                                                                     ok.set_index("query_id")["doc_id"]).all()
    assert store.manifest(ref)["extra"] == {"kind": "queries", "held_out": len(held), "share": 0.3,
                                            "queries": len(ok), "needed": ok["doc_id"].nunique()}
    assert len(ScriptedGenerator.asked) == len(held) - 2  # the second run came from the cache


@pytest.mark.parametrize("kind, titled, per_token, small_pool, needed", [
    ("auto", 0, False, False, False), ("neighbours", 0, False, False, False), ("queries", 5, False, False, True),
    ("consensus", 0, False, False, True), ("consensus", 5, False, False, False), ("titles", 0, False, False, False),
    ("auto", 0, True, False, True), ("auto", 5, True, False, False), ("neighbours", 0, True, False, False),
    ("auto", 0, False, True, True), ("auto", 5, False, True, False), ("clusters", 0, False, True, False),
    ("auto", 4, True, False, True), ("consensus", 4, False, False, True), ("auto", 4, False, True, True)])
def test_when_an_llm_writes_the_yardstick_s_queries(kind, titled, per_token, small_pool, needed):
    # auto: the clusters need no LLM; where a multi-vector model is ranked, without labels, MaxSim needs queries; where
    # too few models are ranked to judge each other, no pooled kind can decide; titles on fewer than half of the 10
    # documents are no titles
    job = YardstickJob(kind=kind, per_token=per_token, small_pool=small_pool)
    assert llm_queries_needed(job, {"titled": titled, "labelled": 0}, 10) is needed
    for small, per_token in ((False, False), (True, False), (False, True)):  # the user's queries ask
        job = YardstickJob(qrels="q.parquet", small_pool=small, per_token=per_token)
        assert llm_queries_needed(job, {"titled": 0}, 10) is False
        # labels on most documents rank a multi-vector model (by MaxSim) and decide in a small pool: no LLM's queries
        # either; labels on a few (2 of 10) may ask too few, or be dropped for the queries: those are written
        job = YardstickJob(small_pool=small, per_token=per_token)
        assert llm_queries_needed(job, {"titled": 0, "labelled": 8}, 10) is False
        assert llm_queries_needed(job, {"titled": 0, "labelled": 2}, 10) is (small or per_token)
