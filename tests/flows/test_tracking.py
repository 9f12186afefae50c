"""Every run logged to a real MLflow tracking server (SQLite backend, on loopback), read back
through MLflow's client."""

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests.helpers import free_port


@pytest.fixture(scope="module")
def logged(tracked_run, mlflow_server):
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("tiny-tracked")
    [run] = client.search_runs([experiment.experiment_id], f"tags.`embforge.run_id` = '{tracked_run.run_id}'")
    return client, run, Catalog(ArtifactStore(tracked_run.store))


def test_config_and_artifact_keys_lead_back_to_the_store(logged, tracked_run):
    client, run, catalog = logged
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["name"] == "tiny-tracked" and params["methods.0.recipe"] == "crops"
    assert float(params["train.lr"]) == 1e-3 and params["evaluate.mteb.local.0.name"] == "STSB-slice"
    tags = run.data.tags
    assert tags["embforge.flow"] == "pipeline" and tags["embforge.store"] == str(tracked_run.store)
    stages = catalog.query("SELECT stage, label, key FROM run_stages WHERE run_id = ?", [tracked_run.run_id])
    assert {s["key"] for s in stages} == {key for name, keys in tags.items() if name.startswith("embforge.artifact.")
                                          for key in keys.split()}
    train = next(s["key"] for s in stages if s["stage"] == "train")
    assert tags["embforge.artifact.train.crops"] == train


def test_training_curves_step_by_step(logged, tracked_run):
    client, run, catalog = logged
    train = catalog.query("SELECT key FROM run_stages WHERE run_id = ? AND stage = 'train'", [tracked_run.run_id])
    steps = pd.read_parquet(tracked_run.store / "artifacts" / "train" / train[0]["key"] / "training.parquet")
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "crops/train/loss"))
    expected = steps.dropna(subset=["loss"])
    assert [step for step, _ in loss] == list(expected["step"])
    assert [value for _, value in loss] == pytest.approx(list(expected["loss"]))
    assert len(loss) >= 8  # one point per training step
    assert len(client.get_metric_history(run.info.run_id, "crops/train/lr")) == len(loss)
    norms = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "crops/train/grad_norm"))
    assert norms == [(s, pytest.approx(v)) for s, v in zip(expected["step"], expected["grad_norm"])]
    curve = sorted(m.step for m in client.get_metric_history(run.info.run_id, "crops/train/knn_accuracy"))
    assert curve[0] == 0 and curve == sorted(steps.dropna(subset=["knn_accuracy"])["step"])


def test_final_scores_match_the_catalog(logged, tracked_run):
    client, run, catalog = logged
    scores = catalog.query("SELECT label, dataset, metric, value FROM run_metrics WHERE run_id = ? "
                           "AND step IS NULL AND value IS NOT NULL", [tracked_run.run_id])
    metrics = run.data.metrics
    knn = next(s for s in scores if s["label"] == "crops" and s["metric"] == "knn_accuracy")
    assert metrics["crops/ohsumed-tiny/knn_accuracy"] == pytest.approx(knn["value"])
    sts = next(s for s in scores if s["label"] == "base (random init)" and s["metric"] == "STSB-slice")
    assert metrics["base random init/mteb/STSB-slice"] == pytest.approx(sts["value"])
    assert len([k for k in metrics if k.startswith("crops/")]) >= 8  # kNN, STS, geometry, MTEB, the curves' last


def test_report_and_pictures_are_artifacts(logged):
    client, run, _ = logged
    report = {f.path for f in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/report.md", "report/report.parquet"} <= report
    pictures = {f.path for f in client.list_artifacts(run.info.run_id, "pictures/crops")}
    assert "pictures/crops/tsne.png" in pictures
    local = client.download_artifacts(run.info.run_id, "report/report.md")
    assert "| task | base (random init) | crops |" in open(local).read()


@pytest.mark.usefixtures("prefect_harness")
def test_an_unreachable_tracker_costs_the_run_nothing(tracked_run, caplog):
    from flows.params import RunParams
    from flows.pipeline import pipeline

    config = yaml.safe_load(tracked_run.config.read_text())
    config["tracking"]["mlflow"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    path = tracked_run.config.with_name("unreachable.yaml")
    path.write_text(yaml.safe_dump(config))
    state = pipeline(RunParams(config=str(path)), return_state=True)
    assert state.is_completed()  # the tracker's error is logged, not raised
    # Found unreachable by the probe, in seconds: MLflow's client alone retries for minutes (248 s measured).
    assert any(f"no MLflow server answers at {config['tracking']['mlflow']}" in r.getMessage()
               for r in caplog.records)
    # `tracking` is no part of any stage's identity: another tracker re-runs nothing.
    states = Catalog(ArtifactStore(tracked_run.store)).query(
        "SELECT DISTINCT state FROM run_stages WHERE run_id = ?", [str(state.state_details.flow_run_id)])
    assert states == [{"state": "Cached"}]
