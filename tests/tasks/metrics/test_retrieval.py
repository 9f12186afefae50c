import math

import numpy as np
import pytest
import torch
from scipy import sparse
from sentence_transformers.util import maxsim

from tasks.metrics import BLOCK_BYTES
from tasks.metrics.retrieval import (
    block_scores,
    maxsim_scores,
    ndcg_at,
    qrels_ranks,
    relevant_ranks,
    retrieval_rows,
    same_label_ranks,
    scorer,
    set_rows,
)


def test_ranks_count_ties_against_the_query_and_do_not_depend_on_the_block_size():
    docs = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])  # doc 3 points where doc 0 does
    queries = np.array([[1.0, 0.1], [0.0, 1.0], [1.0, 0.0]])
    ranks = relevant_ranks(queries, docs, np.array([0, 2, 3]))
    # q0: doc 0 ties doc 3 (rank 2); q1: doc 1 beats doc 2 (rank 2); q2: doc 3 ties doc 0 (rank 2)
    assert ranks.tolist() == [2, 2, 2]
    assert relevant_ranks(queries, docs, np.array([0, 2, 3]), block_bytes=1).tolist() == [2, 2, 2]
    assert relevant_ranks(np.ones((2, 2)), np.ones((5, 2)), np.array([0, 4])).tolist() == [5, 5]  # one vector


def test_maxsim_ranks_sum_each_query_tokens_best_match_and_count_ties_against_the_query():
    query = np.array([[1, 0], [0, 1]], np.float32)  # 2 tokens
    docs = [np.array([[0.6, 0.8], [1, 0]], np.float32),  # MaxSim: max(1, 0.6) + max(0, 0.8) = 1.8
            np.array([[0, 1]], np.float32),  # 0 + 1 = 1.0
            np.array([[1, 0], [0, 1], [0.6, 0.8]], np.float32),  # 1 + 1 = 2.0
            np.array([[0.8, 0.6], [0.6, 0.8]], np.float32)]  # 0.8 + 0.8 = 1.6
    assert relevant_ranks([query] * 4, docs, np.arange(4), similarity="maxsim").tolist() == [2, 4, 1, 3]
    tie = [np.array([[1, 0]], np.float32), np.array([[1, 0]], np.float32)]  # the same score: ranked against it
    assert relevant_ranks([np.array([[1, 0]], np.float32)], tie, np.array([0]), similarity="maxsim").tolist() == [2]
    # queries in blocks of one document's bytes: the same ranks
    assert relevant_ranks([query] * 4, docs, np.arange(4), block_bytes=1, similarity="maxsim").tolist() == [2, 4, 1, 3]
    # by relevance judgements (your qrels): the same MaxSim order; documents 2 and 0 (2.0 and 1.8) relevant to the
    # first query: the best of them first, nDCG@10 1; document 1 (1.0, last) relevant to the second
    ranks, ndcg = qrels_ranks([query, query], docs, np.array([0, 0, 1]), np.array([2, 0, 1]), similarity="maxsim")
    assert ranks.tolist() == [1, 4] and ndcg.tolist() == pytest.approx([1.0, 1 / math.log2(5)])


def test_maxsim_in_padded_chunks_sums_what_sentence_transformers_sums_whatever_the_chunk_size():
    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:  # n token vectors of length 1
        v = rng.normal(size=(n, 8)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    docs = [unit(n) for n in rng.integers(1, 30, size=40)]  # ragged: each chunk padded to its longest
    queries = [unit(n) for n in rng.integers(1, 12, size=70)]  # more than a slice of 32
    expected = maxsim([torch.from_numpy(q) for q in queries], [torch.from_numpy(d) for d in docs]).numpy()
    for block_bytes in (1, 4096, BLOCK_BYTES):  # one document a chunk, a few, all of them
        got = maxsim_scores(queries, docs, block_bytes)(slice(0, 70))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(maxsim_scores(queries, docs)(slice(3, 5)), expected[3:5], rtol=1e-5, atol=1e-5)


def test_an_index_made_once_scores_each_query_set_as_block_scores_does():
    rng = np.random.default_rng(1)
    docs = rng.normal(size=(30, 8)).astype(np.float32)
    tokens = [rng.normal(size=(n, 8)).astype(np.float32) for n in rng.integers(1, 20, size=30)]
    for similarity, documents in (("cosine", docs), ("dot", docs), ("maxsim", tokens)):
        index = scorer(documents, similarity, query_tokens=6)  # a query set of up to 6 tokens a query
        for n in (1, 5):  # one query at a time, as tasks/latency.py asks, or a few
            queries = ([rng.normal(size=(6, 8)).astype(np.float32) for _ in range(n)] if similarity == "maxsim"
                       else rng.normal(size=(n, 8)).astype(np.float32))
            np.testing.assert_allclose(index(queries)(slice(0, n)), block_scores(queries, documents, similarity)(
                slice(0, n)), rtol=1e-5, atol=1e-5)


def test_a_sparse_model_ranks_by_the_dot_product_of_its_codes_not_their_cosine():
    docs = np.array([[2.0, 0.0], [0.6, 0.8]])  # the same direction as the query, twice as long; or nearer in angle
    query = np.array([[0.6, 0.8]])
    assert relevant_ranks(query, docs, np.array([0]), similarity="dot").tolist() == [1]  # 1.2 against 1.0
    assert relevant_ranks(query, docs, np.array([0])).tolist() == [2]  # cosine: 0.6 against 1.0
    for rank, similarity in ((1, "dot"), (2, "cosine")):
        assert qrels_ranks(query, docs, np.array([0]), np.array([0]), similarity=similarity)[0].tolist() == [rank]
        assert same_label_ranks(query, docs, np.array(["a"]), np.array(["a", "b"]),
                                similarity=similarity)[0].tolist() == [rank]


def test_sparse_codes_kept_sparse_score_and_rank_as_their_dense_rows():
    rng = np.random.default_rng(2)
    active = rng.random((40, 300)) < 0.03  # about 9 of 300 dimensions a text, some texts sharing none
    docs = np.where(active, rng.random((40, 300)), 0).astype(np.float32)
    queries = np.where(rng.random((7, 300)) < 0.05, rng.random((7, 300)), 0).astype(np.float32)
    index = scorer(sparse.csr_matrix(docs), "dot")
    for asked in (queries, sparse.csr_matrix(queries)):  # a query set as dense rows (a test) or codes (the store)
        np.testing.assert_allclose(index(asked)(slice(0, 7)), queries @ docs.T, rtol=1e-6, atol=1e-6)
        # codes asked of an index of dense rows (an artifact from before codes were kept) score the same
        np.testing.assert_allclose(scorer(docs, "dot")(asked)(slice(0, 7)), queries @ docs.T, rtol=1e-6, atol=1e-6)
    own = rng.integers(0, 40, 7)
    assert relevant_ranks(sparse.csr_matrix(queries), sparse.csr_matrix(docs), own, similarity="dot").tolist() == \
        relevant_ranks(queries, docs, own, similarity="dot").tolist()
    kept = qrels_ranks(sparse.csr_matrix(queries), sparse.csr_matrix(docs), np.arange(7), own, similarity="dot")
    for got, want in zip(kept, qrels_ranks(queries, docs, np.arange(7), own, similarity="dot")):
        np.testing.assert_array_equal(got, want)
    labels = np.array(list("abc"))[rng.integers(0, 3, 47)]  # the labels yardstick: the codes of its queries, kept
    codes = sparse.csr_matrix(np.vstack([queries, docs]))
    kept = same_label_ranks(codes[:7], codes[7:], labels[:7], labels[7:], similarity="dot")
    for got, want in zip(kept, same_label_ranks(queries, docs, labels[:7], labels[7:], similarity="dot")):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="dot product, not by cosine"):
        scorer(sparse.csr_matrix(docs), "cosine")


def test_ndcg_recall_and_mrr_at_10_from_ranks():
    ranks = np.array([1, 3, 10, 11])
    assert ndcg_at(ranks).tolist() == pytest.approx([1.0, 1 / math.log2(4), 1 / math.log2(11), 0.0])
    rows = {r["metric"]: r for r in retrieval_rows(ranks, prefix="query_")}
    assert rows["query_ndcg_at_10"]["value"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(11)) / 4)
    assert rows["query_recall_at_10"]["value"] == 0.75
    assert rows["query_mrr_at_10"]["value"] == pytest.approx((1 + 1 / 3 + 1 / 10) / 4)
    assert {r["n"] for r in rows.values()} == {4}


def test_retrieval_by_label_ranks_the_first_document_of_the_label_and_scores_all_of_them():
    # five documents on a circle; the query at 0 degrees sees them in the order d0, d1, d2, d3, d4
    angles = np.radians([0, 20, 40, 60, 80])
    docs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array(["b", "a", "b", "a", "c"])
    ranks, ndcg = same_label_ranks(np.array([[1.0, 0.0], [1.0, 0.0]]), docs, np.array(["a", "c"]), labels, k=3)
    assert ranks.tolist() == [2, 5]
    # "a": relevant at ranks 2 (d1) of the top 3, 2 documents in all; "c": its one document is 5th, outside the top 3
    assert ndcg.tolist() == pytest.approx([(1 / math.log2(3)) / (1 + 1 / math.log2(3)), 0.0])
    blocked = same_label_ranks(np.array([[1.0, 0.0], [1.0, 0.0]]), docs, np.array(["a", "c"]), labels, k=3,
                               block_bytes=1)
    assert blocked[0].tolist() == ranks.tolist() and blocked[1].tolist() == pytest.approx(ndcg.tolist())
    rows = {r["metric"]: r["value"] for r in set_rows(ranks, ndcg, k=3, prefix="label_")}
    assert rows == pytest.approx({"label_ndcg_at_3": ndcg.mean(), "label_mrr_at_3": (1 / 2 + 0) / 2})


def test_retrieval_by_label_counts_ties_against_the_query():
    # one vector for every text (a collapsed model): the first relevant is last, the top k holds the others first
    ranks, ndcg = same_label_ranks(np.ones((1, 2)), np.ones((12, 2)), np.array(["a"]), np.array(["a", "b"] * 6))
    assert ranks.tolist() == [12] and ndcg.tolist() == pytest.approx([(1 / math.log2(8) + 1 / math.log2(9) + 1 /
                                                                       math.log2(10) + 1 / math.log2(11)) /
                                                                      sum(1 / math.log2(r + 2) for r in range(6))])
    with pytest.raises(ValueError, match="a query's label has no document"):
        same_label_ranks(np.ones((1, 2)), np.ones((2, 2)), np.array(["z"]), np.array(["a", "b"]))


@pytest.mark.parametrize("n_docs", [300, 30])  # ties only at the k-th score; ties above it too
def test_retrieval_by_label_equals_a_full_sort_with_ties_against_the_query(n_docs):
    rng = np.random.default_rng(0)
    # 6 directions (+-1 on one axis), n_docs / 6 documents each: a score is one of the query's components, exactly,
    # so documents of one direction tie bit for bit whatever the blocks
    docs = np.vstack([np.eye(3), -np.eye(3)])[rng.integers(0, 6, size=n_docs)]
    queries = rng.normal(size=(40, 3))
    doc_labels = rng.choice(list("abcd"), size=len(docs))
    query_labels = rng.choice(list("abcd"), size=len(queries))
    ranks, ndcg = same_label_ranks(queries, docs, query_labels, doc_labels)
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    for i, (query, label) in enumerate(zip(queries / np.linalg.norm(queries, axis=1, keepdims=True), query_labels)):
        scores = unit @ query
        # best first; among equal scores the other labels first
        order = sorted(range(len(docs)), key=lambda j: (-scores[j], doc_labels[j] == label))
        same = [doc_labels[j] == label for j in order]
        ideal = sum(1 / math.log2(r + 2) for r in range(min(10, sum(same))))
        assert ndcg[i] == pytest.approx(sum(g / math.log2(r + 2) for r, g in enumerate(same[:10])) / ideal)
        assert ranks[i] == (scores >= max(scores[j] for j in range(len(docs)) if doc_labels[j] == label)).sum()
    blocked = same_label_ranks(queries, docs, query_labels, doc_labels, block_bytes=1)
    assert blocked[0].tolist() == ranks.tolist() and blocked[1].tolist() == pytest.approx(ndcg.tolist())


def test_retrieval_by_relevance_judgements_equals_a_full_sort_and_reads_each_pair_once():
    rng = np.random.default_rng(1)
    docs = np.vstack([np.eye(3), -np.eye(3)])[rng.integers(0, 6, size=60)]  # ties, as above
    queries = rng.normal(size=(15, 3))
    relevant = [sorted(rng.choice(60, size=rng.integers(1, 5), replace=False)) for _ in queries]
    query_rows = np.array([i for i, found in enumerate(relevant) for _ in found] + [0])
    doc_rows = np.array([j for found in relevant for j in found] + [relevant[0][0]])  # a pair given twice
    ranks, ndcg = qrels_ranks(queries, docs, query_rows, doc_rows)
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    for i, (query, found) in enumerate(zip(queries / np.linalg.norm(queries, axis=1, keepdims=True), relevant)):
        scores = unit @ query
        order = sorted(range(len(docs)), key=lambda j: (-scores[j], j in found))  # ties against the query
        gains = [j in found for j in order]
        ideal = sum(1 / math.log2(r + 2) for r in range(min(10, len(found))))
        assert ndcg[i] == pytest.approx(sum(g / math.log2(r + 2) for r, g in enumerate(gains[:10])) / ideal)
        assert ranks[i] == (scores >= max(scores[j] for j in found)).sum()  # as by label
    blocked = qrels_ranks(queries, docs, query_rows, doc_rows, block_bytes=1)
    assert blocked[0].tolist() == ranks.tolist() and blocked[1].tolist() == pytest.approx(ndcg.tolist())
    with pytest.raises(ValueError, match="a query has no relevant document"):
        qrels_ranks(queries[:2], docs, np.array([0]), np.array([3]))


def test_a_model_that_gives_nan_vectors_finds_nothing():
    # NaN compares false: unguarded, a NaN query's rank was 0 (MRR 1/0 = inf) and its top 10 counted all found
    docs, labels = np.ones((12, 2)), np.array(["a", "b"] * 6)
    docs[3] = np.nan  # a broken document ("b"): below every other
    ranks, ndcg = same_label_ranks(np.array([[1.0, 0.0], [np.nan, np.nan]]), docs, np.array(["b", "a"]), labels)
    # The NaN query ties with every document, as a collapsed model does (ties against it): its 6 relevant last
    assert ranks.tolist() == [11, 12] and ndcg[1] == pytest.approx(
        sum(1 / math.log2(r + 2) for r in range(6, 10)) / sum(1 / math.log2(r + 2) for r in range(6)))
    blocked = same_label_ranks(np.array([[1.0, 0.0], [np.nan, np.nan]]), docs, np.array(["b", "a"]), labels,
                               block_bytes=1)
    assert blocked[0].tolist() == ranks.tolist() and blocked[1].tolist() == pytest.approx(ndcg.tolist())
    rows = {r["metric"]: r["value"] for r in set_rows(ranks[1:], ndcg[1:])}
    assert rows == {"ndcg_at_10": ndcg[1], "mrr_at_10": 0.0}
    assert relevant_ranks(np.full((2, 2), np.nan), np.ones((5, 2)), np.array([0, 4])).tolist() == [5, 5]
