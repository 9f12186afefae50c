"""benchmarks/yardsticks.py's statistics: Kendall's tau-b (as scipy's), its one-sided permutation p, split halves;
benchmarks/pool_size.py's pools."""

import sys

import numpy as np
import pytest
from scipy import stats

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmarks import each other by their file names
from pool_size import pools_of  # noqa: E402
from yardsticks import permutation_tau, split_half_tau  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
def test_tau_is_scipys_tau_b_with_ties(seed):
    rng = np.random.default_rng(seed)
    truth, score = rng.integers(0, 4, 13).astype(float), rng.integers(0, 5, 13).astype(float)
    tau, p = permutation_tau(truth, score, 200)
    assert tau == pytest.approx(stats.kendalltau(truth, score).statistic)
    assert 1 / 201 <= p <= 1


def test_p_is_small_for_the_same_ranking_large_for_the_reversed_and_one_for_ties():
    truth = np.arange(13, dtype=float)
    assert permutation_tau(truth, truth * 2, 2000) == pytest.approx((1.0, 1 / 2001))  # no permutation beats it
    tau, p = permutation_tau(truth, -truth, 2000)
    assert tau == pytest.approx(-1) and p > 0.99
    assert permutation_tau(truth, np.ones(13), 100) == (0.0, 1.0)  # a constant yardstick ranks nothing


def test_split_halves_agree_fully_for_a_steady_measure_not_at_all_for_noise_and_reversed_across_measures():
    steady = np.repeat(np.arange(13, dtype=float)[:, None], 10, axis=1)  # every unit ranks the models alike
    assert split_half_tau(steady) == pytest.approx(1.0)
    assert split_half_tau(steady, -steady[:, :7]) == pytest.approx(-1.0)  # against another measure's halves
    noise = np.random.default_rng(0).normal(size=(13, 40))
    # no ranking to find: about none, below 0 if anything (a sample's halves share its total)
    assert -0.25 < split_half_tau(noise) < 0.05
    # a ranking under noise: its halves agree less than the whole would, but well above chance
    noisy = steady[:, :1] + np.random.default_rng(1).normal(scale=4.0, size=(13, 40))
    assert 0.3 < split_half_tau(noisy) < 0.9


@pytest.mark.parametrize("size, draws, count", [(3, 100, 66), (3, 40, 40), (13, 40, 1), (2, 40, 12)])
def test_every_pool_holds_the_untrained_model_and_distinct_candidates(size, draws, count):
    pools = pools_of(12, size, draws)
    assert len(pools) == len(set(pools)) == count  # all of them where few, else distinct draws
    assert all(p[0] == 0 and len(set(p)) == size and set(p[1:]) <= set(range(1, 13)) for p in pools)

