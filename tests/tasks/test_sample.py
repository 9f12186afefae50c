"""tasks/sample.py: the documents `embforge select`'s yardstick ranks among on a large corpus."""

import pandas as pd
import pytest

from storage.catalog import YARDSTICK_TOP
from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.config.evaluation import YardstickConfig
from tasks.core.held_out import held_out_documents, held_out_queries
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.evaluate import EVALUATE, EvalJob, EvaluateInputs
from tasks.ingest import INGEST
from tasks.sample import SAMPLE, SampleConfig, SampleInputs
from tasks.yardstick import NOT_DRAWN, YARDSTICK, YardstickInputs, YardstickJob
from tests.helpers import DEMO_DOCS

TITLES = YardstickJob(kind="titles", held_out=0.2)
LABELS = YardstickJob(kind="labels", held_out=0.2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """200 demo documents in a store; the same documents in the reverse order in another."""
    tmp = tmp_path_factory.mktemp("sample")
    docs = pd.read_parquet(DEMO_DOCS).head(200)
    docs.to_parquet(tmp / "docs.parquet")
    docs.iloc[::-1].to_parquet(tmp / "reversed.parquet")
    store = ArtifactStore(tmp / "store")
    documents, reversed_docs = (INGEST.run(store, DataConfig(path=str(tmp / f"{name}.parquet")), NoInputs())
                                for name in ("docs", "reversed"))
    return store, documents, reversed_docs, docs


def sampled(store, documents, yardstick: YardstickConfig, size: int):
    ref = YARDSTICK.run(store, yardstick, YardstickInputs(documents=documents))
    sample = SAMPLE.run(store, SampleConfig(size=size), SampleInputs(documents=documents, yardstick=ref))
    return ref, sample, store.read_table(sample, "documents").to_pandas()


def test_the_titles_sample_holds_every_asking_document_and_a_sample_drawn_by_id(corpus):
    store, documents, reversed_docs, docs = corpus
    ref, sample, got = sampled(store, documents, TITLES, 30)
    asking = set(held_out_queries(store, ref)["doc_id"].to_pylist())
    assert asking <= set(got["doc_id"]) and len(got) == len(asking) + 30
    assert got["doc_id"].tolist() == [d for d in docs["doc_id"] if d in set(got["doc_id"])]  # the corpus's order
    assert got.columns.tolist() == store.read_table(documents, "documents").column_names
    assert store.manifest(sample)["extra"] == {"documents": len(asking) + 30, "of": 200, "needed": len(asking)}
    # The same documents whatever order the corpus lists them in.
    assert set(sampled(store, reversed_docs, TITLES, 30)[2]["doc_id"]) == set(got["doc_id"])


def test_the_labels_sample_draws_the_documents_it_ranks_and_keeps_a_document_of_every_label_asked(corpus, tiny_dir):
    store, documents, _, docs = corpus
    held = held_out_documents(docs["doc_id"].tolist(), LABELS)
    ref, sample, got = sampled(store, documents, LABELS, 3)  # fewer than the labels asked for: one of each comes in
    asking = held_out_queries(store, ref).to_pandas()
    others = got[~got["doc_id"].isin(held)]
    assert set(asking["doc_id"]) <= set(got["doc_id"]) and others["label"].notna().all()
    assert set(asking["query"]) <= set(others["label"]) and 3 <= len(others) <= 3 + len(set(asking["query"]))
    assert not set(got["doc_id"]) & (held - set(asking["doc_id"]))  # held-out documents that ask nothing are out
    # The evaluate stage ranks on the sample as on a corpus: every asking query scored.
    embedded = EMBED.run(store, EmbedJob(model=tiny_dir, max_length=32, batch_size=16), EmbedInputs(documents=sample))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=sample, embeddings=embedded, yardstick=ref))
    metrics = store.read_table(scores, "metrics").to_pandas().set_index("metric")
    assert metrics.loc["label_ndcg_at_10", "n"] == len(asking)


def test_the_clusters_sample_is_a_draw_and_every_sampled_document_asks(corpus, tiny_dir):
    store, documents, _, docs = corpus
    ref, sample, got = sampled(store, documents, TITLES.model_copy(update={"kind": "clusters"}), 30)
    assert len(got) == 30 and store.manifest(sample)["extra"] == {"documents": 30, "of": 200, "needed": 0}
    embedded = EMBED.run(store, EmbedJob(model=tiny_dir, max_length=32, batch_size=16), EmbedInputs(documents=sample))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=sample, embeddings=embedded, yardstick=ref))
    top = store.read_table(scores, YARDSTICK_TOP).to_pandas()
    assert top["query_id"].tolist() == ("doc-" + got["doc_id"]).tolist() and top["own"].tolist() == list(range(30))


def test_at_most_max_queries_ask_drawn_by_id_and_the_rest_stay_held_out(corpus):
    store, documents, reversed_docs, docs = corpus
    capped = TITLES.model_copy(update={"max_queries": 5})
    ref = YARDSTICK.run(store, capped, YardstickInputs(documents=documents))
    queries = store.read_table(ref, "queries").to_pandas()
    titled = held_out_documents(docs["doc_id"].tolist(), TITLES) & set(docs.loc[docs["title"].notna(), "doc_id"])
    assert set(queries["doc_id"]) == titled and (queries["status"] == "ok").sum() == 5
    assert set(queries["status"]) == {"ok", NOT_DRAWN} and store.manifest(ref)["extra"]["queries"] == 5
    again = store.read_table(YARDSTICK.run(store, capped, YardstickInputs(documents=reversed_docs)), "queries")
    assert set(held_out_queries(store, ref)["query_id"].to_pylist()) == {
        q for q, s in zip(again["query_id"].to_pylist(), again["status"].to_pylist()) if s == "ok"}
    _, _, got = sampled(store, documents, capped, 10)  # the sample needs the 5 only
    assert len(got) == 15


def test_the_qrels_sample_holds_every_document_judged_relevant_to_an_asking_query(corpus, tmp_path):
    store, documents, _, docs = corpus
    held = sorted(held_out_documents(docs["doc_id"].tolist(), TITLES))
    pd.DataFrame({"query_id": ["a", "a", "b"], "query": ["one", "one", "two"], "doc_id": held[:3],
                  "score": 1}).to_parquet(tmp_path / "qrels.parquet")
    _, sample, got = sampled(store, documents, TITLES.model_copy(update={"kind": "qrels",
                                                                      "qrels": str(tmp_path / "qrels.parquet")}), 4)
    assert set(held[:3]) <= set(got["doc_id"]) and len(got) == 7 and store.manifest(sample)["extra"]["needed"] == 3
    # One query drawn: only its judged documents are relevant pairs, and needed.
    capped = TITLES.model_copy(update={"kind": "qrels", "qrels": str(tmp_path / "qrels.parquet"), "max_queries": 2})
    pd.DataFrame({"query_id": ["a", "a", "b", "c"], "query": ["one", "one", "two", "three"], "doc_id": held[:4],
                  "score": 1}).to_parquet(tmp_path / "qrels.parquet")
    ref, _, got = sampled(store, documents, capped, 4)
    asking = held_out_queries(store, ref)["query_id"].to_pylist()
    relevant = store.read_table(ref, "relevant").to_pandas()
    assert len(asking) == 2 and set(relevant["query_id"]) == set(asking)
    assert len(got) == len(relevant) + 4 and set(relevant["doc_id"]) <= set(got["doc_id"])
