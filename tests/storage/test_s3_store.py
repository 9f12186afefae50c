"""The artifact store on S3 (SeaweedFS on loopback): publishing with the manifest created last,
the working copy, damage, pools, runs and scratch."""

import json
import logging

import pyarrow as pa
import pytest

from storage.base import ArtifactRef, DamagedArtifactError
from storage.catalog import Catalog, metrics_table
from storage.stores import store_at


def write(store, ref, rows=3, **extra):
    with store.writing(ref, config={"a": 1}, inputs=[], code_version="v", libraries={}) as out:
        out.write_table("t", pa.table({"x": list(range(rows))}))
        for name, text in extra.items():
            out.write_text(name, text)


def objects(store, *parts):
    """Names of the objects below a folder of the store (SeaweedFS lists emptied folders, S3 does not)."""
    folder = store.fs._strip_protocol(store.location(*parts))
    return sorted(p[len(folder) + 1:] for p in store.fs.find(folder) if len(p) > len(folder))


def fresh(url, tmp_path, monkeypatch, name="other"):
    """The same store opened as another worker would: with an empty working copy."""
    monkeypatch.setenv("EMBFORGE_CACHE", str(tmp_path / name))
    return store_at(url)


def test_publish_and_read_back_through_a_fresh_working_copy(s3_store, tmp_path, monkeypatch):
    store = store_at(s3_store)
    assert store.remote and store.url == s3_store and store.root.is_relative_to(tmp_path / "cache")
    ref = ArtifactRef("stage", "k1")
    write(store, ref, note="hello")
    manifest = store.manifest(ref)
    assert manifest["rows"] == {"t": 3} and manifest["upload"].startswith("upload-")
    assert store.fs.exists(f"{s3_store}/artifacts/stage/k1/{manifest['upload']}/t.parquet")  # data in its upload
    assert store.exists(ref) and store.problems(ref, digests=True) == []
    assert store.artifacts() == [ref] and store.artifacts("other") == []
    assert (store.path(ref) / "note").read_text() == "hello"  # the writer's working copy has it at once

    other = fresh(s3_store, tmp_path, monkeypatch)
    assert other.root != store.root and not other.path(ref).exists()
    assert other.read_table(ref, "t").num_rows == 3  # downloaded by the check every read makes
    assert (other.path(ref) / "note").read_text() == "hello"
    assert other.working.manifest(ref) == manifest
    (other.path(ref) / "note").write_text("a local copy cut sh")  # damage in the working copy: fetched again
    other.check(ref)
    assert (other.path(ref) / "note").read_text() == "hello"
    with pytest.raises(FileNotFoundError, match="not in the store s3://"):
        other.check(ArtifactRef("stage", "missing"))


def test_two_writers_of_one_key_both_end_with_the_winners_files(s3_store, tmp_path, monkeypatch):
    first, second, ref = store_at(s3_store), fresh(s3_store, tmp_path, monkeypatch), ArtifactRef("stage", "same")
    write(first, ref, rows=3)
    write(second, ref, rows=5)  # built while the first published: its manifest create fails
    assert second.read_table(ref, "t").num_rows == first.read_table(ref, "t").num_rows == 3
    assert second.working.manifest(ref) == first.manifest(ref)
    upload = first.manifest(ref)["upload"]
    assert objects(first, "artifacts", "stage", "same") == ["manifest.json", f"{upload}/t.parquet"]  # loser's gone


def test_a_truncated_upload_is_never_read_and_is_rebuilt(s3_store, tmp_path, monkeypatch):
    store, ref = store_at(s3_store), ArtifactRef("stage", "cut")
    store._writable()
    store.fs.pipe_file(f"{s3_store}/artifacts/stage/cut/upload-killed/t.parquet", b"PAR1 half")  # no manifest
    assert not store.exists(ref) and store.artifacts() == []
    with pytest.raises(FileNotFoundError):
        store.read_table(ref, "t")
    assert Catalog(store).query("SELECT count(*) AS n FROM artifacts") == [{"n": 0}]
    write(store, ref, rows=4)
    assert fresh(s3_store, tmp_path, monkeypatch).read_table(ref, "t").num_rows == 4
    assert "upload-killed/t.parquet" not in objects(store, "artifacts", "stage", "cut")  # swept by the publisher


def test_a_damaged_artifact_is_detected_set_aside_and_never_served(s3_store, tmp_path, monkeypatch):
    store, ref = store_at(s3_store), ArtifactRef("stage", "bad")
    write(store, ref, note="hello")
    data = f"{s3_store}/artifacts/stage/bad/{store.manifest(ref)['upload']}"
    store.fs.pipe_file(f"{data}/note", b"hel")
    assert store.problems(ref) == ["note is 3 bytes, expected 5"]
    other = fresh(s3_store, tmp_path, monkeypatch)
    with pytest.raises(DamagedArtifactError, match="stage/bad: note is 3 bytes, expected 5"):
        other.check(ref)
    store.fs.pipe_file(f"{data}/note", b"HELLO")  # same size, other bytes: what `verify` finds
    assert store.problems(ref) == [] and store.problems(ref, digests=True) == [
        "note has other contents than it was published with (SHA-256 differs)"]

    aside = store.set_aside(ref, "note differs")
    assert aside.startswith(f"{s3_store}/damaged/stage/bad-")
    assert store.fs.cat_file(f"{aside}/DAMAGED.txt") == b"note differs\n"
    assert store.fs.exists(f"{aside}/manifest.json") and not store.exists(ref)
    assert objects(store, "artifacts", "stage", "bad") == [] and not store.path(ref).exists()
    assert store.set_aside(ref, "again") is None  # nothing left to set aside
    write(store, ref, note="fresh")
    assert store.problems(ref, digests=True) == []
    store.discard(ref)
    assert not store.exists(ref) and objects(store, "artifacts", "stage", "bad") == []


def test_pools_runs_logs_and_scratch_live_in_the_bucket(s3_store, tmp_path, monkeypatch, caplog):
    store = store_at(s3_store)
    pool = store.pool("summaries", "k")
    good, bad = pool.write(pa.table({"x": [1]})), pool.write(pa.table({"x": [2]}))
    assert good.startswith(f"{s3_store}/pools/summaries/k/shard-")
    store.fs.pipe_file(bad, b"PAR1 cut")
    with caplog.at_level(logging.WARNING):
        assert pool.read()["x"].to_pylist() == [1]
    assert pool.shards() == [good] and store.fs.exists(bad.removesuffix(".parquet") + ".damaged")

    ref = ArtifactRef("evaluate", "e1")
    with store.writing(ref, config={}, inputs=[], code_version="v", libraries={}) as out:
        out.write_table("metrics", metrics_table([dict(model="m", metric="knn_accuracy", value=0.5)], key="e1"))
    store.write_run("r1", dict(run_id="r1", name="x", status="completed", started_at="2026-01-01T00:00:00+00:00",
                               stages=[dict(stage="evaluate", label="crops", key="e1", state="Completed")]))
    store.write_run_table("r1", "changes", pa.table({"label": ["crops"]}))
    log = store.log_file("run")
    log.parent.mkdir(parents=True)
    log.write_text("a log line\n")
    store.upload(log)
    assert store.fs.cat_file(f"{s3_store}/logs/{log.name}") == b"a log line\n"

    scratch = store.scratch(ArtifactRef("train", "t1"))
    (scratch / "checkpoint.pt").write_bytes(b"old")
    store.save_scratch(ArtifactRef("train", "t1"))
    (scratch / "checkpoint.pt").rename(scratch / "checkpoint.previous.pt")  # what Checkpoints.save does
    (scratch / "checkpoint.pt").write_bytes(b"new")
    store.save_scratch(ArtifactRef("train", "t1"))  # the previous one is copied inside the bucket

    other = fresh(s3_store, tmp_path, monkeypatch)  # another worker: everything comes from the bucket
    assert other.pool("summaries", "k").read()["x"].to_pylist() == [1]
    catalog = Catalog(other)
    assert catalog.query("SELECT run_id, label, metric, value FROM run_metrics") == [
        {"run_id": "r1", "label": "crops", "metric": "knn_accuracy", "value": 0.5}]
    assert catalog.query("SELECT run_id, label FROM score_changes") == [{"run_id": "r1", "label": "crops"}]
    assert catalog.query("SELECT stage, key, path FROM artifacts") == [
        {"stage": "evaluate", "key": "e1", "path": "artifacts/evaluate/e1"}]
    resumed = other.scratch(ArtifactRef("train", "t1"))
    assert (resumed / "checkpoint.pt").read_bytes() == b"new" and resumed.is_relative_to(other.root)
    assert (resumed / "checkpoint.previous.pt").read_bytes() == b"old"
    other.drop_scratch(ArtifactRef("train", "t1"))
    assert not resumed.exists() and objects(store, "scratch") == []
    assert json.loads(store.fs.cat_file(f"{s3_store}/runs/r1.json"))["status"] == "completed"


def test_the_catalog_reads_only_its_own_bucket_prefix(s3_store):
    store = store_at(s3_store)
    store.write_run("r1", dict(run_id="r1", name="x", status="completed", started_at="2026-01-01T00:00:00+00:00"))
    store.fs.pipe_file(f"{s3_store}-other/x.json", b'{"a": 1}')  # beside the store, same bucket
    catalog = Catalog(store)
    assert catalog.query(f"SELECT run_id FROM read_json('{s3_store}/runs/r1.json')") == [{"run_id": "r1"}]
    for outside in (f"{s3_store}-other/x.json", "/etc/passwd"):
        with pytest.raises(Exception, match="Cannot access file"):
            catalog.query(f"SELECT * FROM read_json('{outside}')")


def test_a_config_names_an_s3_store_as_it_is(tmp_path):
    from tasks.config.loading import load_config
    from tests.helpers import tiny_config

    assert load_config(tiny_config(tmp_path, store="s3://bucket/runs"), check_files=False).store == "s3://bucket/runs"
