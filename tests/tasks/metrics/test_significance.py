"""tasks/metrics/significance.py and the report's paired differences: the kNN interval is scipy's paired
t interval, models are paired split by split; the STS interval is scipy's paired percentile bootstrap,
models are paired pair by pair; a difference is significant only when its interval leaves out 0."""

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from storage.catalog import STS_PAIRS, Catalog
from storage.store import ArtifactStore
from tasks.metrics.significance import bootstrap_spearman_difference, paired_difference
from tasks.reporting.tables import comparison_table, paired_differences, to_markdown
from tests.helpers import write_scores

# kNN accuracy of three models on the same 5 splits: b is a + about 0.05 (shared split noise),
# c is a + a noise larger than its mean.
SPLITS = {"a": [0.40, 0.46, 0.38, 0.50, 0.44], "b": [0.46, 0.50, 0.44, 0.55, 0.48],
          "c": [0.45, 0.42, 0.43, 0.47, 0.49]}


def test_the_interval_is_the_paired_t_interval():
    a, b = np.array(SPLITS["b"]), np.array(SPLITS["a"])
    d = paired_difference(a, b)
    low, high = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (d.mean, d.low, d.high, d.n) == (pytest.approx(np.mean(a - b)), pytest.approx(low), pytest.approx(high), 5)
    assert d.significant and not paired_difference(np.array(SPLITS["c"]), a).significant
    assert paired_difference(a + 0.01, a).low == pytest.approx(0.01)  # no spread: a point interval
    with pytest.raises(ValueError, match="two paired measurements"):
        paired_difference(a[:1], b[:1])


@pytest.fixture
def catalog(tmp_path):
    store = ArtifactStore(tmp_path)
    entries = []
    for model, scores in SPLITS.items():
        order = list(enumerate(scores))[::-1] if model == "c" else list(enumerate(scores))  # paired by split name
        rows = [dict(metric="knn_accuracy_split", value=s, split=f"seed {i}", n=20) for i, s in order]
        rows += [dict(metric="knn_accuracy_splits", value=float(np.mean(scores)), std=float(np.std(scores, ddof=1)),
                      n=20, repeats=5),
                 dict(metric="health", value=None, note="collapsed at step 26" if model == "c" else "healthy",
                      dataset="training")]
        entries.append(write_scores(store, "evaluate", f"eval-{model}", rows, model=model, dataset="docs",
                                    status="ok"))
    return Catalog(store), entries


def test_each_model_is_compared_with_each_earlier_one_split_by_split(catalog):
    paired = paired_differences(*catalog)
    assert [(r.model, r.versus) for r in paired.itertuples()] == [("b", "a"), ("c", "a"), ("c", "b")]
    assert set(paired["metric"]) == {"knn_accuracy"} and set(paired["interval"]) == {"t"}  # no STS scored here
    for r in paired.itertuples():
        by_hand = stats.ttest_rel(SPLITS[r.model], SPLITS[r.versus]).confidence_interval(0.95)
        assert (r.low, r.high) == (pytest.approx(by_hand.low), pytest.approx(by_hand.high))
        assert r.n == 5 and r.significant == (by_hand.low > 0 or by_hand.high < 0)
    assert paired["significant"].tolist() == [True, False, False]  # c − b: −0.034 ± 0.05
    markdown = to_markdown("t", comparison_table(*catalog), paired=paired)
    assert "- docs: knn_accuracy: b − a: +0.050 [+0.038, +0.062] over 5 splits, significant" in markdown
    assert "- docs: knn_accuracy: c − a: +0.016 [" in markdown and "over 5 splits, not significant" in markdown


def test_the_table_shows_the_health_verdict_and_no_row_per_split(catalog):
    table = comparison_table(*catalog).set_index("task")
    assert table.loc["training: health"].tolist() == ["healthy", "healthy", "collapsed at step 26"]
    assert not any("knn_accuracy_split" == t.split(": ")[1] for t in table.index)


# Gold STS scores of 300 pairs and three models' cosines: `good` tracks the gold scores more closely than
# `fair`; `fair_too` is `fair` with a little noise of its own.
RNG = np.random.default_rng(7)
GOLD = RNG.uniform(0, 5, 300)
GOOD, FAIR = GOLD + RNG.normal(0, 1.5, 300), GOLD + RNG.normal(0, 3.0, 300)
FAIR_TOO = FAIR + RNG.normal(0, 0.3, 300)


def spearman_difference(x, y, gold):
    return stats.spearmanr(x, gold).statistic - stats.spearmanr(y, gold).statistic


def test_the_sts_interval_is_the_paired_percentile_bootstrap():
    d = bootstrap_spearman_difference(GOOD, FAIR, GOLD, resamples=2000)
    assert d.mean == pytest.approx(spearman_difference(GOOD, FAIR, GOLD)) and d.n == 300
    scipy = stats.bootstrap((GOOD, FAIR, GOLD), spearman_difference, paired=True, vectorized=False,
                            n_resamples=2000, method="percentile", random_state=1).confidence_interval
    # Two bootstraps of 2000 samples agree to Monte Carlo error (~0.005 here), not digit for digit.
    assert (d.low, d.high) == (pytest.approx(scipy.low, abs=0.015), pytest.approx(scipy.high, abs=0.015))
    assert d.low < d.mean < d.high and d.significant
    assert bootstrap_spearman_difference(GOOD, FAIR, GOLD, resamples=2000) == d  # seeded: the same interval
    assert not bootstrap_spearman_difference(FAIR_TOO, FAIR, GOLD).significant
    ties = np.round(GOOD)  # tied similarities get their average rank, as in scipy
    assert bootstrap_spearman_difference(ties, FAIR, GOLD).mean == pytest.approx(spearman_difference(ties, FAIR, GOLD))
    with pytest.raises(ValueError, match="three items"):
        bootstrap_spearman_difference(GOOD[:2], FAIR[:2], GOLD[:2])


def test_sts_scores_are_compared_pair_by_pair_only_on_the_same_pairs(tmp_path):
    store, entries = ArtifactStore(tmp_path), []
    other_gold = GOLD[::-1].copy()  # another STS file with as many pairs: never paired with the others
    for model, cosines, gold in (("fair", FAIR, GOLD), ("good", GOOD, GOLD), ("other", GOOD, other_gold)):
        table = pa.table({"pair": np.arange(300, dtype=np.int32), "score": gold, "cosine": cosines.astype(np.float32)})
        rows = [dict(metric="sts_spearman", value=stats.spearmanr(cosines.astype(np.float32), gold).statistic,
                     n=300, repeats=1, split="test")]
        entries.append(write_scores(store, "evaluate", f"eval-{model}", rows, tables={STS_PAIRS: table},
                                    model=model, dataset="docs", status="ok"))
    paired = paired_differences(Catalog(store), entries)
    assert [(r.metric, r.model, r.versus, r.n, r.interval) for r in paired.itertuples()] == [
        ("sts_spearman", "good", "fair", 300, "bootstrap")]
    by_hand = bootstrap_spearman_difference(GOOD.astype(np.float32), FAIR.astype(np.float32), GOLD)
    assert (paired["difference"][0], paired["low"][0], paired["high"][0]) == (by_hand.mean, by_hand.low, by_hand.high)
    assert paired["significant"][0]
    line = f"- docs: sts_spearman: good − fair: {by_hand.mean:+.3f} [{by_hand.low:+.3f}, {by_hand.high:+.3f}] over 300 "
    assert line + "pairs (bootstrap), significant" in to_markdown("t", comparison_table(Catalog(store), entries),
                                                                  paired=paired)
