"""Retrieval with one relevant document per query: the rank of that document among all of them, and
nDCG@k, recall@k and MRR@k from it (the held-out generated queries of docs/gpl.md)."""

from __future__ import annotations

import numpy as np

from tasks.metrics import BLOCK_BYTES, block_rows, ranks_of_own, unit_rows


def relevant_ranks(queries: np.ndarray, docs: np.ndarray, relevant: np.ndarray,
                   block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """The rank (cosine, ties against it) of each query's relevant document among all `docs`,
    queries scored in blocks so the scores and their comparison stay under `block_bytes`."""
    q, d = unit_rows(queries, np.float32), unit_rows(docs, np.float32)
    ranks = np.empty(len(q), dtype=np.int64)
    step = block_rows(len(d), 5, block_bytes)  # float32 scores + the bool comparison
    for start in range(0, len(q), step):
        scores = q[start : start + step] @ d.T  # (block, docs)
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
