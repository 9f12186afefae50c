"""The comparison table: tasks as rows, models as columns, MTEB block means at the bottom."""

import numpy as np
import pyarrow as pa
import pytest

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_TOP, Catalog
from storage.store import ArtifactStore
from tasks.metrics.pool import pool_scores
from tasks.report import REPORT, ReportEntry, ReportInputs, ReportJob
from tasks.reporting.tables import beside_teacher, comparison_table, long_rows, paired_differences, to_markdown
from tests.helpers import write_scores

# Two models; block means by hand: clustering (0.2+0.4)/2=0.3 and 0.5; sts (0.8) and 0.6.
SCORES = {
    "a": [("clust1", "clustering", 0.2), ("clust2", "clustering", 0.4), ("sts1", "sts", 0.8), ("hub", "sts", None)],
    "b": [("clust1", "clustering", 0.5), ("clust2", "clustering", 0.5), ("sts1", "sts", 0.6), ("hub", "sts", None)],
}


@pytest.fixture
def entries(tmp_path):
    store = ArtifactStore(tmp_path)
    rows = []
    for model, tasks in SCORES.items():
        rows.append(write_scores(store, "evaluate", f"eval-{model}", [
            dict(metric="knn_accuracy", value=0.5 if model == "a" else 0.25, n=20),
            dict(metric="knn_accuracy_splits", value=0.4, std=0.05, n=20, repeats=10),
            dict(metric="knn_accuracy_layerwise", value=0.1, layer=0, pooling="cls")],
            model=model, dataset="docs", status="ok"))
        for task, block, value in tasks:
            status, note = ("ok", None) if value is not None else ("skipped", "data not reachable: offline")
            # A task scored on two subsets counts once, with their mean.
            subsets = [value] if task != "sts1" else [value - 0.1, value + 0.1]
            rows.append(write_scores(store, "mteb", f"{model}-{task}",
                                     [dict(metric=task, value=v, subset=str(i)) for i, v in enumerate(subsets)],
                                     model=model, dataset="mteb", task_type=block, main_score="score", status=status,
                                     note=note))
    return Catalog(store), rows


def test_tasks_are_rows_models_are_columns_with_block_means(entries):
    catalog, rows = entries
    table = comparison_table(catalog, rows).set_index("task")
    assert list(table.columns) == ["a", "b"]
    assert table.loc["docs: knn_accuracy"].tolist() == ["0.500", "0.250"]
    assert table.loc["docs: knn_n"].tolist() == ["20", "20"]
    assert table.loc["docs: knn_accuracy_splits"].tolist() == ["0.400 ± 0.050"] * 2
    assert table.loc["sts: sts1 (score)"].tolist() == ["0.800", "0.600"]
    assert table.loc["sts: hub (score)"].tolist() == ["skipped", "skipped"]
    assert table.loc["block mean: clustering (2 tasks)"].tolist() == ["0.300", "0.500"]
    assert table.loc["block mean: sts (1 task)"].tolist() == ["0.800", "0.600"]
    assert table.loc["average of block means (clustering, sts)"].tolist() == ["0.550", "0.550"]
    assert list(table.index[-3:]) == ["block mean: clustering (2 tasks)", "block mean: sts (1 task)",
                                      "average of block means (clustering, sts)"]
    assert not any("layerwise" in t for t in table.index)  # curves are pictures, not rows


def test_long_rows_and_markdown_agree_with_the_catalog(entries):
    catalog, rows = entries
    long = long_rows(catalog, rows)
    assert len(long) == 2 * (3 + 5)  # 3 in-domain rows, 5 MTEB rows (sts1 has two subsets)
    markdown = to_markdown("t", comparison_table(catalog, rows), ["skipped: hub: data not reachable"],
                           [("curve", "layerwise.png")])
    assert "| task | a | b |" in markdown and "| average of block means (clustering, sts) | 0.550 | 0.550 |" in markdown
    assert "- skipped: hub: data not reachable" in markdown and "![curve](layerwise.png)" in markdown


def test_a_static_model_is_set_beside_its_teacher_with_the_share_it_keeps_and_both_speeds(entries):
    """b as a static model of a: the scores where higher is better, kept as a share, and the two CPU speeds."""
    catalog, rows = entries
    store = catalog.store
    rows.append(write_scores(store, "speed", "speed-b", [dict(metric="cpu_docs_per_s", value=3000.0, n=256),
                                                          dict(metric="teacher_cpu_docs_per_s", value=25.0, n=256)],
                             model="b", dataset="docs", status="ok"))
    catalog = Catalog(store)  # its views list the files there when opened
    table = beside_teacher(long_rows(catalog, rows), "b", "a").set_index("score")
    assert list(table.columns) == ["a", "b", "kept"]
    assert table.loc["docs: knn_accuracy"].tolist() == ["0.500", "0.250", "50.0%"]
    assert table.loc["docs: knn_accuracy_splits"].tolist() == ["0.400", "0.400", "100.0%"]
    assert table.loc["mteb: clust1 (score)"].tolist() == ["0.200", "0.500", "250.0%"]
    assert table.loc["mteb: sts1 (score)"].tolist() == ["0.800", "0.600", "75.0%"]  # the mean of its two subsets
    assert "mteb: hub (score)" not in table.index  # skipped: nothing to keep
    assert table.loc["CPU documents/s (256 documents, in turn)"].tolist() == ["25.0", "3,000.0", "120.0x faster"]
    assert len(table) == 6  # nothing else: layer-wise points, the speeds themselves are not "kept"
    markdown = to_markdown("t", comparison_table(catalog, rows), beside=[beside_teacher(long_rows(catalog, rows),
                                                                                       "b", "a")])
    assert "## b beside its teacher a" in markdown and "| docs: knn_accuracy | 0.500 | 0.250 | 50.0% |" in markdown


def ranked_by(kind: str, rng: np.random.Generator) -> pa.Table:
    """What one model's evaluate artifact keeps of a pooled yardstick (YARDSTICK_TOP): the neighbours' 6 held-out
    documents' rankings of 20; the clusters' every one of 30 documents' 10 nearest others and its vector."""
    if kind == "neighbours":
        return pa.table({"query_id": [f"doc-{q}" for q in range(6)],
                         "top": pa.array([rng.permutation(20)[:10].astype(np.int32) for _ in range(6)],
                                         pa.list_(pa.int32()))})
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    return pa.table({"query_id": [f"doc-{q:02d}" for q in range(30)], "own": pa.array(range(30), pa.int32()),
                     "top": pa.array([np.delete(rng.permutation(30), 0)[:10].astype(np.int32) for _ in range(30)],
                                     pa.list_(pa.int32())),
                     "vector": pa.array(list(vectors), pa.list_(pa.float32()))})


@pytest.mark.parametrize("kind, metric, asked", [("neighbours", "neighbours_ndcg_at_10", 6),
                                                 ("clusters", "clusters_purity_at_10", 30)])
def test_a_pooled_yardstick_is_scored_by_the_models_judging_each_other_in_every_view(tmp_path, kind, metric, asked):
    """The neighbours and the clusters (pooled kinds) give no score of one model: the models that ranked one
    yardstick's documents judge each other, as select's candidates do (tasks/metrics/pool.py: pool_scores), in the
    table, the long rows and the paired differences, which the report stage, `embforge run` and `embforge report`
    share."""
    store, rng = ArtifactStore(tmp_path), np.random.default_rng(0)
    with store.writing(ArtifactRef("yardstick", "y1"), config={}, inputs=[], code_version="v", libraries={}) as out:
        out.extra["kind"] = kind
    ranked = {m: ranked_by(kind, rng) for m in "abc"}
    entries = [write_scores(store, "evaluate", f"eval-{m}", [dict(metric="final_loss", value=1.0)],
                            tables={YARDSTICK_TOP: ranked[m]} if m in ranked else {}, config={"dataset": "docs"},
                            roles={"yardstick": "y1"}, model=m, dataset="docs", status="ok")
               for m in "abcd"]  # d ranked nothing (no rankings stored): not in the pool
    catalog = Catalog(store)
    judged = pool_scores(store, {m: ArtifactRef("evaluate", f"eval-{m}") for m in "abc"})
    means = [f"{judged[m].mean():.3f}" for m in "abc"]
    assert comparison_table(catalog, entries).set_index("task").loc[f"docs: {metric}"].tolist() == [
        *means, ""]
    paired = paired_differences(catalog, entries).query(f"metric == '{metric}'")
    assert list(zip(paired["model"], paired["versus"])) == [("b", "a"), ("c", "a"), ("c", "b")]
    assert paired["n"].tolist() == [asked] * 3
    assert paired["difference"].iloc[1] == pytest.approx((judged["c"] - judged["a"]).mean())
    long = long_rows(catalog, entries).query(f"metric == '{metric}'")
    assert long["model"].tolist() == ["a", "b", "c"] and long["value"].tolist() == pytest.approx(
        [judged[m].mean() for m in "abc"])
    assert set(long["status"]) == {"ok"} and set(long["split"]) == {"held_out"}
    job = ReportJob(title="t", entries=[ReportEntry(label=m, method="m") for m in "abcd"])
    report = REPORT.run(store, job, ReportInputs(scores={e["label"]: [ArtifactRef("evaluate", e["key"])]
                                                         for e in entries}))
    assert f"| docs: {metric} | {' | '.join(means)} |  |" in (store.path(report) / "report.md").read_text()
    # One model that ranked them is no pool: no score.
    assert f"docs: {metric}" not in comparison_table(catalog, entries[2:])["task"].tolist()
