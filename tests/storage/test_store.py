import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from storage.base import HOST, ArtifactRef, DamagedArtifactError, file_digest, stable_hash
from storage.store import ArtifactStore


def write(store, ref, rows=3):
    with store.writing(ref, config={"a": 1}, inputs=[], code_version="v", libraries={}) as out:
        out.write_table("t", pa.table({"x": list(range(rows))}))


def test_finished_artifact_has_manifest_written_last(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = ArtifactRef("stage", "k1")
    write(store, ref)
    assert store.exists(ref)
    manifest = store.manifest(ref)
    assert manifest["rows"] == {"t": 3} and manifest["config"] == {"a": 1}
    assert store.read_table(ref, "t").num_rows == 3
    with store.open_table(ref, "t") as table:  # what a streaming reader gets
        assert table.metadata.num_rows == 3
    assert not (tmp_path / ".tmp").exists()  # the temp folder is gone


def test_failure_while_writing_leaves_no_artifact_and_keeps_earlier_ones(tmp_path):
    store = ArtifactStore(tmp_path)
    done = ArtifactRef("stage", "done")
    write(store, done)
    before = (store.path(done) / "t.parquet").read_bytes()
    broken = ArtifactRef("stage", "broken")
    with pytest.raises(RuntimeError):
        with store.writing(broken, config={}, inputs=[], code_version="v", libraries={}) as out:
            out.write_table("t", pa.table({"x": [1]}))
            raise RuntimeError("killed mid-way")
    assert not store.exists(broken) and not store.path(broken).exists()
    assert not (tmp_path / ".tmp").exists()
    assert (store.path(done) / "t.parquet").read_bytes() == before


def test_folder_without_manifest_is_not_a_result(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = ArtifactRef("stage", "half")
    store.path(ref).mkdir(parents=True)
    (store.path(ref) / "t.parquet").write_bytes(b"partial")
    assert not store.exists(ref)
    with pytest.raises(FileNotFoundError):
        store.read_table(ref, "t")


def test_second_writer_of_same_key_keeps_the_first(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = ArtifactRef("stage", "same")
    write(store, ref, rows=3)
    write(store, ref, rows=5)  # e.g. two runs racing on the same key
    assert store.read_table(ref, "t").num_rows == 3


def test_hashes_are_stable_and_content_based(tmp_path):
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})
    f = tmp_path / "data.csv"
    f.write_text("x\n1\n")
    first = file_digest(f)
    f.write_text("x\n2\n")
    assert file_digest(f) != first


def test_run_records_are_replaced_atomically(tmp_path):
    store = ArtifactStore(tmp_path)
    store.write_run("r1", {"status": "running"})
    store.write_run("r1", {"status": "completed"})
    files = list((tmp_path / "runs").iterdir())
    assert [f.name for f in files] == ["r1.json"]
    assert json.loads(files[0].read_text())["status"] == "completed"


def test_a_folder_is_hashed_once_until_a_file_changes(tmp_path, monkeypatch):
    from storage import base

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\0" * 1000)
    (folder / "config.json").write_text("{}")
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    base._digest.cache_clear()
    first = file_digest(folder)
    assert file_digest(folder) == first and file_digest(str(folder)) == first
    assert len(opened) == 2  # each file read once, for the first call only
    (folder / "config.json").write_text('{"hidden": 8}')
    assert file_digest(folder) != first


def test_the_manifest_records_every_file_size_and_digest_and_reads_check_sizes(tmp_path):
    store, ref = ArtifactStore(tmp_path), ArtifactRef("train", "k")
    with store.writing(ref, config={}, inputs=[], code_version="v", libraries={}) as out:
        (out.folder / "model").mkdir()
        (out.folder / "model" / "weights.bin").write_bytes(b"\1" * 100)
        out.write_table("t", pa.table({"x": [1, 2]}))
    files = store.manifest(ref)["files"]
    assert sorted(files) == ["model/weights.bin", "t.parquet"]
    assert files["model/weights.bin"] == {"size": 100, "sha256": hashlib.sha256(b"\1" * 100).hexdigest()}
    assert store.problems(ref, digests=True) == []

    (store.path(ref) / "model" / "weights.bin").write_bytes(b"\2" * 100)  # same size, other bytes
    assert store.problems(ref) == []
    assert store.problems(ref, digests=True) == [
        "model/weights.bin has other contents than it was published with (SHA-256 differs)"]
    (store.path(ref) / "model" / "weights.bin").write_bytes(b"\1" * 10)
    (store.path(ref) / "t.parquet").unlink()
    assert store.problems(ref) == ["model/weights.bin is 10 bytes, expected 100", "t.parquet is missing"]
    for read in (store.read_table, store.open_table):
        with pytest.raises(DamagedArtifactError, match="train/k: model/weights.bin is 10 bytes, expected 100"):
            read(ref, "t")


def test_publishing_is_durable_data_and_manifest_are_on_disk_before_the_rename(tmp_path, monkeypatch):
    from storage import store as store_module

    events = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(store_module.os, "fsync",
                        lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(store_module.os, "rename", lambda a, b: events.append(("rename", str(b))) or real_rename(a, b))
    store, ref = ArtifactStore(tmp_path), ArtifactRef("stage", "k")
    write(store, ref)
    [rename] = [i for i, e in enumerate(events) if e[0] == "rename"]
    before = {Path(path).name for kind, path in events[:rename]}
    assert {"t.parquet", "manifest.json"} <= before and any(n.startswith("stage-k.") for n in before)  # the folder
    assert events[rename + 1:] == [("fsync", str(tmp_path / "artifacts" / "stage"))]  # the new entry


@pytest.mark.parametrize("host", [HOST, "node-7.cluster.example.org"])
def test_leftover_temp_folders_of_dead_processes_are_removed(tmp_path, monkeypatch, host):
    from storage import store as store_module

    monkeypatch.setattr(store_module, "HOST", host)
    store = ArtifactStore(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftovers = {name: tmp_path / ".tmp" / name for name in (
        f"train-k.{host}.{dead.pid}.0a0b0c0d",  # a killed run's: removed
        f"train-k.{host}.{os.getpid()}.0a0b0c0d",  # ours, still writing: kept
        f"train-k.other-host.{dead.pid}.0a0b0c0d",  # another machine's: cannot tell, kept
        f"train-k.example.org.{dead.pid}.0a0b0c0d",  # another machine whose name ends like ours: kept
    )}
    for path in leftovers.values():
        path.mkdir(parents=True)
        (path / "weights.bin").write_bytes(b"\0" * 1000)
    assert store.clear_leftovers() == (1, 1000)
    assert sorted(p.name for p in (tmp_path / ".tmp").iterdir()) == sorted(list(leftovers)[1:])
    assert store.clear_leftovers() == (0, 0)


def test_a_damaged_pool_shard_is_set_aside_and_the_rest_is_read(tmp_path, caplog):
    pool = ArtifactStore(tmp_path).pool("summaries", "k")
    good, bad = pool.write(pa.table({"x": [1]})), pool.write(pa.table({"x": [2]}))
    bad.write_bytes(bad.read_bytes()[:20])
    with caplog.at_level(logging.WARNING):
        assert pool.read()["x"].to_pylist() == [1]
    assert f"{bad} cannot be read" in caplog.text and pool.shards() == [good]
    assert bad.with_suffix(".damaged").exists()


def test_a_store_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "store").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        ArtifactStore(tmp_path / "store")
