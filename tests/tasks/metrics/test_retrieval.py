import math

import numpy as np
import pytest

from tasks.metrics.retrieval import ndcg_at, relevant_ranks, retrieval_rows


def test_ranks_count_ties_against_the_query_and_do_not_depend_on_the_block_size():
    docs = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])  # doc 3 points where doc 0 does
    queries = np.array([[1.0, 0.1], [0.0, 1.0], [1.0, 0.0]])
    ranks = relevant_ranks(queries, docs, np.array([0, 2, 3]))
    # q0: doc 0 ties doc 3 (rank 2); q1: doc 1 beats doc 2 (rank 2); q2: doc 3 ties doc 0 (rank 2)
    assert ranks.tolist() == [2, 2, 2]
    assert relevant_ranks(queries, docs, np.array([0, 2, 3]), block_bytes=1).tolist() == [2, 2, 2]
    assert relevant_ranks(np.ones((2, 2)), np.ones((5, 2)), np.array([0, 4])).tolist() == [5, 5]  # one vector


def test_ndcg_recall_and_mrr_at_10_from_ranks():
    ranks = np.array([1, 3, 10, 11])
    assert ndcg_at(ranks).tolist() == pytest.approx([1.0, 1 / math.log2(4), 1 / math.log2(11), 0.0])
    rows = {r["metric"]: r for r in retrieval_rows(ranks, prefix="query_")}
    assert rows["query_ndcg_at_10"]["value"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(11)) / 4)
    assert rows["query_recall_at_10"]["value"] == 0.75
    assert rows["query_mrr_at_10"]["value"] == pytest.approx((1 + 1 / 3 + 1 / 10) / 4)
    assert {r["n"] for r in rows.values()} == {4}
