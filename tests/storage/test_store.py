import json

import pyarrow as pa
import pytest

from storage.store import ArtifactRef, ArtifactStore, file_digest, stable_hash


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
    assert not any((tmp_path / ".tmp").iterdir())  # the temp folder is gone


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
    assert not any((tmp_path / ".tmp").iterdir())
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
    from storage import store as store_module

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\0" * 1000)
    (folder / "config.json").write_text("{}")
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    store_module._digest.cache_clear()
    first = file_digest(folder)
    assert file_digest(folder) == first and file_digest(str(folder)) == first
    assert len(opened) == 2  # each file read once, for the first call only
    (folder / "config.json").write_text('{"hidden": 8}')
    assert file_digest(folder) != first
