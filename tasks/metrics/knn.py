"""kNN accuracy, the cropping paper's in-domain metric (docs/methods.md §1).

k = 10, Euclidean distance on raw embeddings, uniform votes, brute force, a 90/10 split drawn
with scikit-learn's `train_test_split(random_state=42)` (tasks/core/held_out.py: the training views
leave its test documents out); ties in the vote go to the smallest class, as in scikit-learn. The
distances are computed in float64, a block of test documents at a time (`block_bytes` of scratch
memory), so that large corpora do not need an n × n matrix. A sparse model's codes (scipy CSR) stay sparse: only
each block's distances are dense.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from tasks.core.held_out import split_indices
from tasks.metrics import BLOCK_BYTES, block_rows, dense, row_squares


def knn_predict(train_x: np.ndarray | sparse.csr_matrix, train_y: np.ndarray, test_x: np.ndarray | sparse.csr_matrix,
                k: int, n_classes: int, block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    train_x = as_float64(train_x)  # a copy only when the vectors are stored narrower
    train_sq = squared_norms(train_x, block_bytes)
    n_train, n_test = train_x.shape[0], test_x.shape[0]
    # float64 distances + argpartition's int64 positions; sparse codes' block is first a CSR product (~12 bytes a cell)
    rows = block_rows(n_train, 28 if sparse.issparse(train_x) else 16, block_bytes)
    pred = np.empty(n_test, dtype=np.int64)
    for start in range(0, n_test, rows):
        q = as_float64(test_x[start : start + rows])
        # (|q|² − 2q·t) + |t|², computed in place in the one block-sized array
        dist = dense((2 * q) @ train_x.T)
        np.subtract(row_squares(q)[:, None], dist, out=dist)
        dist += train_sq[None, :]
        nearest = np.argpartition(dist, k - 1, axis=1)[:, :k] if k < n_train else np.argsort(dist, 1)
        votes = np.zeros((len(dist), n_classes), dtype=np.int64)
        np.add.at(votes, (np.arange(len(dist))[:, None], train_y[nearest]), 1)
        pred[start : start + rows] = votes.argmax(1)  # first maximum = smallest class on ties
    return pred


def as_float64(x: np.ndarray | sparse.csr_matrix) -> np.ndarray | sparse.csr_matrix:
    return x.astype(np.float64) if sparse.issparse(x) else np.asarray(x, dtype=np.float64)


def squared_norms(x: np.ndarray | sparse.csr_matrix, block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """(x**2).sum(1), the same sums, without a squared copy of all of x (a sparse x: of its codes alone)."""
    if sparse.issparse(x):
        return row_squares(x)
    norms = np.empty(len(x), dtype=x.dtype)
    rows = block_rows(x.shape[1], x.itemsize, block_bytes)
    for start in range(0, len(x), rows):
        norms[start : start + rows] = (x[start : start + rows] ** 2).sum(1)
    return norms


def knn_skipped(labels: list, k: int) -> str | None:
    """Why kNN accuracy would say nothing about a model on these labels (a warning), or None."""
    if len(labels) < 2 * k:
        return f"only {len(labels)} labelled documents, kNN accuracy skipped"
    if len(set(labels)) == 1:  # every neighbour votes for the one label
        return (f"all {len(labels)} labelled documents have the label {labels[0]!r}: kNN accuracy would be "
                "1.000 for any model, skipped")
    return None


def knn_accuracy(x: np.ndarray, labels: list | np.ndarray, k: int = 10, test_size: float = 0.1,
                 seed: int = 42) -> tuple[float, int]:
    """Accuracy on one train/test split, and the number of test documents."""
    classes, y = np.unique(np.asarray(labels), return_inverse=True)
    train, test = split_indices(len(y), test_size, seed)
    pred = knn_predict(x[train], y[train], x[test], k, len(classes))
    return float((pred == y[test]).mean()), len(test)


def knn_accuracy_splits(x: np.ndarray, labels: list | np.ndarray, k: int, test_size: float,
                        seeds: range) -> list[float]:
    """The accuracy on each of several random splits."""
    return [knn_accuracy(x, labels, k, test_size, seed)[0] for seed in seeds]


def knn_accuracy_spread(x: np.ndarray, labels: list | np.ndarray, k: int, test_size: float,
                        seeds: range) -> tuple[float, float]:
    """Mean and standard deviation of the accuracy over several random splits."""
    return spread(knn_accuracy_splits(x, labels, k, test_size, seeds))


def spread(scores: list[float]) -> tuple[float, float]:
    return float(np.mean(scores)), float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
