"""STS: Spearman correlation between cosine similarities and human scores."""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr


def pair_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` with the same row of `b`."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def cosine_spearman(cosines: np.ndarray, scores: np.ndarray) -> float:
    return float(spearmanr(cosines, scores).statistic)


def sts_spearman(a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> float:
    return cosine_spearman(pair_cosines(a, b), scores)
