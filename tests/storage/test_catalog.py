import pandas as pd
import pyarrow as pa

from storage.catalog import Catalog
from storage.store import ArtifactRef, ArtifactStore


def test_views_exist_on_an_empty_store(tmp_path):
    catalog = Catalog(ArtifactStore(tmp_path))
    for view in ("artifacts", "runs", "run_stages", "metrics", "run_metrics", "summaries"):
        assert catalog.query(f"SELECT count(*) AS n FROM {view}") == [{"n": 0}]
    # Every metrics column exists before the first score, so reports can be queried on any store.
    assert catalog.query("SELECT count(*) AS n FROM metrics WHERE task_type = 'sts' AND layer = 0") == [{"n": 0}]
    assert catalog.query("SELECT count(*) AS n FROM summaries WHERE status = 'ok' AND prompt_id = 1") == [{"n": 0}]


def test_catalog_joins_runs_to_metrics(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = ArtifactRef("evaluate", "e1")
    metrics = pd.DataFrame([dict(key="e1", model="m", dataset="d", metric="knn_accuracy", value=0.5,
                                 std=None, n=10, repeats=1, split="seed 42")])
    with store.writing(ref, config={"k": 10}, inputs=[ArtifactRef("ingest", "docs")], code_version="v",
                       libraries={}) as out:
        out.write_table("metrics", pa.Table.from_pandas(metrics, preserve_index=False))
    store.write_run("run-1", dict(run_id="run-1", name="x", status="completed", config_path="c.yaml",
                                  config={}, started_at="2026-01-01T00:00:00+00:00", finished_at=None,
                                  error=None, stages=[dict(stage="evaluate", label="crops", method="crops",
                                                           key="e1", state="Completed")]))
    catalog = Catalog(store)
    assert catalog.query("SELECT stage, key, inputs FROM artifacts") == [
        {"stage": "evaluate", "key": "e1", "inputs": ["docs"]}]
    assert catalog.query("SELECT run_id, label, metric, value FROM run_metrics") == [
        {"run_id": "run-1", "label": "crops", "metric": "knn_accuracy", "value": 0.5}]
    assert catalog.latest_run_id() == "run-1"
