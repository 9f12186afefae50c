"""Paired significance: is model A's score really above model B's, or is it the split?

Two models scored on the same random train/test splits (kNN accuracy over `evaluate.knn.repeats`
seeds) give one difference per split; the splits' own noise is shared, so the mean difference's
confidence interval is much narrower than the two scores' spreads suggest. The interval is
Student's t over the paired differences: mean ± t(1 − α/2, n − 1) × sd / √n.

A score from one split (STS Spearman over one file's pairs) has no repeats to pair. There the items
are resampled: each bootstrap sample draws the pairs with replacement, scores both models on the
same draw, and keeps the difference; the interval is the percentiles of those differences (the
percentile bootstrap, paired). A difference is significant when its interval leaves out 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedDifference:
    mean: float  # a − b: the mean over the paired splits, or the difference of the two scores
    low: float
    high: float
    n: int  # paired splits, or the items resampled

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0


def paired_difference(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> PairedDifference:
    """The mean of a − b over paired measurements (same split, same position) and its t interval."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2:
        raise ValueError("a paired interval needs two paired measurements or more")
    mean, half = float(d.mean()), 0.0
    if d.std(ddof=1) > 0:
        half = float(stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return PairedDifference(mean, mean - half, mean + half, len(d))


def _centred_ranks(x: np.ndarray) -> np.ndarray:
    """Each row's ranks (ties get their average rank, as in spearmanr), minus the row's mean rank."""
    ranks = stats.rankdata(x, axis=1)
    return ranks - ranks.mean(axis=1, keepdims=True)


def _pearson_rows(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """Pearson's r of centred rows: Spearman's rho when they are centred ranks (rows: bootstrap samples)."""
    return (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))


def bootstrap_spearman_difference(a: np.ndarray, b: np.ndarray, gold: np.ndarray, resamples: int = 1000,
                                  seed: int = 0, confidence: float = 0.95) -> PairedDifference:
    """Spearman(a, gold) − Spearman(b, gold) for two models' similarities `a`, `b` of the same items,
    with the paired percentile bootstrap interval (seeded: a rerun gives the same interval)."""
    a, b, gold = (np.asarray(v, float) for v in (a, b, gold))
    n = len(gold)
    if n < 3:
        raise ValueError("a bootstrap interval needs three items or more")
    observed = float(stats.spearmanr(a, gold).statistic - stats.spearmanr(b, gold).statistic)
    rng, differences = np.random.default_rng(seed), []
    for start in range(0, resamples, 100):  # 100 samples at a time: ~3 x 100 x n floats of scratch
        draw = rng.integers(0, n, size=(min(100, resamples - start), n))  # (samples, n) item indices
        g = _centred_ranks(gold[draw])  # ranked once for both models
        differences.append(_pearson_rows(_centred_ranks(a[draw]), g) - _pearson_rows(_centred_ranks(b[draw]), g))
    low, high = np.quantile(np.concatenate(differences), [(1 - confidence) / 2, (1 + confidence) / 2])
    return PairedDifference(observed, float(low), float(high), n)
