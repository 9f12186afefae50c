import logging
import os
import socket
import subprocess
from datetime import UTC, datetime, timedelta

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from storage.base import ArtifactRef
from storage.catalog import Catalog, QueryError, metrics_table
from storage.store import ArtifactStore


def write_record(store: ArtifactStore, run_id: str, **fields) -> None:
    store.write_run(run_id, dict(run_id=run_id, name="x", status="running", started_at="2026-01-01T00:00:00+00:00",
                                 stages=[]) | fields)


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat(timespec="seconds")


def test_views_exist_on_an_empty_store(tmp_path):
    catalog = Catalog(ArtifactStore(tmp_path))
    for view in ("artifacts", "runs", "run_stages", "metrics", "run_metrics", "summaries", "sts_pairs"):
        assert catalog.query(f"SELECT count(*) AS n FROM {view}") == [{"n": 0}]
    # Every metrics column exists before the first score, so reports can be queried on any store.
    assert catalog.query("SELECT count(*) AS n FROM metrics WHERE task_type = 'sts' AND layer = 0") == [{"n": 0}]
    assert catalog.query("SELECT count(*) AS n FROM summaries WHERE status = 'ok' AND prompt_id = 1") == [{"n": 0}]
    assert catalog.query("SELECT count(*) AS n FROM sts_pairs WHERE key = 'k' AND pair = 0 AND cosine > score") == [
        {"n": 0}]


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


@pytest.mark.parametrize("sql, refusal", [
    ("", "the query is empty"),
    ("SELECT 1; SELECT 2", "one query at a time"),
    ("COPY (SELECT 1) TO 'x.csv'", "not COPY"),
    ("ATTACH 'x.duckdb' AS x", "not ATTACH"),
    ("CREATE TABLE x AS SELECT 1", "not CREATE"),
    ("INSERT INTO runs (run_id) VALUES ('x')", "not INSERT"),
    ("SET lock_configuration = false", "not SET"),
    ("INSTALL httpfs", "not LOAD"),
    ("EXPORT DATABASE 'x'", "not EXPORT"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'", "not EXPLAIN"),  # ANALYZE runs the COPY
])
def test_only_one_select_runs(tmp_path, monkeypatch, sql, refusal):
    monkeypatch.chdir(tmp_path)
    catalog = Catalog(ArtifactStore(tmp_path / "store"))
    with pytest.raises(QueryError, match=refusal):
        catalog.query(sql)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even in the store


def test_the_catalog_reads_only_the_store_and_cannot_be_unlocked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ArtifactStore(tmp_path / "store")
    write_record(store, "run-1", status="completed")
    (tmp_path / "outside.csv").write_text("a\n1\n")
    (tmp_path / "store2").mkdir()
    (tmp_path / "store2" / "x.csv").write_text("a\n1\n")
    catalog = Catalog(store)
    for path in ("/etc/passwd", tmp_path / "outside.csv", store.root / ".." / "outside.csv", tmp_path / "store2/x.csv"):
        with pytest.raises(duckdb.PermissionException, match="Cannot access file"):
            catalog.query(f"SELECT * FROM read_csv('{path}')")
    # Below the query check, the connection itself refuses, and its configuration is locked.
    with pytest.raises(duckdb.PermissionException):
        catalog.con.execute("COPY (SELECT 1) TO 'x.csv'")
    with pytest.raises(duckdb.InvalidInputException, match="locked"):
        catalog.con.execute("SET enable_external_access = true")
    assert not (tmp_path / "x.csv").exists()
    # The views and the store's own files still read, and DESCRIBE and SHOW are SELECTs.
    assert catalog.query("SELECT run_id, status FROM runs") == [{"run_id": "run-1", "status": "completed"}]
    assert catalog.query(f"SELECT run_id FROM read_json('{store.root}/runs/run-1.json')") == [{"run_id": "run-1"}]
    assert {"column_name": "heartbeat_at"} in catalog.query("SELECT column_name FROM (DESCRIBE runs)")
    assert {"name": "runs"} in catalog.query("SHOW TABLES")


def test_damaged_files_are_skipped_with_a_warning(tmp_path, caplog):
    store = ArtifactStore(tmp_path)
    write_record(store, "good", status="completed")
    write_record(store, "cut", status="completed")
    cut = store.root / "runs" / "cut.json"
    cut.write_text(cut.read_text()[:30])
    (store.root / "runs" / "list.json").write_text("[1, 2]")
    for ref in (ArtifactRef("evaluate", "e1"), ArtifactRef("evaluate", "e2")):
        with store.writing(ref, config={}, inputs=[], code_version="v", libraries={}) as out:
            out.write_table("metrics", metrics_table([dict(model="m", metric="knn_accuracy", value=0.5)], key=ref.key))
    metrics = store.path(ArtifactRef("evaluate", "e2")) / "metrics.parquet"
    metrics.write_bytes(metrics.read_bytes()[:-20])
    manifest = store.path(ArtifactRef("evaluate", "e1")) / "manifest.json"
    manifest.write_text(manifest.read_text()[:-5])
    store.write_run_table("good", "changes", pa.table({"label": ["crops"]}))
    changes = store.root / "runs" / "cut.changes.parquet"
    changes.write_bytes(b"PAR1 cut short")
    with caplog.at_level(logging.WARNING, logger="embforge.catalog"):
        catalog = Catalog(store)
    assert sorted(r.getMessage().split(": ")[0] for r in caplog.records) == sorted(
        f"skipped the damaged file {path}" for path in (cut, store.root / "runs" / "list.json", metrics, manifest,
                                                        changes))
    assert catalog.query("SELECT run_id FROM runs") == [{"run_id": "good"}]
    assert catalog.query("SELECT key FROM metrics") == [{"key": "e1"}]
    assert catalog.query("SELECT key FROM artifacts") == [{"key": "e2"}]
    assert catalog.query("SELECT run_id, label FROM score_changes") == [{"run_id": "good", "label": "crops"}]


def test_a_running_record_whose_process_is_gone_shows_crashed(tmp_path):
    store = ArtifactStore(tmp_path)
    ended = subprocess.Popen(["true"])
    ended.wait()
    here = socket.gethostname()
    write_record(store, "ended", host=here, pid=ended.pid, heartbeat_at=ago(0), heartbeat_s=30)
    write_record(store, "silent", host="elsewhere", pid=os.getpid(), heartbeat_at=ago(100), heartbeat_s=30)
    write_record(store, "alive", host=here, pid=os.getpid(), heartbeat_at=ago(60), heartbeat_s=30)
    write_record(store, "beating", host="elsewhere", pid=ended.pid, heartbeat_at=ago(60), heartbeat_s=30)
    write_record(store, "old")  # written before records had a pid and heartbeat
    write_record(store, "finished", status="completed", host=here, pid=ended.pid, heartbeat_at=ago(999),
                 heartbeat_s=30)
    rows = Catalog(store).query("SELECT run_id, status, host, pid FROM runs ORDER BY run_id")
    assert {r["run_id"]: r["status"] for r in rows} == {
        "alive": "running", "beating": "running", "ended": "crashed", "finished": "completed", "old": "running",
        "silent": "crashed"}
    assert rows[0] == {"run_id": "alive", "status": "running", "host": here, "pid": os.getpid()}
