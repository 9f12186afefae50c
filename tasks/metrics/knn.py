"""kNN accuracy, the cropping paper's in-domain metric (docs/methods.md §1).

k = 10, Euclidean distance on raw embeddings, uniform votes, brute force, a 90/10 split drawn
with scikit-learn's `train_test_split(random_state=42)`; ties in the vote go to the smallest
class, as in scikit-learn. The distances are computed in float64 chunks so that large corpora
do not need an n × n matrix.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import train_test_split


def knn_predict(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, k: int,
                n_classes: int, chunk: int = 1024) -> np.ndarray:
    train_x = train_x.astype(np.float64)
    train_sq = (train_x**2).sum(1)
    pred = np.empty(len(test_x), dtype=np.int64)
    for start in range(0, len(test_x), chunk):
        q = test_x[start : start + chunk].astype(np.float64)
        dist = (q**2).sum(1)[:, None] - 2 * q @ train_x.T + train_sq[None, :]
        nearest = np.argpartition(dist, k - 1, axis=1)[:, :k] if k < len(train_x) else np.argsort(dist, 1)
        votes = np.zeros((len(q), n_classes), dtype=np.int64)
        np.add.at(votes, (np.arange(len(q))[:, None], train_y[nearest]), 1)
        pred[start : start + chunk] = votes.argmax(1)  # first maximum = smallest class on ties
    return pred


def knn_skipped(labels: list, k: int) -> str | None:
    """Why kNN accuracy would say nothing about a model on these labels (a warning), or None."""
    if len(labels) < 2 * k:
        return f"only {len(labels)} labelled documents, kNN accuracy skipped"
    if len(set(labels)) == 1:  # every neighbour votes for the one label
        return (f"all {len(labels)} labelled documents have the label {labels[0]!r}: kNN accuracy would be "
                "1.000 for any model, skipped")
    return None


def split_indices(n: int, test_size: float = 0.1, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """Train and test positions among n labelled documents (the paper's split for seed 42)."""
    return train_test_split(np.arange(n), test_size=test_size, random_state=seed)


def knn_accuracy(x: np.ndarray, labels: list | np.ndarray, k: int = 10, test_size: float = 0.1,
                 seed: int = 42) -> tuple[float, int]:
    """Accuracy on one train/test split, and the number of test documents."""
    classes, y = np.unique(np.asarray(labels), return_inverse=True)
    train, test = split_indices(len(y), test_size, seed)
    pred = knn_predict(x[train], y[train], x[test], k, len(classes))
    return float((pred == y[test]).mean()), len(test)


def knn_accuracy_spread(x: np.ndarray, labels: list | np.ndarray, k: int, test_size: float,
                        seeds: range) -> tuple[float, float]:
    """Mean and standard deviation of the accuracy over several random splits."""
    scores = [knn_accuracy(x, labels, k, test_size, seed)[0] for seed in seeds]
    return float(np.mean(scores)), float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
