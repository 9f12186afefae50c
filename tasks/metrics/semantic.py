"""SemCSE's semantic benchmark (docs/methods.md §5): does the embedding place related texts close?

- average rank (1 = best) of the matching item among all candidates, for title ↔ abstract,
  first half ↔ second half of an abstract (`split_halves`) and summary ↔ paper;
- the 5-NN same-label proportion on a labelled corpus.

Both use cosine similarity, as retrieval does: rows are L2-normalised here, so the embeddings'
norms never matter. Similarities are float64, computed a block of queries at a time within
`block_bytes` of scratch memory (tasks/metrics), so no comparison needs a queries × candidates matrix.
"""

from __future__ import annotations

import numpy as np

from tasks.metrics import BLOCK_BYTES, block_rows, unit_rows


def average_rank(queries: np.ndarray, candidates: np.ndarray, match: np.ndarray | None = None,
                 block_bytes: int = BLOCK_BYTES) -> float:
    """Mean over queries of 1 + the number of candidates strictly more similar than the right one.

    Query i's right candidate is `match[i]` (default i: queries and candidates aligned; several
    queries may share one). Ties count in the query's favour, so the rank is deterministic and
    does not depend on how a sort orders equal scores.
    """
    match = np.arange(len(queries)) if match is None else np.asarray(match)
    if match.shape != (len(queries),) or match.min(initial=0) < 0 or match.max(initial=0) >= len(candidates):
        raise ValueError(f"match needs one candidate index in [0, {len(candidates)}) per query "
                         f"({len(queries)}), got shape {match.shape}")
    q, c = unit_rows(queries), unit_rows(candidates)
    ranks = np.empty(len(q), dtype=np.int64)
    block = block_rows(len(c), 9, block_bytes)  # float64 similarities + the boolean comparison
    for start in range(0, len(q), block):
        sims = q[start : start + block] @ c.T
        right = sims[np.arange(len(sims)), match[start : start + block]]
        ranks[start : start + block] = 1 + (sims > right[:, None]).sum(1)
    return float(ranks.mean())


def split_halves(text: str) -> tuple[str, str]:
    """First and second half of the words (whitespace-split, rejoined with single spaces); for an
    odd count the middle word goes to the first half."""
    words = text.split()
    if len(words) < 2:
        raise ValueError(f"cannot split a text of {len(words)} word(s) into two halves: {text!r}")
    cut = (len(words) + 1) // 2
    return " ".join(words[:cut]), " ".join(words[cut:])


def same_label_proportion(embeddings: np.ndarray, labels: list, k: int = 5,
                          block_bytes: int = BLOCK_BYTES) -> float:
    """Mean over items of the share of its k most cosine-similar other items with its label.

    An item is never its own neighbour. Among neighbours tied at the k-th place the pick is
    arbitrary (np.argpartition), which only matters for duplicate embeddings.
    """
    if len(labels) != len(embeddings):
        raise ValueError(f"{len(embeddings)} embeddings but {len(labels)} labels")
    if len(embeddings) <= k:
        raise ValueError(f"{k} nearest neighbours need more than {k} items, got {len(embeddings)}")
    _, y = np.unique(np.asarray(labels), return_inverse=True)
    x = unit_rows(embeddings)
    shares = np.empty(len(x))
    block = block_rows(len(x), 16, block_bytes)  # float64 similarities + argpartition's int64 positions
    for start in range(0, len(x), block):
        sims = x[start : start + block] @ x.T
        rows = np.arange(len(sims))
        sims[rows, start + rows] = -np.inf  # exclude the item itself
        np.negative(sims, out=sims)  # nearest first, without a second block-sized array
        nearest = np.argpartition(sims, k - 1, axis=1)[:, :k]
        shares[start : start + block] = (y[nearest] == y[start : start + block, None]).mean(1)
    return float(shares.mean())
