"""A multi-vector model's documents as an index, for corpora past exact MaxSim's reach: ColBERT's end-to-end retrieval
(Khattab & Zaharia, SIGIR 2020). A faiss inverted-file index over every document token vector gives each query token
its nearest document tokens; the documents they belong to are the query's candidates, and only those are scored, by
exact MaxSim over their token vectors. A document no query token reached scores -inf: not found, as a deployed index
leaves it. The index is built once, at the first query set, and serves every later one."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import faiss
import numpy as np

from tasks.metrics import nan_last

MIN_PER_LIST = 39  # token vectors that train each list's centroid, at least (faiss warns below)
TRAINED_PER_LIST = 64  # ... drawn to train it (faiss's range: 39 to 256)
SEED = 0


def inverted_lists(tokens: int) -> int:
    """How many inverted lists for `tokens` document token vectors: the largest power of two at most 4 x sqrt(tokens)
    (faiss's guideline for an IVF index), fewer where each centroid would train on under MIN_PER_LIST vectors."""
    wanted = 2 ** int(np.log2(max(1.0, 4 * np.sqrt(tokens))))
    return max(1, min(wanted, tokens // MIN_PER_LIST))


class TokenIndex:
    """Each document's (tokens, dim) token vectors, searched through a faiss IVF index of 8-bit codes (a quarter of
    float32's bytes; the exact MaxSim of the candidates undoes its rounding): `nearest` document tokens for each query
    token, `probes` of its inverted lists visited."""

    def __init__(self, docs: list[np.ndarray], nearest: int, probes: int):
        self.docs, self.nearest, self.probes = docs, nearest, probes
        self.owner = np.repeat(np.arange(len(docs)), [len(d) for d in docs])  # (tokens,): each token vector's document

    def __len__(self) -> int:
        return len(self.docs)

    @cached_property
    def index(self) -> faiss.Index | None:
        """The faiss index of every token vector (None where the documents have none). Its build holds one float32
        copy of them beside the documents' own."""
        if not self.owner.size:
            return None
        flat = np.concatenate([d for d in self.docs if len(d)], dtype=np.float32)  # (tokens, dim)
        # A model's NaN vector (a collapsed one) goes into the index as 0; its exact MaxSim below is NaN: ranked last.
        np.nan_to_num(flat, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        lists = inverted_lists(len(flat))
        index = faiss.index_factory(flat.shape[1], f"IVF{lists},SQ8", faiss.METRIC_INNER_PRODUCT)
        drawn = np.random.default_rng(SEED).permutation(len(flat))[: TRAINED_PER_LIST * lists]
        index.train(flat[np.sort(drawn)])
        index.add(flat)
        return index

    def candidates(self, query: np.ndarray) -> np.ndarray:
        """The documents that `query`'s (float32) token vectors reach in the index, in row order."""
        if self.index is None:
            return np.empty(0, np.int64)
        probed = faiss.SearchParametersIVF(nprobe=self.probes)
        _, hits = self.index.search(np.nan_to_num(query), self.nearest, params=probed)
        return np.unique(self.owner[hits[hits >= 0]])  # hits: (tokens, nearest) token rows, -1 past the last found

    def of(self, queries: list[np.ndarray]) -> Callable[[slice], np.ndarray]:
        """A query set's block scores, as retrieval.scorer gives them: exact MaxSim on each query's candidates,
        -inf elsewhere."""
        def scores(block: slice) -> np.ndarray:
            asked = queries[block]
            out = np.full((len(asked), len(self.docs)), -np.inf, np.float32)
            for row, query in enumerate(asked):
                query = query.astype(np.float32, copy=False)
                found = self.candidates(query)
                # a document at a time, (query tokens, its tokens) each: no copy of the candidates' token vectors
                # (gathered into one matrix, 1.4x slower for 400 candidates of 200 tokens on 2 cores)
                out[row, found] = [(query @ self.docs[d].T).max(1).sum() for d in found]  # (found,)
            return nan_last(out)

        return scores
