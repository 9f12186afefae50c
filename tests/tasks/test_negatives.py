"""Hard negatives and round-trip ranks: the mining maths on hand-made vectors, then the stage end to end."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from sentence_transformers.cross_encoder import CrossEncoder

from storage.base import ArtifactRef
from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.config.model import Prompts
from tasks.config.queries import NegativesConfig
from tasks.core.stage import NoInputs
from tasks.encoders.encode import PooledEncoder
from tasks.ingest import INGEST
from tasks.negatives import NEGATIVES, NegativesInputs, NegativesJob, mine
from tests.helpers import DEMO_DOCS


def at_degrees(*angles: float) -> np.ndarray:
    """Unit vectors in the plane (len(angles) × 2): cosine = cos(angle difference)."""
    rad = np.radians(angles)
    return np.stack([np.cos(rad), np.sin(rad)], axis=1).astype(np.float32)


# P0 at 0°, P1 at 10°, P2 at 1° (a near-copy of P0 at 0.999), P3 at 90°, P4 at 180°.
PASSAGES = at_degrees(0, 10, 1, 90, 180)


def test_own_passage_ranked_first_is_never_a_negative_and_near_duplicates_are_skipped():
    neg, scores, rank, own = mine(at_degrees(0), PASSAGES, np.array([0]), k=2, duplicate_similarity=0.999)
    assert rank.tolist() == [1]
    np.testing.assert_allclose(own, [1.0], atol=1e-6)
    assert neg.tolist() == [[1, 3]]  # P2 (cos 0.99985 with P0) skipped, P1 (0.985) kept
    np.testing.assert_allclose(scores, [[np.cos(np.radians(10)), 0.0]], atol=1e-6)


def test_outranked_passage_gets_its_rank_and_the_passages_above_it_are_negatives():
    # The query at 4° belongs to P3 (90°): P2, P0 and P1 score higher.
    neg, scores, rank, own = mine(at_degrees(4), PASSAGES, np.array([3]), k=2, duplicate_similarity=0.95)
    assert rank.tolist() == [4]
    np.testing.assert_allclose(own, [np.cos(np.radians(86))], atol=1e-6)
    assert neg.tolist() == [[2, 0]]  # best first
    assert scores[0, 0] > scores[0, 1]


def test_fewer_candidates_than_k_are_padded():
    neg, scores, _, _ = mine(at_degrees(0), PASSAGES, np.array([0]), k=10, duplicate_similarity=0.999)
    assert neg.shape == (1, 4)  # k' = passages − 1
    assert neg.tolist() == [[1, 3, 4, -1]]
    assert np.isnan(scores[0, 3]) and not np.isnan(scores[0, :3]).any()


def test_one_passage_gives_no_negatives():
    neg, scores, rank, _ = mine(at_degrees(0, 30), at_degrees(0), np.array([0, 0]), k=3, duplicate_similarity=0.9)
    assert neg.shape == scores.shape == (2, 0)
    assert rank.tolist() == [1, 1]


def test_random_vectors_match_a_brute_force_and_do_not_depend_on_the_block_size():
    rng = np.random.default_rng(0)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    passages, queries = unit(rng.normal(size=(40, 8))), unit(rng.normal(size=(25, 8)))
    passages[7] = passages[3]  # an exact duplicate pair
    positives = rng.integers(0, 40, size=25)
    positives[:3] = 3
    whole = mine(queries, passages, positives, k=5, duplicate_similarity=0.9)
    blocks = mine(queries, passages, positives, k=5, duplicate_similarity=0.9, block_bytes=40 * 16 * 4)
    for a, b in zip(whole, blocks):  # a matrix product's last bits depend on its shape
        np.testing.assert_allclose(a, b, atol=1e-6)
    neg, scores, rank, own = whole
    full = queries @ passages.T  # (25 × 40)
    for i, pos in enumerate(positives):
        assert rank[i] == (full[i] >= full[i, pos]).sum()  # ties count against it
        allowed = [j for j in np.argsort(-full[i], kind="stable")
                   if j != pos and passages[j] @ passages[pos] < 0.9]
        kept = [j for j in neg[i] if j >= 0]
        assert kept == allowed[:5] and len(kept) <= 5
        assert pos not in kept and (pos != 3 or 7 not in kept)
        assert list(scores[i, : len(kept)]) == sorted(scores[i, : len(kept)], reverse=True)
    np.testing.assert_allclose(own, full[np.arange(25), positives], atol=1e-6)


# ---------------------------------------------------------------- the stage


@pytest.fixture(scope="module")
def mined(tmp_path_factory, tiny_dir):
    """A store with 10 documents (two of them the same text under other ids, one without a title),
    queries on them (one failed, some held out) and the negatives mined with the tiny encoder."""
    tmp = tmp_path_factory.mktemp("negatives")
    docs = pd.read_parquet(DEMO_DOCS).head(8)
    copy = docs.iloc[[0]].assign(doc_id="copy-of-first")
    docs = pd.concat([docs, copy, docs.iloc[[1]].assign(doc_id="untitled", title=None)], ignore_index=True)
    docs.to_parquet(tmp / "docs.parquet")
    store = ArtifactStore(tmp / "store")
    documents = INGEST.run(store, DataConfig(path=str(tmp / "docs.parquet")), NoInputs())
    rows = [dict(query_id=f"{d}-{n}", doc_id=d, query=" ".join(text.split()[n * 6 : n * 6 + 6]), status="ok",
                 split="held_out" if i % 4 == 0 else "train")
            for i, (d, text) in enumerate(zip(docs["doc_id"], docs["text"])) for n in range(2)]
    rows[5]["status"] = "empty"
    queries = ArtifactRef("queries", "k1")
    with store.writing(queries, config={}, inputs=[], code_version="v", libraries={}) as out:
        out.write_table("queries", pa.Table.from_pylist(rows))
    job = NegativesJob(model=tiny_dir, negatives=NegativesConfig(k=3, duplicate_similarity=0.99999, batch_size=4,
                                                                  max_length=64))
    inputs = NegativesInputs(documents=documents, queries=queries)
    ref = NEGATIVES.run(store, job, inputs)
    return store, ref, job, inputs, docs, rows


def test_every_ok_query_gets_a_row_with_its_split(mined):
    store, ref, _, _, _, rows = mined
    table = store.read_table(ref, "negatives").to_pandas()
    ok = [r for r in rows if r["status"] == "ok"]
    assert table["query_id"].tolist() == [r["query_id"] for r in ok]  # the queries' order
    assert table["split"].tolist() == [r["split"] for r in ok]
    assert table["query"].tolist() == [r["query"] for r in ok]
    assert (table["positive_rank"] >= 1).all() and (table["positive_rank"] <= len(table["doc_id"].unique())).all()
    extra = store.manifest(ref)["extra"]
    assert extra["queries"] == len(ok) and extra["passages"] == 10
    assert extra["median_positive_rank"] == float(np.median(table["positive_rank"]))
    assert extra["rank1_share"] == pytest.approx((table["positive_rank"] == 1).mean())


def test_no_row_lists_its_own_passage_or_a_copy_of_it(mined):
    store, ref, *_ = mined
    table = store.read_table(ref, "negatives").to_pandas()
    copies = {"0000000": "copy-of-first", "copy-of-first": "0000000"}
    for _, row in table.iterrows():
        assert row["doc_id"] not in row["negatives"] and copies.get(row["doc_id"]) not in row["negatives"]
        assert len(row["negatives"]) == len(row["negative_scores"]) <= 3
        assert list(row["negative_scores"]) == sorted(row["negative_scores"], reverse=True)
        assert len(set(row["negatives"])) == len(row["negatives"])


@pytest.mark.parametrize("prompts", [Prompts(), Prompts(query="query: ", document="passage: ")],
                         ids=["no-prompts", "prompts"])
def test_scores_are_the_cosines_of_the_encoders_vectors(mined, tiny_dir, prompts):
    store, ref, job, inputs, docs, rows = mined
    if prompts != job.prompts:  # the start model reads queries and passages after their prompts
        ref = NEGATIVES.run(store, job.model_copy(update={"prompts": prompts}), inputs)
    table = store.read_table(ref, "negatives").to_pandas()
    encoder = PooledEncoder(tiny_dir, "cpu")
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    passages = unit(encoder.encode([prompts.document + t for t in docs["text"]], 64, 4))
    queries = unit(encoder.encode([prompts.query + q for q in table["query"]], 64, 4))
    row_of = {d: i for i, d in enumerate(docs["doc_id"])}
    own = (queries * passages[[row_of[d] for d in table["doc_id"]]]).sum(1)
    np.testing.assert_allclose(table["positive_score"], own, atol=1e-5)
    first = table.iloc[0]
    np.testing.assert_allclose(first["negative_scores"], passages[[row_of[d] for d in first["negatives"]]]
                               @ queries[0], atol=1e-5)


def test_without_a_cross_encoder_the_teacher_columns_are_null(mined):
    store, ref, *_ = mined
    table = store.read_table(ref, "negatives")
    assert table["positive_teacher"].null_count == table["negative_teacher"].null_count == table.num_rows


def test_a_cross_encoder_scores_each_query_with_its_passage_and_each_negative(mined, tiny_cross_encoder_dir):
    store, _, job, inputs, docs, _ = mined
    taught = job.model_copy(update={"negatives": job.negatives.model_copy(
        update={"cross_encoder": tiny_cross_encoder_dir})})
    ref = NEGATIVES.run(store, taught, inputs)
    table = store.read_table(ref, "negatives").to_pandas()
    plain = store.read_table(NEGATIVES.ref(job, inputs), "negatives").to_pandas()
    assert table["negatives"].map(list).tolist() == plain["negatives"].map(list).tolist()  # the same mining
    passage = dict(zip(docs["doc_id"], docs["text"]))
    teacher = CrossEncoder(tiny_cross_encoder_dir, max_length=64, device="cpu")
    raw = lambda pairs: teacher.predict(pairs, activation_fn=torch.nn.Identity())  # noqa: E731  (logits, as GPL)
    np.testing.assert_allclose(table["positive_teacher"], raw(list(zip(table["query"], table["doc_id"].map(passage)))),
                               atol=1e-5)
    for _, row in table.iterrows():
        assert len(row["negative_teacher"]) == len(row["negatives"])
        if len(row["negatives"]):
            np.testing.assert_allclose(row["negative_teacher"],
                                       raw([(row["query"], passage[d]) for d in row["negatives"]]), atol=1e-5)
    assert ref != NEGATIVES.ref(job, inputs)  # the teacher is part of the key


def test_the_key_changes_with_k_and_with_the_model(mined):
    _, ref, job, inputs, *_ = mined
    assert NEGATIVES.ref(job, inputs) == ref
    more = job.model_copy(update={"negatives": job.negatives.model_copy(update={"k": 4})})
    assert NEGATIVES.ref(more, inputs) != ref
    assert NEGATIVES.ref(job.model_copy(update={"model": "another/model"}), inputs) != ref
    trained = NegativesInputs(documents=inputs.documents, queries=inputs.queries, model=ArtifactRef("train", "t1"))
    assert NEGATIVES.ref(job.model_copy(update={"model": None}), trained) != ref


def test_a_model_that_gives_every_text_one_vector_ranks_each_own_passage_last_not_first():
    same = np.ones((3, 4), np.float32) / 2  # unit vectors, all equal
    _, _, rank, _ = mine(same, same, np.array([0, 1, 2]), k=1, duplicate_similarity=0.95)
    assert rank.tolist() == [3, 3, 3]  # ties count against the query: a collapsed model passes no round trip
