import numpy as np
import pytest

from tasks.metrics.late_interaction import TokenIndex, inverted_lists
from tasks.metrics.retrieval import maxsim_scores, qrels_ranks, relevant_ranks, scorer


def unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def corpus(seed: int = 0, documents: int = 60) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Ragged documents, and a query per document made of noisy copies of some of its tokens."""
    rng = np.random.default_rng(seed)
    docs = [unit(rng, n) for n in rng.integers(5, 40, size=documents)]
    queries = []
    for d in docs:
        picked = d[rng.choice(len(d), size=min(4, len(d)), replace=False)]
        noisy = picked + 0.3 * rng.normal(size=picked.shape).astype(np.float32)
        queries.append(noisy / np.linalg.norm(noisy, axis=1, keepdims=True))
    return docs, queries


def test_inverted_lists_are_the_power_of_two_up_to_4_sqrt_tokens_or_fewer_each_trained_on_39_vectors():
    assert [inverted_lists(t) for t in (1, 10, 1_000, 100_000, 10**6)] == [1, 1, 25, 1024, 2048]


def test_an_index_that_reaches_every_token_scores_as_exact_maxsim():
    docs, queries = corpus()
    tokens = sum(len(d) for d in docs)
    index = TokenIndex(docs, nearest=tokens, probes=tokens)  # every list visited, every token returned
    np.testing.assert_allclose(scorer(index, "maxsim")(queries)(slice(0, 60)),
                               maxsim_scores(queries, docs)(slice(0, 60)), rtol=1e-5, atol=1e-5)
    own = np.arange(60)
    assert relevant_ranks(queries, index, own, similarity="maxsim").tolist() == \
        relevant_ranks(queries, docs, own, similarity="maxsim").tolist()


def test_a_narrow_index_scores_its_candidates_exactly_finds_the_rest_never_and_is_built_once():
    docs, queries = corpus(1)
    index = TokenIndex(docs, nearest=3, probes=1)
    exact = maxsim_scores(queries, docs)(slice(0, 60))
    got = index.of(queries)(slice(0, 60))
    found = np.isfinite(got)
    assert 0 < found.sum(1).max() < 60  # some documents, not all
    np.testing.assert_allclose(got[found], exact[found], rtol=1e-5, atol=1e-5)
    for row, query in enumerate(queries[:5]):  # the candidates: the documents of each query token's nearest tokens
        assert np.flatnonzero(found[row]).tolist() == index.candidates(query).tolist()
    built = index.index
    index.of(queries[:2])(slice(0, 2))
    assert index.index is built  # cached: a later query set does not build it again
    # A query made of its document's own tokens finds that document first: its every token matches exactly.
    ranks = relevant_ranks([d[:3] for d in docs], index, np.arange(60), similarity="maxsim")
    assert (ranks == 1).all()


def test_an_indexed_search_ranks_a_document_it_did_not_reach_last_and_a_nan_model_finds_nothing():
    docs, queries = corpus(2)
    index = TokenIndex(docs, nearest=2, probes=1)
    found = np.isfinite(index.of(queries)(slice(0, 60)))
    query = int(np.flatnonzero(~found.all(1))[0])
    missed = int(np.flatnonzero(~found[query])[0])
    rank = relevant_ranks([queries[query]], index, np.array([missed]), similarity="maxsim")[0]
    assert rank == 60  # tied with every document not reached: ranked against it, last
    _, ndcg = qrels_ranks([queries[query]], index, np.array([0]), np.array([missed]), similarity="maxsim")
    assert ndcg[0] == 0.0
    broken = [np.full_like(d, np.nan) for d in docs]
    nan_index = TokenIndex(broken, nearest=8, probes=4)
    assert np.isneginf(nan_index.of(queries)(slice(0, 60))).all()


@pytest.mark.parametrize("dim", [8, 128])
def test_the_index_keeps_8_bit_codes_a_quarter_of_float32(dim):
    rng = np.random.default_rng(3)
    docs = [unit(rng, 40, dim) for _ in range(100)]
    index = TokenIndex(docs, nearest=4, probes=2).index
    assert index.ntotal == 4_000 and index.code_size == dim  # one byte a dimension


def test_a_block_of_queries_an_empty_document_and_an_index_asked_past_a_list_s_tokens():
    docs, queries = corpus(4)
    docs[7] = np.empty((0, 16), np.float32)  # a text that kept no token vector: in no candidate set
    index = TokenIndex(docs, nearest=5, probes=3)
    exact = maxsim_scores(queries, docs)(slice(0, 60))
    got = index.of(queries)(slice(30, 60))  # the block's own queries, not the first ones
    found = np.isfinite(got)
    np.testing.assert_allclose(got[found], exact[30:60][found], rtol=1e-5, atol=1e-5)
    assert not found[:, 7].any()
    for query in queries:  # at most `nearest` documents a query token
        assert len(index.candidates(query)) <= 5 * len(query)
    # more tokens asked than one probed list holds: faiss pads with -1, which names no document (not the last one)
    last = TokenIndex(docs, nearest=10**5, probes=1)
    hits = [set(last.candidates(q).tolist()) for q in queries]
    assert any(59 not in h for h in hits) and all(len(h) < 60 for h in hits)
    nothing = TokenIndex([np.empty((0, 16), np.float32)] * 3, nearest=4, probes=2)
    assert np.isneginf(nothing.of(queries[:2])(slice(0, 2))).all()  # no token vector at all: nothing found
