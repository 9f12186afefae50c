"""Retrieval with one relevant document per query: the rank of that document among all of them, and
nDCG@k, recall@k and MRR@k from it (the held-out generated queries of docs/gpl.md); and retrieval of a set of
relevant documents per query: every document of its label (the labels yardstick of tasks/yardstick.py), or those the
user's relevance judgements name (the qrels yardstick)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy import sparse

from tasks.metrics import BLOCK_BYTES, block_rows, dense, nan_last, ranks_of_own, unit_rows
from tasks.metrics.late_interaction import TokenIndex


def cosines(queries: np.ndarray | sparse.csr_matrix, docs: np.ndarray | sparse.csr_matrix) -> np.ndarray:
    """(queries, docs) scores of unit rows (dense, or a sparse model's codes); NaN (a model that gives NaN vectors) as
    -inf, which ties with every document and so ranks last: such a model finds nothing (a NaN would compare false and
    rank first)."""
    return nan_last(dense(queries @ docs.T))


# How a model scores a query against a document: the cosine of one vector a text, the dot product of a sparse
# model's codes, or a multi-vector model's MaxSim over each text's (tokens, dim) token vectors.
SIMILARITIES = ("cosine", "dot", "maxsim")
# (texts, dim) vectors (a sparse model's codes may stay a sparse matrix), or for maxsim each text's token vectors, or
# the documents' token vectors as an index (past exact MaxSim's reach)
Texts = np.ndarray | sparse.csr_matrix | list[np.ndarray] | TokenIndex


def text_count(texts: Texts) -> int:
    """How many texts (a sparse matrix has no len)."""
    return texts.shape[0] if sparse.issparse(texts) else len(texts)


def block_scores(queries: Texts, docs: Texts, similarity: str = "cosine") -> Callable[[slice], np.ndarray]:
    """A block of queries' (block, docs) scores by `similarity` (SIMILARITIES), NaN as -inf as in `cosines`; MaxSim
    (`maxsim_scores`) is each query token's best document token, summed."""
    longest = max((len(q) for q in queries), default=1) if similarity == "maxsim" else 1
    return scorer(docs, similarity, longest)(queries)


def scorer(docs: Texts, similarity: str = "cosine", query_tokens: int = 1
           ) -> Callable[[Texts], Callable[[slice], np.ndarray]]:
    """The documents made ready once to be scored by `similarity` (unit rows for the cosine, MaxSim's padded chunks
    sized for queries of up to `query_tokens` tokens): a function of a query set that gives its block_scores, as an
    index serves queries (tasks/latency.py times them one at a time). A TokenIndex is that already."""
    if isinstance(docs, TokenIndex):
        return docs.of
    if similarity == "maxsim":
        return maxsim_index(docs, query_tokens)
    if sparse.issparse(docs):
        if similarity != "dot":
            raise ValueError(f"a sparse model's codes are scored by their dot product, not by {similarity}")
        return postings_index(docs)
    rows = unit_rows if similarity == "cosine" else lambda v, dtype: np.asarray(v, dtype=dtype)
    d = rows(docs, np.float32)

    def of(queries: Texts) -> Callable[[slice], np.ndarray]:
        q = rows(dense(queries), np.float32)
        return lambda block: cosines(q[block], d)

    return of


def postings_index(docs: sparse.csr_matrix) -> Callable[[Texts], Callable[[slice], np.ndarray]]:
    """A sparse model's codes ready for their dot product as an inverted index gives it: each dimension's posting list
    (the documents where it is active, with their weights), so a query visits only the documents that share one of its
    active dimensions, not every dimension of every document. A function of a query set (sparse or dense rows) that
    gives its block scores."""
    postings = sparse.csr_matrix(docs.T, dtype=np.float32)  # (dim, docs): a row per dimension, its posting list

    def of(queries: Texts) -> Callable[[slice], np.ndarray]:
        q = sparse.csr_matrix(queries, dtype=np.float32)  # (queries, dim)
        return lambda block: nan_last((q[block] @ postings).toarray())  # (block, docs)

    return of


def maxsim_scores(queries: list[np.ndarray], docs: list[np.ndarray],
                  block_bytes: int = BLOCK_BYTES) -> Callable[[slice], np.ndarray]:
    """MaxSim as block_scores gives it (maxsim_index, sized for the longest of `queries`)."""
    return maxsim_index(docs, max((len(q) for q in queries), default=1), block_bytes)(queries)


MAXSIM_QUERIES = 32  # a slice of a block's queries scored at once: their tokens against a chunk of documents' tokens


def maxsim_index(docs: list[np.ndarray], query_tokens: int, block_bytes: int = BLOCK_BYTES
                 ) -> Callable[[list[np.ndarray]], Callable[[slice], np.ndarray]]:
    """The documents ready for MaxSim: shortest first, padded into chunks of about `block_bytes` of token scores
    against MAXSIM_QUERIES queries of up to `query_tokens` tokens, so each chunk is one matrix product (3.3x
    sentence-transformers' list `maxsim` on a 2-core CPU, docs/results.md; the same sums to float32 rounding); a
    padding token's score is -inf. A function of a query set that gives its block scores."""
    order = np.argsort([len(d) for d in docs], kind="stable")
    dim = docs[0].shape[1] if len(docs) else 0
    per_chunk = max(1, block_bytes // (4 * MAXSIM_QUERIES * max(1, query_tokens)))
    chunks = []  # (the documents' columns, their (docs x longest, dim) tokens padded, the padding mask)
    start = 0
    while start < len(order):
        longest = len(docs[order[start]])  # the chunk's documents grow from there: fill it to its budget
        end = start + 1
        while end < len(order) and (end - start + 1) * max(longest, len(docs[order[end]])) <= per_chunk:
            longest = max(longest, len(docs[order[end]]))
            end += 1
        columns = order[start:end]
        tokens = np.zeros((len(columns), longest, dim), np.float32)  # (chunk, longest, dim)
        for i, j in enumerate(columns):
            tokens[i, : len(docs[j])] = docs[j]
        padding = np.arange(longest)[None, :] >= np.array([len(docs[j]) for j in columns])[:, None]
        chunks.append((columns, torch.from_numpy(tokens.reshape(-1, dim)), torch.from_numpy(padding.reshape(-1))))
        start = end

    def of(queries: list[np.ndarray]) -> Callable[[slice], np.ndarray]:
        def scores(block: slice) -> np.ndarray:
            asked = queries[block]
            out = np.empty((len(asked), len(docs)), np.float32)
            for first in range(0, len(asked), MAXSIM_QUERIES):
                some = asked[first : first + MAXSIM_QUERIES]
                q = torch.from_numpy(np.concatenate(some).astype(np.float32, copy=False))  # (tokens, dim)
                owner = torch.repeat_interleave(torch.arange(len(some)), torch.tensor([len(x) for x in some]))
                for columns, tokens, padding in chunks:
                    best = (q @ tokens.T).masked_fill_(padding, float("-inf"))  # (tokens, chunk x longest)
                    best = best.view(len(q), len(columns), -1).amax(-1)  # (tokens, chunk): each token's best match
                    summed = torch.zeros(len(some), len(columns)).index_add_(0, owner, best)  # (queries, chunk)
                    out[first : first + len(some), columns] = summed.numpy()
            return nan_last(out)

        return scores

    return of


def relevant_ranks(queries: Texts, docs: Texts, relevant: np.ndarray, block_bytes: int = BLOCK_BYTES,
                   similarity: str = "cosine") -> np.ndarray:
    """The rank (by `similarity`; ties against it) of each query's relevant document among all `docs`, queries
    scored in blocks so the scores and their comparison stay under `block_bytes`."""
    scores_of = block_scores(queries, docs, similarity)
    ranks = np.empty(text_count(queries), dtype=np.int64)
    step = block_rows(text_count(docs), 5, block_bytes)  # float32 scores + the bool comparison
    for start in range(0, text_count(queries), step):
        scores = scores_of(slice(start, start + step))  # (block, docs)
        own = scores[np.arange(len(scores)), relevant[start : start + step]]  # (block,)
        ranks[start : start + step] = ranks_of_own(scores, own)
    return ranks


def ndcg_at(ranks: np.ndarray, k: int = 10) -> np.ndarray:
    """Each query's nDCG@k with one relevant document: 1 / log2(rank + 1) within the top k, else 0."""
    return np.where(ranks <= k, 1 / np.log2(ranks + 1), 0.0)


def retrieval_rows(ranks: np.ndarray, k: int = 10, prefix: str = "") -> list[dict]:
    """Metric rows (nDCG@k, recall@k, MRR@k) over the queries' ranks of their relevant document."""
    n = len(ranks)
    values = {f"ndcg_at_{k}": ndcg_at(ranks, k).mean(), f"recall_at_{k}": (ranks <= k).mean(),
              f"mrr_at_{k}": np.where(ranks <= k, 1 / ranks, 0.0).mean()}
    return [dict(metric=f"{prefix}{name}", value=float(v), n=n, repeats=1) for name, v in values.items()]


def same_label_ranks(queries: np.ndarray, docs: np.ndarray, query_labels: np.ndarray, doc_labels: np.ndarray,
                     k: int = 10, block_bytes: int = BLOCK_BYTES, similarity: str = "cosine",
                     ) -> tuple[np.ndarray, np.ndarray]:
    """set_ranks with every document of the query's label relevant. Every query's label must be among
    `doc_labels`."""
    names, codes = np.unique(np.concatenate([doc_labels, query_labels]), return_inverse=True)
    doc_codes, query_codes = codes[: text_count(docs)], codes[text_count(docs) :]
    counts = np.bincount(doc_codes, minlength=len(names))[query_codes]
    if (counts == 0).any():
        raise ValueError("a query's label has no document")
    return set_ranks(block_scores(queries, docs, similarity), text_count(docs),
                     lambda block: query_codes[block, None] == doc_codes[None, :], counts, k, block_bytes)


def qrels_ranks(queries: Texts, docs: Texts, query_rows: np.ndarray, doc_rows: np.ndarray, k: int = 10,
                block_bytes: int = BLOCK_BYTES, similarity: str = "cosine") -> tuple[np.ndarray, np.ndarray]:
    """set_ranks with the relevant documents given as pairs: query `query_rows[i]` finds document `doc_rows[i]`
    (row numbers). Every query needs at least one."""
    relevant = sparse.csr_matrix((np.ones(len(query_rows), dtype=bool), (query_rows, doc_rows)),
                                 shape=(text_count(queries), text_count(docs)))
    relevant.sum_duplicates()  # a pair given twice is one relevant document
    counts = np.diff(relevant.indptr)  # (queries,)
    if (counts == 0).any():
        raise ValueError("a query has no relevant document")
    return set_ranks(block_scores(queries, docs, similarity), text_count(docs), lambda block: relevant[block].toarray(),
                     counts, k, block_bytes)


def set_ranks(scores_of: Callable[[slice], np.ndarray], documents: int, relevant_in: Callable[[slice], np.ndarray],
              counts: np.ndarray, k: int = 10, block_bytes: int = BLOCK_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """Each query's rank (by `scores_of(block)`, a block of queries' (block, documents) scores: block_scores; ties
    against it) of the first relevant document, and its nDCG@k with binary gains (the ideal ranks min(k, its relevant
    documents) first). `relevant_in(block)` is the (block, documents) mask of a block of queries; `counts` each
    query's relevant documents. Ties in the top k count against the query too: a collapsed model scores ~0, not its
    documents' order."""
    k = min(k, documents)
    discounts = 1 / np.log2(np.arange(2, k + 2))  # (k,)
    before = np.concatenate([[0.0], np.cumsum(discounts)])  # (k + 1,): the sum of the first j discounts
    ranks, ndcg = np.empty(len(counts), dtype=np.int64), np.empty(len(counts))
    step = block_rows(documents, 14, block_bytes)  # float32 scores, the relevance mask, the tie masks, argpartition's
    for start in range(0, len(counts), step):
        block = slice(start, start + step)
        scores = scores_of(block)  # (block, docs)
        relevant = relevant_in(block)  # (block, docs)
        ranks[block] = ranks_of_own(scores, np.where(relevant, scores, -np.inf).max(1))
        # The top k without sorting whole rows: the k best in any order, then only those sorted.
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # (block, k)
        top_scores, top_relevant = np.take_along_axis(scores, top, 1), np.take_along_axis(relevant, top, 1)
        kth = top_scores.min(1, keepdims=True)  # (block, 1): the k-th best score
        above = top_scores > kth  # (block, k): certainly in the top k, and first
        order = np.lexsort((top_relevant, -top_scores))  # (block, k): best first, a tie's irrelevant ones first
        gains = (np.take_along_axis(top_relevant & above, order, 1)) @ discounts  # (block,)
        # The places left after those above go to the documents tied at the k-th score, irrelevant ones first.
        tied = scores == kth  # (block, docs)
        places = k - above.sum(1)
        last = np.maximum(0, places - (tied & ~relevant).sum(1))  # relevant ones in the last places
        gains += before[k] - before[k - last]
        ndcg[block] = gains / before[np.minimum(counts[block], k)]
    return ranks, ndcg


def set_rows(ranks: np.ndarray, ndcg: np.ndarray, k: int = 10, prefix: str = "") -> list[dict]:
    """Metric rows of set_ranks: nDCG@k and MRR@k (of the first relevant document)."""
    values = {f"ndcg_at_{k}": ndcg.mean(), f"mrr_at_{k}": np.where(ranks <= k, 1 / ranks, 0.0).mean()}
    return [dict(metric=f"{prefix}{name}", value=float(v), n=len(ranks), repeats=1) for name, v in values.items()]
