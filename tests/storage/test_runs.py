"""Run records: rewritten after every step, readable by the catalog at any point."""

import json
import os
import socket
import time

from storage import runs
from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.runs import RunRecord
from storage.store import ArtifactStore


def test_a_record_shows_how_far_the_run_got_and_what_was_stale(tmp_path):
    store = ArtifactStore(tmp_path)
    record = RunRecord(store, "run-1", name="x", flow="pipeline", config_path="c.yaml", overrides={"a.b": 1},
                       config={"name": "x"})
    record.add_stage(ArtifactRef("ingest", "k1"), "Completed", label="", method="")
    record.add_stage(ArtifactRef("train", "k2"), "Cached", label="crops", method="crops",
                     version_changes={"torch": ["1.0.0", "2.13.0"]})
    catalog = Catalog(store)
    assert catalog.query("SELECT status FROM runs") == [{"status": "running"}]  # a killed run stays so
    rows = catalog.query("SELECT stage, label, state, version_changes FROM run_stages ORDER BY position")
    assert [(r["stage"], r["label"], r["state"]) for r in rows] == [
        ("ingest", "", "Completed"), ("train", "crops", "Cached")]
    assert rows[0]["version_changes"] is None
    assert json.loads(rows[1]["version_changes"]) == {"torch": ["1.0.0", "2.13.0"]}
    record.register([dict(label="crops", method="crops", artifact="train/k2", external=None, pooling="mean",
                          knn_holdout=False)])
    record.finish("completed")
    assert Catalog(store).query("SELECT label, artifact FROM models") == [{"label": "crops", "artifact": "train/k2"}]
    assert Catalog(store).query("SELECT status, error FROM runs") == [{"status": "completed", "error": None}]


def test_a_live_run_beats_and_a_finished_one_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "HEARTBEAT_S", 0.05)
    store = ArtifactStore(tmp_path)
    record = RunRecord(store, "run-1", name="x", flow="pipeline", config_path="c.yaml", overrides={}, config={})
    first = json.loads((tmp_path / "runs" / "run-1.json").read_text())
    assert (first["host"], first["pid"], first["heartbeat_s"]) == (socket.gethostname(), os.getpid(), 0.05)
    deadline = time.time() + 5
    while json.loads((tmp_path / "runs" / "run-1.json").read_text())["heartbeat_at"] == first["heartbeat_at"]:
        assert time.time() < deadline, "no heartbeat"
        time.sleep(0.05)
    record.finish("completed")
    done = (tmp_path / "runs" / "run-1.json").read_text()
    time.sleep(1.2)  # heartbeats have one-second resolution: a beat after finish would show
    assert (tmp_path / "runs" / "run-1.json").read_text() == done
