import numpy as np
import pytest
from scipy.stats import spearmanr

from tasks.metrics.sts import sts_spearman


def test_sts_spearman_on_fixed_embeddings():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = np.array([[1.0, 0.1], [1.0, 1.0], [0.0, 1.0]])
    scores = np.array([5.0, 3.0, 0.5])
    cos = (a * b).sum(1) / np.linalg.norm(b, axis=1)
    assert sts_spearman(a, b, scores) == pytest.approx(spearmanr(cos, scores).statistic)
    assert sts_spearman(a, b, scores) == pytest.approx(1.0)
