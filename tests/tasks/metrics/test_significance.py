"""tasks/metrics/significance.py and the report's paired differences: the interval is scipy's paired t
interval, models are paired split by split, and a difference is significant only when its interval
leaves out 0."""

import numpy as np
import pytest
from scipy import stats

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.metrics.significance import paired_difference
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
    for r in paired.itertuples():
        by_hand = stats.ttest_rel(SPLITS[r.model], SPLITS[r.versus]).confidence_interval(0.95)
        assert (r.low, r.high) == (pytest.approx(by_hand.low), pytest.approx(by_hand.high))
        assert r.splits == 5 and r.significant == (by_hand.low > 0 or by_hand.high < 0)
    assert paired["significant"].tolist() == [True, False, False]  # c − b: −0.034 ± 0.05
    markdown = to_markdown("t", comparison_table(*catalog), paired=paired)
    assert "- docs: b − a: +0.050 [+0.038, +0.062] over 5 splits, significant" in markdown
    assert "- docs: c − a: +0.016 [" in markdown and "over 5 splits, not significant" in markdown


def test_the_table_shows_the_health_verdict_and_no_row_per_split(catalog):
    table = comparison_table(*catalog).set_index("task")
    assert table.loc["training: health"].tolist() == ["healthy", "healthy", "collapsed at step 26"]
    assert not any("knn_accuracy_split" == t.split(": ")[1] for t in table.index)
