"""STS: Spearman correlation between cosine similarities and human scores."""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr


def sts_spearman(a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> float:
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(spearmanr(cos, scores).statistic)
