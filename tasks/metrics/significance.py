"""Paired significance: is model A's score really above model B's, or is it the split?

Two models scored on the same random train/test splits (kNN accuracy over `evaluate.knn.repeats`
seeds) give one difference per split; the splits' own noise is shared, so the mean difference's
confidence interval is much narrower than the two scores' spreads suggest. The interval is
Student's t over the paired differences: mean ± t(1 − α/2, n − 1) × sd / √n. A difference is
significant when its interval leaves out 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedDifference:
    mean: float  # mean of a − b over the paired splits
    low: float
    high: float
    n: int  # paired splits

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
