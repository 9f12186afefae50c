"""Experiment tracking: a finished embforge run, logged to MLflow from the store.

One MLflow run per embforge run (pipeline, train, evaluate, summarize; from the CLI, a deployment
or the Prefect UI alike), in the experiment named after the config. It holds:
- params: the config, flattened to dotted fields (`train.lr`, `methods.0.recipe`);
- tags: the embforge run id, flow, config file and store, and every stage's artifact key
  (`embforge.artifact.<stage>.<label>`: the keys, space-separated), which lead back to the store;
- metrics: per trained model its per-step training loss and learning rate and the kNN learning
  curve (`<label>/train/loss` at each step), and every final score (`<label>/<dataset>/<metric>`);
- artifacts: the report (Markdown, Parquet, curves) and each model's pictures.
Everything is read from the catalog after the run, so what MLflow shows is what the store holds.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from storage.base import ArtifactRef
from storage.catalog import FINAL_SCORE, Catalog
from storage.store import ArtifactStore

# MLflow names allow letters, digits, _ - . / and spaces.
UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]+")
MAX_PARAM = 6000  # MLflow's limit on a param's value
TRAINING_CURVES = ("loss", "lr", "grad_norm", "probe_cosine", "knn_accuracy")


def metric_name(*parts: str) -> str:
    """`/`-joined parts, each with what MLflow does not take turned into spaces: `base random init`."""
    return "/".join(" ".join(UNSAFE.sub(" ", p).split()) or "_" for p in parts)


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as {dotted.field: value as text}."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}{key}.").items()}
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}{i}.").items()}
    text = json.dumps(value) if isinstance(value, list) else str(value)
    return {prefix.rstrip("."): text[:MAX_PARAM]}


def training_metrics(store: ArtifactStore, catalog: Catalog, run_id: str) -> list[tuple[str, float, int]]:
    """(name, value, step) of every trained model's per-step loss, learning rate and kNN curve."""
    found = []
    for stage in catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'train' "
                               "ORDER BY position", [run_id]):
        rows = store.read_table(ArtifactRef("train", stage["key"]), "training").to_pylist()
        found += [(metric_name(stage["label"], "train", curve), float(row[curve]), int(row["step"]))
                  for row in rows for curve in TRAINING_CURVES if row.get(curve) is not None]
    return found


def final_metrics(catalog: Catalog, run_id: str) -> dict[str, float]:
    """Every score of the run, not the curves (layer-wise, learning) it also holds."""
    rows = catalog.query(f"""
        SELECT rs.label, m.dataset, m.metric, m.value FROM run_stages rs JOIN metrics m ON m.key = rs.key
        WHERE rs.run_id = ? AND m.value IS NOT NULL AND {FINAL_SCORE} ORDER BY rs.position""", [run_id])
    return {metric_name(r["label"], r["dataset"] or "", r["metric"]): float(r["value"]) for r in rows}


def pictures(store: ArtifactStore, catalog: Catalog, run_id: str) -> dict[str, list[Path]]:
    """MLflow artifact folder → files: the report's folder, and each evaluated model's pictures."""
    found: dict[str, list[Path]] = {}
    for stage in catalog.query("SELECT stage, label, key FROM run_stages WHERE run_id = ? "
                               "AND stage IN ('report', 'evaluate') ORDER BY position", [run_id]):
        ref = ArtifactRef(stage["stage"], stage["key"])
        store.check(ref)
        folder = store.path(ref)
        if stage["stage"] == "report":
            found["report"] = sorted(p for p in folder.iterdir() if p.is_file())
        else:
            found[f"pictures/{metric_name(stage['label'])}"] = sorted(folder.glob("*.png"))
    return found


def artifact_tags(stages: list[dict]) -> dict[str, str]:
    """`embforge.artifact.<stage>[.<label>]` → the keys of those artifacts, space-separated in run
    order (a model has two embed artifacts: its documents' and the STS pairs')."""
    tags: dict[str, list[str]] = {}
    for s in stages:
        name = f"embforge.artifact.{s['stage']}" + (f".{metric_name(s['label'])}" if s["label"] else "")
        tags.setdefault(name, []).append(s["key"])
    return {name: " ".join(dict.fromkeys(keys)) for name, keys in tags.items()}


def epoch_ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)  # the catalog's times are UTC without a zone


def answering(uri: str, timeout_s: float = 5) -> None:
    """Fail within seconds if an HTTP tracking server does not answer: MLflow's client retries a
    refused connection with back-offs for minutes before it gives up."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:  # it answered (an auth proxy, an old server): the client will tell
        return
    except OSError as e:
        raise ConnectionError(f"no MLflow server answers at {uri} within {timeout_s:.0f} s "
                              f"({getattr(e, 'reason', e)}); check tracking.mlflow") from None


def log_run(store: ArtifactStore, run_id: str, uri: str) -> str:
    """Log the embforge run `run_id` (finished, in `store`) to the MLflow server at `uri`; returns
    the MLflow run id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    answering(uri)
    catalog = Catalog(store)
    [record] = catalog.query("SELECT run_id, name, flow, status, config_path, config, error, started_at, "
                             "finished_at FROM runs WHERE run_id = ?", [run_id])
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(record["name"])
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(record["name"])
    stages = catalog.query("SELECT stage, label, key FROM run_stages WHERE run_id = ? ORDER BY position", [run_id])
    tags = {"embforge.run_id": run_id, "embforge.flow": record["flow"], "embforge.store": store.url,
            "embforge.config_path": record["config_path"] or "",
            **artifact_tags(stages)}
    run = client.create_run(experiment_id, run_name=f"{record['flow']} {run_id[:8]}",
                            start_time=epoch_ms(record["started_at"]),
                            tags={"mlflow.note.content": record["error"] or "", **tags})
    mlflow_id = run.info.run_id
    try:
        now_ms = int(time.time() * 1000)
        params = [Param(k, v) for k, v in flatten(json.loads(record["config"])).items()]
        metrics = [Metric(name, value, now_ms, step) for name, value, step in training_metrics(store, catalog, run_id)]
        metrics += [Metric(name, value, now_ms, 0) for name, value in final_metrics(catalog, run_id).items()]
        for first in range(0, len(params), 100):  # MLflow's limits per batch: 100 params, 1000 metrics
            client.log_batch(mlflow_id, params=params[first : first + 100])
        for first in range(0, len(metrics), 1000):
            client.log_batch(mlflow_id, metrics=metrics[first : first + 1000])
        for folder, files in pictures(store, catalog, run_id).items():
            for file in files:
                client.log_artifact(mlflow_id, str(file), folder)
    finally:
        client.set_terminated(mlflow_id, "FINISHED" if record["status"] == "completed" else "FAILED",
                              end_time=epoch_ms(record["finished_at"]) if record["finished_at"] else None)
    return mlflow_id
