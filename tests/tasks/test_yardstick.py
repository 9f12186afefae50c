"""tasks/yardstick.py: a held-out share of the corpus as a retrieval task (by labels, or by titles), kept out of
training."""

import numpy as np
import pandas as pd
import pytest
import torch
from sentence_transformers.util import maxsim

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_SCORES, YARDSTICK_TOP
from storage.store import ArtifactStore
from tasks import embed
from tasks.config.base import InputError
from tasks.config.data import DataConfig, SentenceConfig
from tasks.config.evaluation import KnnConfig, MaxSimSearch, YardstickConfig
from tasks.config.splits import AUTO_SHARES, ENOUGH_HELD_OUT
from tasks.config.training import MethodConfig
from tasks.config.yardsticks import MIN_POOL
from tasks.core.held_out import held_out_documents, held_out_queries
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.encoders.encode import PooledEncoder
from tasks.evaluate import EVALUATE, QUERY_SCORES, EvalJob, EvaluateInputs
from tasks.ingest import INGEST
from tasks.metrics import retrieval, unit_rows
from tasks.metrics.pool import cluster_purity, pool_scores
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.yardstick import NO_RELEVANT, TRAINED_ON, YARDSTICK, YardstickInputs, YardstickJob, llm_queries_needed
from tests.helpers import DEMO_DOCS

CFG = YardstickJob(kind="titles", held_out=0.2)
AUTO = YardstickJob(held_out=0.2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A store with 80 demo documents (labelled; titled, the last 10 without a title), their sentences and the titles
    yardstick."""
    tmp = tmp_path_factory.mktemp("yardstick")
    docs = pd.read_parquet(DEMO_DOCS).head(80)
    docs.loc[docs.index[-10:], "title"] = [None, "", "  "] * 3 + [None]
    docs.to_parquet(tmp / "docs.parquet")
    store = ArtifactStore(tmp / "store")
    documents = INGEST.run(store, DataConfig(path=str(tmp / "docs.parquet")), NoInputs())
    sentences = SENTENCES.run(store, SentenceConfig(), SentencesInputs(documents=documents))
    return store, documents, sentences, docs, YARDSTICK.run(store, CFG, YardstickInputs(documents=documents))


def test_the_held_out_documents_are_a_share_drawn_by_document_alone():
    ids = [f"doc-{i}" for i in range(4_000)]
    held = held_out_documents(ids, CFG)
    assert 0.17 < len(held) / len(ids) < 0.23
    assert held_out_documents(ids[:1_000], CFG) == held & set(ids[:1_000])  # a larger corpus moves none
    assert held_out_documents(ids, CFG.model_copy(update={"seed": 1})) != held


@pytest.mark.parametrize(("documents", "share"), [(400, 0.25), (2_000, 0.25), (4_000, 0.125), (20_000, 0.1)])
def test_an_auto_share_holds_out_enough_documents_for_a_gain_of_0_03_within_its_bounds(documents, share):
    auto = CFG.model_copy(update={"held_out": "auto"})
    assert auto.share(documents) == share
    ids = [f"doc-{i}" for i in range(documents)]
    held = held_out_documents(ids, auto)
    assert held == held_out_documents(ids, CFG.model_copy(update={"held_out": share}))
    low, high = AUTO_SHARES
    assert abs(len(held) - min(max(ENOUGH_HELD_OUT, low * documents), high * documents)) < 4 * documents ** 0.5


def test_each_titled_held_out_document_asks_for_itself_by_its_title(corpus):
    store, _, _, docs, ref = corpus
    queries = held_out_queries(store, ref).to_pandas()  # as the in-domain retrieval evaluation reads queries
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    titled = docs[docs["title"].fillna("").str.strip().str.len() > 0]
    assert set(queries["doc_id"]) == held & set(titled["doc_id"]) and len(queries) >= 2
    assert len(held - set(titled["doc_id"])) > 0  # the untitled held-out ones ask nothing
    assert (queries["query"] == queries["doc_id"].map(dict(zip(docs["doc_id"], docs["title"])))).all()
    assert store.manifest(ref)["extra"] == {"kind": "titles", "held_out": len(held), "share": 0.2,
                                            "queries": len(queries), "needed": len(queries)}  # each its own text


def test_no_training_view_reads_a_held_out_document(corpus):
    store, documents, sentences, docs, _ = corpus
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    for recipe in ("crops", "dropout", "tsdae"):  # the crops, same and noise views
        view = PairsConfig.for_method(MethodConfig(name=recipe, recipe=recipe), epochs=1)
        # every kind holds out the same documents, so one pairs artifact serves them all
        assert PairsConfig.for_method(MethodConfig(name=recipe, recipe=recipe), 1, yardstick=AUTO) == \
            PairsConfig.for_method(MethodConfig(name=recipe, recipe=recipe), 1, yardstick=CFG)
        plain = store.read_table(PAIRS.run(store, view, PairsInputs.for_view(view, sentences, documents, None)),
                                 "pairs")
        assert held & set(plain["doc_id"].to_pylist())  # without the yardstick, some are trained on
        view = view.model_copy(update={"yardstick": CFG})
        kept = store.read_table(PAIRS.run(store, view, PairsInputs.for_view(view, sentences, documents, None)),
                                "pairs")
        assert kept.num_rows and not held & set(kept["doc_id"].to_pylist()), recipe


def test_the_evaluation_ranks_each_title_s_document_among_the_corpus(corpus, tiny_dir):
    store, documents, _, docs, ref = corpus
    embed = dict(model=tiny_dir, max_length=64, batch_size=16)
    doc_emb = EMBED.run(store, EmbedJob(**embed), EmbedInputs(documents=documents))
    query_emb = EMBED.run(store, EmbedJob(**embed), EmbedInputs(held_out_queries=ref))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=KnnConfig(k=3, repeats=1), sts=None, tsne=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=doc_emb, queries=ref,
                                                     query_embeddings=query_emb))
    queries = held_out_queries(store, ref).to_pandas()
    encoder = PooledEncoder(tiny_dir, "cpu")
    position = {d: i for i, d in enumerate(docs["doc_id"])}
    ranks = retrieval.relevant_ranks(encoder.encode(queries["query"].tolist(), 64), encoder.encode(
        docs["text"].tolist(), 64), np.array([position[d] for d in queries["doc_id"]]))
    assert store.read_table(scores, QUERY_SCORES)["rank"].to_pylist() == ranks.tolist()


def test_a_corpus_without_titles_is_one_clear_error(tmp_path):
    docs = pd.read_parquet(DEMO_DOCS).head(30).assign(title=None)
    docs.to_parquet(tmp_path / "docs.parquet")
    store = ArtifactStore(tmp_path / "store")
    documents = INGEST.run(store, DataConfig(path=str(tmp_path / "docs.parquet")), NoInputs())
    with pytest.raises(InputError, match=r"yardstick titles: 0 of the \d+ held-out documents \(20% of the corpus\) "
                                         "have a title; it needs at least 2"):
        YARDSTICK.run(store, CFG, YardstickInputs(documents=documents))


def test_auto_takes_the_labels_where_the_held_out_documents_have_them(corpus, tmp_path):
    store, documents, _, docs, _ = corpus
    ref = YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents))
    queries = store.read_table(ref, "queries").to_pandas()
    labels = YARDSTICK.run(store, AUTO.model_copy(update={"kind": "labels"}), YardstickInputs(documents=documents))
    assert store.read_table(labels, "queries").to_pandas().equals(queries)
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    label_of = dict(zip(docs["doc_id"], docs["label"]))
    assert set(queries["doc_id"]) == held and (queries["query"] == queries["doc_id"].map(label_of)).all()
    known = {label_of[d] for d in set(docs["doc_id"]) - held}
    assert (queries["status"] == queries["query"].map(lambda label: "ok" if label in known else NO_RELEVANT)).all()
    asking = int((queries["status"] == "ok").sum())
    assert asking >= 2 and store.manifest(ref)["extra"] == {"kind": "labels", "held_out": len(held), "share": 0.2,
                                                          "queries": asking, "needed": asking}
    assert len(held_out_queries(store, ref)) == asking  # what the report pairs over
    # Where a multi-vector model is among those ranked, `auto` still takes the labels (MaxSim ranks each labelled
    # document against the others); unlabelled, the titles
    by_text = YARDSTICK.run(store, AUTO.model_copy(update={"per_token": True}), YardstickInputs(documents=documents))
    assert store.manifest(by_text)["extra"]["kind"] == "labels"
    pd.read_parquet(DEMO_DOCS).head(80).drop(columns="label").to_parquet(tmp_path / "unlabelled.parquet")
    unlabelled = INGEST.run(store, DataConfig(path=str(tmp_path / "unlabelled.parquet")), NoInputs())
    by_text = YARDSTICK.run(store, AUTO.model_copy(update={"per_token": True}), YardstickInputs(documents=unlabelled))
    assert store.manifest(by_text)["extra"]["kind"] == "titles"


def test_a_label_no_other_document_has_asks_nothing_and_unlabelled_documents_are_not_asked(tmp_path):
    docs = pd.read_parquet(DEMO_DOCS).head(80)
    held = sorted(held_out_documents(docs["doc_id"].tolist(), CFG))
    docs.loc[docs["doc_id"] == held[0], "label"] = "only here"
    docs.loc[docs["doc_id"] == held[1], "label"] = None
    docs.to_parquet(tmp_path / "docs.parquet")
    store = ArtifactStore(tmp_path / "store")
    documents = INGEST.run(store, DataConfig(path=str(tmp_path / "docs.parquet")), NoInputs())
    queries = store.read_table(YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents)), "queries")
    status = dict(zip(queries["doc_id"].to_pylist(), queries["status"].to_pylist()))
    assert status[held[0]] == NO_RELEVANT and held[1] not in status and set(status) == set(held) - {held[1]}


def test_the_labels_yardstick_ranks_each_held_out_document_s_label_among_the_documents_not_held_out(tmp_path, tiny_dir):
    docs = pd.read_parquet(DEMO_DOCS).head(80)
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    # a held-out document with a label of its own asks nothing; an unlabelled one outside is in no answer
    docs.loc[docs["doc_id"] == sorted(held)[0], "label"] = "only here"
    docs.loc[docs.index[~docs["doc_id"].isin(held)][0], "label"] = None
    docs.to_parquet(tmp_path / "docs.parquet")
    store = ArtifactStore(tmp_path / "store")
    documents = INGEST.run(store, DataConfig(path=str(tmp_path / "docs.parquet")), NoInputs())
    ref = YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents))
    doc_emb = EMBED.run(store, EmbedJob(model=tiny_dir, max_length=64, batch_size=16), EmbedInputs(documents=documents))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=doc_emb, yardstick=ref))
    got = store.read_table(scores, YARDSTICK_SCORES).to_pandas().set_index("query_id")
    # By hand: every document's vector; each asking document against the labelled ones not held out, best first.
    x = unit_rows(PooledEncoder(tiny_dir, "cpu").encode(docs["text"].tolist(), 64))
    index = [i for i, d in enumerate(docs["doc_id"]) if d not in held and pd.notna(docs["label"].iloc[i])]
    labels = docs["label"].to_numpy()
    asked = held_out_queries(store, ref).to_pandas()
    assert len(got) == len(asked) == len(held) - 1
    for query_id, doc in zip(asked["query_id"], asked["doc_id"]):
        q = docs.index[docs["doc_id"] == doc][0]
        order = sorted(index, key=lambda i: -float(x[q] @ x[i]))
        same = [labels[i] == labels[q] for i in order]
        ideal = sum(1 / np.log2(r + 2) for r in range(min(10, sum(same))))
        assert got.loc[query_id, "rank"] == same.index(True) + 1
        assert got.loc[query_id, "ndcg"] == pytest.approx(sum(s / np.log2(r + 2) for r, s in enumerate(same[:10])) /
                                                          ideal, abs=1e-5)
    metrics = store.read_table(scores, "metrics").to_pandas().set_index("metric")
    assert metrics.loc["label_ndcg_at_10", "value"] == pytest.approx(got["ndcg"].mean())
    mrr = np.where(got["rank"] <= 10, 1 / got["rank"], 0).mean()
    assert metrics.loc["label_mrr_at_10", "value"] == pytest.approx(mrr)


def test_the_labels_rank_a_multi_vector_model_by_maxsim_between_documents_exactly_or_through_an_index(
        corpus, tiny_colbert_dir):
    store, documents, _, docs, _ = corpus
    ref = YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents))
    assert store.manifest(ref)["extra"]["kind"] == "labels"
    doc_emb = EMBED.run(store, EmbedJob(model=tiny_colbert_dir, max_length=64, batch_size=16, token_vectors=True),
                        EmbedInputs(documents=documents))
    # By hand: each asking document's token vectors against those of the labelled documents not held out, MaxSim
    tokens = [torch.from_numpy(t) for t in embed.read_token_vectors(store, doc_emb)]
    asked = held_out_queries(store, ref).to_pandas()
    row = {d: i for i, d in enumerate(docs["doc_id"])}
    queries = [row[d] for d in asked["doc_id"]]
    index = [i for i, d in enumerate(docs["doc_id"]) if d not in set(asked["doc_id"]) and pd.notna(docs["label"][i])]
    scores = maxsim([tokens[q] for q in queries], [tokens[i] for i in index]).numpy()  # (asked, index)
    labels = docs["label"].to_numpy()
    same = labels[queries][:, None] == labels[index][None, :]
    first = np.where(same, scores, -np.inf).max(1, keepdims=True)
    expected = (scores >= first).sum(1)  # ties against the query
    every = sum(len(t) for t in tokens)  # an index that returns every token vector (faiss fills k results a token)
    for search in (None, MaxSimSearch(exact_up_to=10, nearest=every, probes=every)):  # exact; an index reaching all
        job = EvalJob(label="colbert", model=tiny_colbert_dir, dataset="demo", knn=None, sts=None, tsne=False,
                      geometry=False, maxsim=search)
        scored = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=doc_emb, yardstick=ref))
        got = store.read_table(scored, YARDSTICK_SCORES).to_pandas()
        assert got["query_id"].tolist() == asked["query_id"].tolist() and got["rank"].tolist() == expected.tolist()
        assert store.manifest(scored)["extra"]["token_mean"]


def test_labels_asked_of_an_unlabelled_corpus_is_one_clear_error_and_auto_takes_the_clusters(tmp_path, caplog):
    docs = pd.read_parquet(DEMO_DOCS).head(30).assign(label=None)
    docs.to_parquet(tmp_path / "titled.parquet")
    docs.assign(title=None).to_parquet(tmp_path / "bare.parquet")
    docs.head(2).to_parquet(tmp_path / "two.parquet")  # one held out
    store = ArtifactStore(tmp_path / "store")
    titled, bare, two = (INGEST.run(store, DataConfig(path=str(tmp_path / f"{name}.parquet")), NoInputs())
                         for name in ("titled", "bare", "two"))
    for documents, kind in ((titled, "titles"), (bare, "clusters")):  # text alone: no LLM needed
        assert store.manifest(YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents)))["extra"]["kind"] == kind
    # ... unless a multi-vector model is among those ranked, or too few models to judge each other: then an LLM
    # writes queries for the held-out documents
    by_text, small = AUTO.model_copy(update={"per_token": True}), AUTO.model_copy(update={"small_pool": True})
    none, titles, labels = {"titled": 0, "labelled": 0}, {"titled": 30, "labelled": 0}, {"titled": 0, "labelled": 30}
    assert not llm_queries_needed(AUTO, none, 30) and llm_queries_needed(by_text, none, 30)
    assert not llm_queries_needed(by_text, titles, 30)
    assert llm_queries_needed(small, none, 30) and not llm_queries_needed(small, titles, 30)
    assert not llm_queries_needed(small, labels, 30) and not llm_queries_needed(
        small.model_copy(update={"qrels": "q"}), none, 30)  # either decides before
    assert store.manifest(YARDSTICK.run(store, small, YardstickInputs(documents=titled)))["extra"]["kind"] == "titles"
    # a pooled kind's confirmation (`single`): titles, else an LLM's queries, never a pool, and labels not asked
    single = AUTO.model_copy(update={"single": True})
    assert llm_queries_needed(single, none, 30) and llm_queries_needed(single, labels, 30)
    assert not llm_queries_needed(single, titles, 30)
    # titles on fewer than half the documents (a part of the corpus they chose) are taken as none; asked by name, used
    few = {"titled": 14, "labelled": 0}
    assert llm_queries_needed(single, few, 30) and llm_queries_needed(by_text, few, 30)
    docs.assign(title=[*docs["title"][:14], *[" "] * 16]).to_parquet(tmp_path / "few.parquet")  # blank: no title
    scarce = INGEST.run(store, DataConfig(path=str(tmp_path / "few.parquet")), NoInputs())
    assert store.manifest(scarce)["extra"]["titled"] == 14
    caplog.clear()
    with caplog.at_level("INFO"):
        assert store.manifest(YARDSTICK.run(store, AUTO, YardstickInputs(documents=scarce)))["extra"]["kind"] == \
            "clusters"
    assert "14 of the 30 documents have a title, fewer than half: the corpus is taken as text alone" in caplog.text
    by_name = YARDSTICK.run(store, AUTO.model_copy(update={"kind": "titles"}), YardstickInputs(documents=scarce))
    assert store.manifest(by_name)["extra"]["kind"] == "titles"
    docs.assign(label=["a", "b"] * 15).to_parquet(tmp_path / "labelled.parquet")
    labelled = INGEST.run(store, DataConfig(path=str(tmp_path / "labelled.parquet")), NoInputs())
    confirming = YARDSTICK.run(store, single, YardstickInputs(documents=labelled))
    assert store.manifest(confirming)["extra"]["kind"] == "titles"
    with pytest.raises(InputError, match=r"^yardstick titles: none of the 30 documents has a title: a title column "
                                         r"\(data.columns.title\); or "
                                         r"`select.confirm: false`, to let the pooled kind decide against "
                                         "the untrained model alone$"):  # neither titles nor an LLM's queries
        YARDSTICK.run(store, single, YardstickInputs(documents=bare))
    for kind in ("clusters", "auto"):  # by name, or where nothing else can rank, the clusters, with a warning
        caplog.clear()
        with caplog.at_level("WARNING"):
            ref = YARDSTICK.run(store, small.model_copy(update={"kind": kind}), YardstickInputs(documents=bare))
        assert store.manifest(ref)["extra"]["kind"] == "clusters" and "the clusters' decision is weak" in caplog.text
    with pytest.raises(InputError, match=r"^yardstick titles: none of the 30 documents has a title: a title column "
                                         r"\(data.columns.title\); labels: 0 of the 6 held-out documents .* among 0 "
                                         "labels; it needs at least 2 and 2 labels: more labelled documents or a "
                                         "larger held-out share$"):  # not the clusters, and here no LLM's queries
        YARDSTICK.run(store, by_text, YardstickInputs(documents=bare))
    with pytest.raises(InputError, match=r"yardstick labels: 0 of the \d+ held-out documents \(20% of the corpus\) "
                                         "have a label that a document not held out shares, among 0 labels; it needs "
                                         "at least 2 and 2 labels: more labelled documents or a larger held-out "
                                         "share$"):
        YARDSTICK.run(store, AUTO.model_copy(update={"kind": "labels"}), YardstickInputs(documents=titled))
    with pytest.raises(InputError, match=r"yardstick labels: 0 .*; neighbours: 1 held-out documents \(20% of the "
                                         r"corpus\); it needs at least 2: a larger corpus or a larger held-out share; "
                                         r"clusters: 2 documents; it needs more than 20 \(its groups\): a larger "
                                         "corpus$"):
        YARDSTICK.run(store, AUTO, YardstickInputs(documents=two))


def test_auto_takes_titles_the_clusters_or_in_a_small_pool_the_labels_where_few_documents_carry_one(tmp_path, caplog):
    docs = pd.read_parquet(DEMO_DOCS).head(80)
    held = sorted(held_out_documents(docs["doc_id"].tolist(), CFG))
    docs.loc[docs["doc_id"].isin(held[3:]), "label"] = None  # 3 labelled held-out documents, all titled
    docs.to_parquet(tmp_path / "docs.parquet")
    docs.assign(title=None).to_parquet(tmp_path / "bare.parquet")
    store = ArtifactStore(tmp_path / "store")
    documents, bare = (INGEST.run(store, DataConfig(path=str(tmp_path / f"{name}.parquet")), NoInputs())
                       for name in ("docs", "bare"))
    with caplog.at_level("INFO"):
        ref = YARDSTICK.run(store, AUTO, YardstickInputs(documents=documents))
    assert store.manifest(ref)["extra"]["kind"] == "titles"
    assert f"the titles decide: 3 labelled held-out documents ask, against {len(held)}" in caplog.text
    labels = YARDSTICK.run(store, AUTO.model_copy(update={"kind": "labels"}), YardstickInputs(documents=documents))
    assert store.manifest(labels)["extra"] == {"kind": "labels", "held_out": len(held), "share": 0.2,
                                               "queries": 3, "needed": 3}  # when asked
    with caplog.at_level("INFO"):  # no titles: every document asks, by its own vector, against the held-out count
        ref = YARDSTICK.run(store, AUTO, YardstickInputs(documents=bare))
    assert store.manifest(ref)["extra"] == {"kind": "clusters", "held_out": len(held), "share": 0.2, "queries": 80,
                                            "needed": 0}  # each asks among whatever sample is drawn
    assert f"the clusters decide: 3 labelled held-out documents ask, against {len(held)}" in caplog.text
    queries = held_out_queries(store, ref).to_pandas()
    assert sorted(queries["doc_id"]) == held and (queries["query_id"] == "doc-" + queries["doc_id"]).all()
    with caplog.at_level("INFO"):  # too few models to judge each other: the clusters rival nothing, the labels decide
        ref = YARDSTICK.run(store, AUTO.model_copy(update={"small_pool": True}), YardstickInputs(documents=bare))
    assert store.manifest(ref)["extra"]["kind"] == "labels"
    assert f"fewer than {MIN_POOL} models are ranked (the candidates and the untrained model): a pooled kind" in (
        caplog.text)


def test_the_neighbours_keep_each_held_out_document_s_nearest_others_and_no_score_of_one_model(corpus, tiny_dir):
    store, documents, _, docs, _ = corpus
    ref = YARDSTICK.run(store, CFG.model_copy(update={"kind": "neighbours"}), YardstickInputs(documents=documents))
    doc_emb = EMBED.run(store, EmbedJob(model=tiny_dir, max_length=64, batch_size=16), EmbedInputs(documents=documents))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=doc_emb, yardstick=ref))
    top = store.read_table(scores, YARDSTICK_TOP).to_pandas().set_index("query_id")
    assert YARDSTICK_SCORES not in store.manifest(scores)["rows"]
    assert not store.read_table(scores, "metrics").to_pandas()["metric"].str.startswith("neighbours_").any()
    # By hand: each held-out document's other documents by cosine, best first (never itself)
    x = unit_rows(PooledEncoder(tiny_dir, "cpu").encode(docs["text"].tolist(), 64))
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    assert sorted(top.index) == sorted("doc-" + d for d in held)
    for doc in held:
        q = int(np.flatnonzero(docs["doc_id"] == doc)[0])
        order = [i for i in np.argsort(-(x @ x[q]), kind="stable") if i != q]
        assert list(top.loc[f"doc-{doc}", "top"][:10]) == order[:10]


def test_the_clusters_ask_with_every_document_and_the_pool_groups_the_other_models_vectors(corpus, tiny_dir):
    """Every document asks (none drawn, the held-out share still out of training); the evaluate stage keeps each one's
    10 nearest others and its vector, and pool_scores judges each model by the others' grouping, paired by document."""
    store, documents, _, docs, _ = corpus
    ref = YARDSTICK.run(store, CFG.model_copy(update={"kind": "clusters", "max_queries": 5}),
                        YardstickInputs(documents=documents))
    queries = store.read_table(ref, "queries").to_pandas()
    held = held_out_documents(docs["doc_id"].tolist(), CFG)
    assert queries["doc_id"].tolist() == docs["doc_id"].tolist() and (queries["status"] == "ok").all()
    assert set(queries.loc[queries["split"] == "held_out", "doc_id"]) == held
    assert store.manifest(ref)["extra"] == {"kind": "clusters", "held_out": len(held), "share": 0.2, "queries": 80,
                                            "needed": 0}
    assert store.read_table(ref, "needed").num_rows == 0
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    pool = {}
    for length in (64, 16, 8):  # one model read three ways: three different vectors of the same documents
        emb = EMBED.run(store, EmbedJob(model=tiny_dir, max_length=length, batch_size=16),
                        EmbedInputs(documents=documents))
        pool[length] = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=emb, yardstick=ref))
    top = store.read_table(pool[64], YARDSTICK_TOP).to_pandas()
    assert YARDSTICK_SCORES not in store.manifest(pool[64])["rows"] and len(top) == 80
    x = unit_rows(PooledEncoder(tiny_dir, "cpu").encode(docs["text"].tolist(), 64))
    np.testing.assert_allclose(unit_rows(np.stack(top["vector"].to_numpy())), x, atol=1e-5)
    assert list(top.loc[0, "top"]) == [i for i in np.argsort(-(x @ x[0]), kind="stable") if i != 0][:10]
    judged = pool_scores(store, pool)
    vectors = [embed.read_embeddings(store, store_input(store, pool[m], "embeddings"), "mean") for m in pool]
    by_hand = cluster_purity(vectors, np.arange(80))
    for m, (name, scores) in enumerate(judged.items()):
        assert sorted(scores.index) == sorted("doc-" + docs["doc_id"]) and scores.between(0, 1).all()
        np.testing.assert_allclose(scores["doc-" + docs["doc_id"]].to_numpy(), by_hand[m])


def test_a_sparse_models_clusters_vectors_stay_codes_and_group_as_their_dense_rows(corpus, tiny_dir, tiny_splade_dir):
    """A SPLADE model's vectors for the clusters (a weight for each of 30,522 terms) are stored as its codes, and the
    pool groups them sparse: each model's scores those of its dense rows."""
    from scipy import sparse

    store, documents, _, docs, _ = corpus
    ref = YARDSTICK.run(store, CFG.model_copy(update={"kind": "clusters", "max_queries": 5}),
                        YardstickInputs(documents=documents))
    folder = tiny_splade_dir
    pool = {}
    for model in (tiny_dir, folder):
        emb = EMBED.run(store, EmbedJob(model=model, max_length=16, batch_size=16), EmbedInputs(documents=documents))
        job = EvalJob(label=model, model=model, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
        pool[model] = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=emb, yardstick=ref))
    top = store.read_table(pool[folder], YARDSTICK_TOP)
    assert "vector" not in top.column_names and set(embed.CODES) <= set(top.column_names)
    vectors = [embed.read_vectors(store, store_input(store, pool[m], "embeddings"), "mean") for m in pool]
    assert sparse.issparse(vectors[1]) and vectors[1].shape == (80, 30522)
    by_hand = cluster_purity([vectors[0], vectors[1].toarray()], np.arange(80))
    for m, scores in enumerate(pool_scores(store, pool).values()):
        np.testing.assert_allclose(scores["doc-" + docs["doc_id"]].to_numpy(), by_hand[m])


def store_input(store, ref, role):
    return ArtifactRef("embed", store.manifest(ref)["input_roles"][role])


def write_qrels(path, rows: list[tuple[str, str, str, int]]) -> str:
    pd.DataFrame(rows, columns=["query_id", "query", "doc_id", "score"]).to_parquet(path)
    return str(path)


@pytest.fixture
def qrels(corpus, tmp_path):
    """Queries over the corpus fixture's documents: q-both and q-one ask (every relevant document held out; a score 0
    row is no judgement), q-mixed has a relevant document training may see, q-out only those."""
    _, _, _, docs, _ = corpus
    held = sorted(held_out_documents(docs["doc_id"].tolist(), CFG))
    trained = sorted(set(docs["doc_id"]) - set(held))
    rows = [("q-both", "first question", held[0], 1), ("q-both", "first question", held[1], 2),
            ("q-mixed", "second question", held[2], 1), ("q-mixed", "second question", trained[0], 1),
            ("q-one", "third question", held[3], 1), ("q-one", "third question", trained[1], 0),
            ("q-out", "fourth question", trained[2], 1)]
    return write_qrels(tmp_path / "qrels.parquet", rows), held


def test_your_queries_ask_only_where_every_relevant_document_is_held_out_and_auto_takes_them(corpus, qrels):
    store, documents, _, docs, _ = corpus
    path, held = qrels
    ref = YARDSTICK.run(store, AUTO.model_copy(update={"qrels": path}), YardstickInputs(documents=documents))
    queries = store.read_table(ref, "queries").to_pandas().set_index("query_id")
    assert queries["status"].to_dict() == {"q-both": "ok", "q-mixed": TRAINED_ON, "q-one": "ok", "q-out": TRAINED_ON}
    assert queries.loc["q-both", "query"] == "first question" and queries.loc["q-both", "doc_id"] == held[0]
    relevant = store.read_table(ref, "relevant").to_pandas()
    assert sorted(zip(relevant["query_id"], relevant["doc_id"])) == [("q-both", held[0]), ("q-both", held[1]),
                                                                      ("q-one", held[3])]
    assert store.manifest(ref)["extra"] == {"kind": "qrels", "held_out": len(held), "share": 0.2, "queries": 2,
                                            "needed": 3}
    assert sorted(store.read_table(ref, "needed")["doc_id"].to_pylist()) == sorted([held[0], held[1], held[3]])
    assert held_out_queries(store, ref)["query_id"].to_pylist() == ["q-both", "q-one"]  # what is embedded and paired
    # The held-out documents are the hash's share whatever the kind: the same pairs serve every kind.
    with_qrels = AUTO.model_copy(update={"qrels": path})
    assert PairsConfig.for_method(MethodConfig(name="crops", recipe="crops"), 1, yardstick=with_qrels) == \
        PairsConfig.for_method(MethodConfig(name="crops", recipe="crops"), 1, yardstick=CFG)


def test_your_queries_file_is_keyed_by_its_bytes_and_its_mistakes_are_one_clear_error(corpus, qrels, tmp_path, caplog):
    store, documents, _, docs, _ = corpus
    path, held = qrels
    cfg = YardstickJob(kind="qrels", qrels=path, held_out=0.2)
    before = YARDSTICK.ref(cfg, YardstickInputs(documents=documents))
    write_qrels(path, [("q1", "a question", held[0], 1), ("q2", "another", held[1], 1)])
    assert YARDSTICK.ref(cfg, YardstickInputs(documents=documents)) != before  # edited in place: built again
    write_qrels(path, [("q1", "a question", held[0], 1), ("q2", "another", "no-such-doc", 1)])
    with pytest.raises(InputError, match=f"^{path}: doc_id 'no-such-doc' \\(query 'q2'\\) is not in the corpus$"):
        YARDSTICK.run(store, cfg, YardstickInputs(documents=documents))
    write_qrels(path, [("q1", "a question", held[0], 1), ("q2", " ", held[1], 1)])
    with pytest.raises(InputError, match=f"^{path}: row 2 \\(query 'q2'\\): the query is empty$"):
        YARDSTICK.run(store, cfg, YardstickInputs(documents=documents))
    scored = {"query_id": ["q1", "q2"], "query": ["a", "b"], "doc_id": held[:2], "score": ["1", "high"]}
    pd.DataFrame(scored).to_parquet(path)
    with pytest.raises(InputError, match=f"^{path}: row 2: score 'high' is not a number$"):
        YARDSTICK.run(store, cfg, YardstickInputs(documents=documents))
    pd.DataFrame({"query_id": ["q1"], "doc_id": [held[0]], "score": [1]}).to_parquet(path)
    with pytest.raises(InputError, match=f"^{path}: missing column 'query'"):
        YARDSTICK.run(store, cfg, YardstickInputs(documents=documents))
    trained = sorted(set(docs["doc_id"]) - set(held))
    write_qrels(path, [("q1", "a question", held[0], 1), ("q2", "another", trained[0], 1)])
    with pytest.raises(InputError, match=r"yardstick qrels: 1 of the 2 queries of .* have every relevant document "
                                         r"among the \d+ held-out documents \(20% of the corpus\); it needs at "
                                         "least 2: more queries or a larger held-out share$"):
        YARDSTICK.run(store, cfg, YardstickInputs(documents=documents))
    with caplog.at_level("WARNING"):  # `auto`: said, and the labels decide
        ref = YARDSTICK.run(store, AUTO.model_copy(update={"qrels": path}), YardstickInputs(documents=documents))
    assert store.manifest(ref)["extra"]["kind"] == "labels" and "your queries cannot decide (qrels: 1 of" in caplog.text
    for bad, said in [(dict(kind="qrels"), "kind: qrels needs `qrels`"),
                      (dict(kind="labels", qrels=path), "`qrels` is read by kind qrels or auto, not labels")]:
        with pytest.raises(ValueError, match=said):
            YardstickConfig(**bad)


def test_your_queries_rank_their_relevant_documents_among_the_corpus(corpus, qrels, tiny_dir):
    store, documents, _, docs, _ = corpus
    path, held = qrels
    ref = YARDSTICK.run(store, AUTO.model_copy(update={"qrels": path}), YardstickInputs(documents=documents))
    embed = dict(model=tiny_dir, max_length=64, batch_size=16)
    doc_emb = EMBED.run(store, EmbedJob(**embed), EmbedInputs(documents=documents))
    query_emb = EMBED.run(store, EmbedJob(**embed), EmbedInputs(held_out_queries=ref))
    job = EvalJob(label="tiny", model=tiny_dir, dataset="demo", knn=None, sts=None, tsne=False, geometry=False)
    scores = EVALUATE.run(store, job, EvaluateInputs(documents=documents, embeddings=doc_emb, yardstick=ref,
                                                     yardstick_embeddings=query_emb))
    got = store.read_table(scores, YARDSTICK_SCORES).to_pandas().set_index("query_id")
    # By hand: each asking query against every document of the corpus, best first, ties against it.
    encoder = PooledEncoder(tiny_dir, "cpu")
    x = unit_rows(encoder.encode(docs["text"].tolist(), 64))
    for query_id, text, found in [("q-both", "first question", held[:2]), ("q-one", "third question", held[3:4])]:
        scores_of = x @ unit_rows(encoder.encode([text], 64))[0]
        relevant = docs["doc_id"].isin(found).to_numpy()
        order = sorted(range(len(docs)), key=lambda i: (-scores_of[i], relevant[i]))
        gains = [relevant[i] for i in order]
        ideal = sum(1 / np.log2(r + 2) for r in range(len(found)))
        assert got.loc[query_id, "rank"] == (scores_of >= scores_of[relevant].max()).sum()
        assert got.loc[query_id, "ndcg"] == pytest.approx(sum(g / np.log2(r + 2) for r, g in enumerate(gains[:10])) /
                                                          ideal, abs=1e-5)
    metrics = store.read_table(scores, "metrics").to_pandas().set_index("metric")
    assert metrics.loc["qrels_ndcg_at_10", "value"] == pytest.approx(got["ndcg"].mean())
