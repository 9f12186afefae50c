"""The pool-relative yardsticks' maths (tasks/metrics/pool.py) on hand-made rankings and embeddings."""

import numpy as np
import pytest

from tasks.metrics import pool


def test_top_documents_are_the_best_by_cosine_best_first():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(7, 5)), rng.normal(size=(30, 5))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    expected = np.argsort(-(unit(q) @ unit(d).T), axis=1, kind="stable")[:, :4]
    assert (pool.top_documents(q, d, depth=4) == expected).all()


def test_a_document_asking_for_its_neighbours_never_finds_itself():
    rng = np.random.default_rng(2)
    d = rng.normal(size=(30, 5))
    own = np.array([3, 17, 29])
    top = pool.top_documents(d[own], d, depth=29, own=own)  # every other document, best first
    assert top.shape == (3, 29) and not (top == own[:, None]).any()
    assert (pool.top_documents(d[own], d, depth=1) == own[:, None]).all()  # without `own`, itself first
    unit = d / np.linalg.norm(d, axis=1, keepdims=True)
    cos = unit[own] @ unit.T
    cos[np.arange(3), own] = -np.inf
    assert (top[:, :5] == np.argsort(-cos, axis=1, kind="stable")[:, :5]).all()


def test_a_model_is_judged_only_by_the_others():
    """Leave-one-out: a model's score is nDCG against the fusion of the other models; changing its own ranking
    changes what it gets, never what it is judged by."""
    rng = np.random.default_rng(1)
    rankings = np.stack([np.stack([rng.permutation(20)[:8] for _ in range(5)]) for _ in range(4)])  # (4, 5, 8)
    scores = pool.consensus_ndcg(rankings, 20)
    for m in range(4):
        others = np.delete(rankings, m, axis=0)
        # the same model scored against a pool without it, as the last of a pool of the others + itself
        alone = pool.consensus_ndcg(np.concatenate([others, rankings[m : m + 1]]), 20)[-1]
        assert np.allclose(scores[m], alone)


def test_a_candidate_cannot_vote_for_itself():
    """Three models that agree and a fourth whose ranking no other shares: with leave-one-out the fourth scores 0
    (no other model ranked its documents); fused with its own ranking it would have judged itself relevant."""
    agree = np.tile(np.arange(10), (3, 1))  # (queries 3, depth 10): documents 0-9 in order
    odd = np.tile(np.arange(10, 20), (3, 1))  # documents 10-19
    rankings = np.stack([agree, agree, agree, odd])
    scores = pool.consensus_ndcg(rankings, 20)
    assert np.allclose(scores[:3], 1)
    assert np.allclose(scores[3], 0)


def test_the_own_document_counts_double():
    """With `own`, a query's own document is the most relevant: a model ranking it first beats one ranking the
    fusion's choice first, all else equal."""
    base = np.array([[1, 2, 3, 4]])  # (queries 1, depth 4)
    finds_own = np.array([[0, 1, 2, 3]])
    rankings = np.stack([base, base, finds_own])
    with_own = pool.consensus_ndcg(rankings, 10, own=np.array([0]), judged=3, k=4)
    without = pool.consensus_ndcg(rankings, 10, judged=3, k=4)
    assert with_own[2, 0] > without[2, 0]


def test_consensus_needs_two_models():
    with pytest.raises(ValueError, match="at least 2"):
        pool.consensus_ndcg(np.zeros((1, 2, 3), dtype=np.int64), 5)


def test_information_ranks_the_model_that_predicts_the_others_first():
    """Three models of 200 documents: `rich` holds two factors, `a` and `b` one each plus noise. `rich` predicts
    both; each of the others predicts half of `rich` and nothing of the other."""
    rng = np.random.default_rng(2)
    f, g = rng.normal(size=(200, 4)), rng.normal(size=(200, 4))
    mix = lambda x: x @ rng.normal(size=(x.shape[1], 16))  # noqa: E731
    rich = mix(np.hstack([f, g]))
    a, b = mix(f) + 0.1 * rng.normal(size=(200, 16)), mix(g) + 0.1 * rng.normal(size=(200, 16))
    scores = pool.information([a, rich, b])
    assert scores.argmax() == 1 and scores.max() <= 1


def test_explained_share_is_fitted_on_other_documents():
    """Pure noise explains nothing of other noise out of sample, however wide it is (in sample a 300-wide source
    would fit 100 documents exactly)."""
    rng = np.random.default_rng(3)
    assert pool.explained_share(rng.normal(size=(100, 300)), rng.normal(size=(100, 8)), alpha=1e-6) < 0.05


def test_effective_rank():
    rng = np.random.default_rng(4)
    line = rng.normal(size=(50, 1)) @ rng.normal(size=(1, 8))
    assert pool.effective_rank(line) == pytest.approx(1, abs=1e-6)
    assert pool.effective_rank(rng.normal(size=(2000, 8))) == pytest.approx(8, rel=0.05)


def test_group_share_is_the_share_of_nearest_others_in_the_same_group():
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.8, 0.3], [0.0, 1.0], [0.1, 0.9]])
    groups = np.array([0, 0, 1, 1, 1])
    rows = np.array([0, 3])
    # document 0's two nearest others are 1 (group 0) and 2 (group 1); document 3's are 4 and 2 (both group 1)
    assert pool.group_share(pool.neighbour_rankings(x, rows, depth=2), groups, rows).tolist() == [0.5, 1.0]


def test_cluster_purity_ranks_models_that_group_like_the_others_first():
    rng = np.random.default_rng(0)
    topic = np.repeat([0, 1, 2], 20)  # 60 documents of 3 topics, which no model is told
    centres = rng.normal(size=(3, 16))

    def model(noise: float, seed: int) -> np.ndarray:
        r = np.random.default_rng(seed)
        return (centres[topic] + noise * r.normal(size=(60, 16))) @ r.normal(size=(16, 8))

    sharp, blurred, scrambled = model(0.3, 1), model(1.5, 2), rng.normal(size=(60, 8))
    scores = pool.cluster_purity([sharp, model(0.3, 3), blurred, scrambled], np.arange(60), clusters=3, k=5)
    assert scores.shape == (4, 60)
    means = scores.mean(axis=1)
    assert means[0] > means[2] > means[3] and means[1] > means[2]  # sharp > blurred > a model with no topics
    with pytest.raises(ValueError, match="at least 2 models"):
        pool.cluster_purity([sharp], np.arange(60))


def test_a_candidate_cannot_vote_for_itself_by_its_grouping():
    """Three models that group 60 documents by their 3 topics, and a fourth whose neighbourhoods are as sharp but by
    another split of the documents: judged by the others' grouping alone, the fourth scores near chance; a grouping
    with its own vectors in it would have rewarded its own split."""
    rng = np.random.default_rng(5)
    topic, other = np.repeat([0, 1, 2], 20), np.tile([0, 1, 2], 20)
    centres = rng.normal(size=(3, 16)) * 4

    def model(groups: np.ndarray, seed: int) -> np.ndarray:
        return centres[groups] + np.random.default_rng(seed).normal(size=(60, 16))

    models = [model(topic, 1), model(topic, 2), model(topic, 3), model(other, 4)]
    means = pool.cluster_purity(models, np.arange(60), clusters=3, k=5, seeds=[0, 1]).mean(axis=1)
    assert means[:3].min() > 0.9 and means[3] < 0.5
    nearest = [pool.neighbour_rankings(x, np.arange(60), depth=5) for x in models]
    assert np.allclose(pool.cluster_purity(models, np.arange(60), clusters=3, k=5, seeds=[0, 1], nearest=nearest),
                       pool.cluster_purity(models, np.arange(60), clusters=3, k=5, seeds=[0, 1]))


def test_term_overlap_is_the_tfidf_cosine_with_each_documents_nearest_others():
    texts = ["cats sit on mats", "cats like mats", "stocks fell on markets", "markets rose", "cats watch markets"]
    terms = pool.term_vectors(texts)  # cats, mats, markets: the terms in two documents or more
    assert terms.shape == (5, 3)
    nearest = np.array([[1, 2], [0, 4], [3, 4]])  # (rows, k) by some model's vectors
    overlap = pool.term_overlap(nearest, terms, np.array([0, 1, 2]))
    cosine = (terms @ terms.T).toarray()
    assert np.allclose(overlap, [(cosine[0, 1] + cosine[0, 2]) / 2, (cosine[1, 0] + cosine[1, 4]) / 2,
                                 (cosine[2, 3] + cosine[2, 4]) / 2])
    assert np.isclose(cosine[0, 1], 1.0) and cosine[0, 2] == 0  # the same two terms; no term shared
    vectors = np.eye(5)[[0, 0, 1, 1, 2]] + 0.1 * np.arange(5)[:, None]  # groups {0, 1}, {2, 3}, {4}
    apart = np.eye(5)[[0, 1, 0, 1, 2]] + 0.1 * np.arange(5)[:, None]  # the cats with the markets
    grouped, mixed = (pool.term_overlap(pool.neighbour_rankings(x, np.arange(5), 1), terms, np.arange(5)).mean()
                      for x in (vectors, apart))
    assert grouped > mixed


def test_a_sparse_models_codes_rank_as_their_dense_rows_do():
    from scipy import sparse

    codes = sparse.random(40, 500, density=0.05, format="csr", dtype=np.float32, random_state=3)
    rows, own = codes.toarray(), np.array([0, 7, 39])
    assert (pool.neighbour_rankings(codes, own, depth=10) == pool.neighbour_rankings(rows, own, depth=10)).all()
    assert (pool.top_documents(rows[own], codes, depth=5) == pool.top_documents(rows[own], rows, depth=5)).all()


def test_the_pool_reads_each_models_clusters_table_in_its_own_row_order(tmp_path):
    """Each evaluate artifact's clusters table may list the documents in its own order, and a sparse model's vectors
    as codes: pool_scores judges each model as cluster_purity does on the vectors in the documents' order, a sparse
    model's as its dense rows."""
    import pyarrow as pa
    from scipy import sparse

    from storage.base import ArtifactRef
    from storage.catalog import YARDSTICK_TOP
    from storage.codes import code_columns
    from storage.store import ArtifactStore

    rng = np.random.default_rng(7)
    topic = np.repeat([0, 1, 2], 20)  # 60 documents of 3 topics
    centres = rng.normal(size=(3, 12)) * 3
    vectors = [(centres[topic] + rng.normal(size=(60, 12))).astype(np.float32) for _ in range(3)]
    vectors[1] = sparse.csr_matrix(np.maximum(vectors[1], 0))  # a sparse model's codes: about half active
    nearest = [pool.neighbour_rankings(x, np.arange(60), depth=10) for x in vectors]
    store, refs = ArtifactStore(tmp_path), {}
    for m, (x, top) in enumerate(zip(vectors, nearest)):
        order = rng.permutation(60)  # the order this model's table lists the documents in
        columns = code_columns(x[order]) if sparse.issparse(x) else \
            {pool.VECTOR: pa.array(list(x[order]), pa.list_(pa.float32()))}
        table = pa.table({"query_id": [f"doc-{i:02d}" for i in order], "own": pa.array(order, pa.int32()),
                          "top": pa.array(list(top[order].astype(np.int32)), pa.list_(pa.int32())), **columns})
        refs[f"model-{m}"] = ArtifactRef("evaluate", f"eval-{m}")
        with store.writing(refs[f"model-{m}"], config={}, inputs=[], code_version="v", libraries={}) as out:
            out.write_table(YARDSTICK_TOP, table)
    judged = pool.pool_scores(store, refs)
    by_hand = pool.cluster_purity([vectors[0], vectors[1].toarray(), vectors[2]], np.arange(60), nearest=nearest)
    for m, name in enumerate(refs):
        np.testing.assert_allclose(judged[name][[f"doc-{i:02d}" for i in range(60)]].to_numpy(), by_hand[m])
    collapsed = pa.table({"query_id": [f"doc-{i:02d}" for i in range(60)], "own": pa.array(range(60), pa.int32()),
                          "top": pa.array(list(nearest[1].astype(np.int32)), pa.list_(pa.int32())),
                          **code_columns(sparse.csr_matrix((60, 12), dtype=np.float32))})  # no active code at all
    with store.writing(ArtifactRef("evaluate", "eval-collapsed"), config={}, inputs=[], code_version="v",
                       libraries={}) as out:
        out.write_table(YARDSTICK_TOP, collapsed)
    judged = pool.pool_scores(store, {"model-0": refs["model-0"],
                                      "collapsed": ArtifactRef("evaluate", "eval-collapsed")})
    assert all(scores.between(0, 1).all() for scores in judged.values())  # model-0 judged by one group: all 1
