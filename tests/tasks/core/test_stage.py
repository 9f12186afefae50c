"""Stages through the real Prefect engine: transient failures are retried, bad input is not; the store
alone decides what is cached, and an artifact that fails its check is rebuilt, never served."""

import errno
import logging
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from prefect import flow, get_client
from prefect.runtime import flow_run
from prefect.states import Cancelling

from storage.base import ArtifactRef, DamagedArtifactError, StoreUnusable
from storage.store import ArtifactStore
from tasks.config.base import InputError, Section
from tasks.config.run import RetryConfig
from tasks.core.stage import Inputs, NoInputs, Stage
from tests import processes
from tests.helpers import DEMO_DOCS, REPO


class Job(Section):
    fail_with: str
    failures: int


def flaky_stage(attempts: list) -> Stage:
    def build(store, job, inputs, out, ref, log):
        attempts.append(job.fail_with)
        if len(attempts) <= job.failures:
            raise {"memory": MemoryError("attempt failed"), "input": InputError("attempt failed"),
                   "disk-full": OSError(errno.ENOSPC, "No space left on device", "rows.parquet")}[job.fail_with]
        out.write_table("rows", pa.table({"x": [1]}))

    return Stage("flaky", build)


def run_stage(store: ArtifactStore, stage: Stage, job: Job, retry: RetryConfig) -> tuple[str, object]:
    """The task's final state name and its result (the artifact, or the exception)."""
    @flow
    def one_stage():
        state = stage.as_task(retry)(str(store.root), job, NoInputs(), stage.ref(job, NoInputs()),
                                     return_state=True)
        return state.name, state.result(raise_on_failure=False)

    return one_stage()


def test_a_transient_failure_is_retried_and_the_stage_completes(prefect_harness, tmp_path):
    store, attempts = ArtifactStore(tmp_path), []
    state, ref = run_stage(store, flaky_stage(attempts), Job(fail_with="memory", failures=2),
                           RetryConfig(attempts=2, delay_s=0))
    assert state == "Completed" and len(attempts) == 3
    assert store.exists(ref)


def test_retries_run_out(prefect_harness, tmp_path):
    attempts = []
    state, error = run_stage(ArtifactStore(tmp_path), flaky_stage(attempts), Job(fail_with="memory", failures=5),
                             RetryConfig(attempts=1, delay_s=0))
    assert state == "Failed" and isinstance(error, MemoryError) and len(attempts) == 2


def test_bad_input_is_not_retried(prefect_harness, tmp_path):
    store, attempts = ArtifactStore(tmp_path), []
    state, error = run_stage(store, flaky_stage(attempts), Job(fail_with="input", failures=1),
                             RetryConfig(attempts=3, delay_s=0))
    assert state == "Failed" and isinstance(error, InputError) and attempts == ["input"]
    assert not any((tmp_path / "artifacts").glob("*/*/manifest.json"))


def test_a_full_disk_is_not_retried(prefect_harness, tmp_path):
    store, attempts = ArtifactStore(tmp_path), []
    state, error = run_stage(store, flaky_stage(attempts), Job(fail_with="disk-full", failures=1),
                             RetryConfig(attempts=3, delay_s=0))
    assert state == "Failed" and isinstance(error, StoreUnusable) and attempts == ["disk-full"]
    assert str(error) == (f"store {tmp_path}: flaky could not be written: No space left on device: rows.parquet; "
                          "free space on that disk or choose another store (--store); every finished stage is kept "
                          "and the same command resumes from them")
    assert not any(tmp_path.glob("artifacts/*/*/manifest.json")) and not list((tmp_path / ".tmp").glob("*"))


def test_a_failure_while_the_run_is_being_cancelled_is_not_retried(prefect_harness, tmp_path):
    """A cancel from the UI can surface inside a task as an ordinary error (torch's RuntimeError when Prefect's
    exception interrupts a checkpoint write): the task must not start again."""
    attempts = []

    def build(store, job, inputs, out, ref, log):
        attempts.append(1)
        with get_client(sync_client=True) as client:  # what the UI's cancel does first
            client.set_flow_run_state(flow_run.get_id(), Cancelling(), force=True)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 11839296 vs 11839188")

    stage = Stage("cancelled", build)

    @flow
    def one_stage():
        job = Job(fail_with="cancel", failures=1)
        return stage.as_task(RetryConfig(attempts=3, delay_s=0))(str(tmp_path), job, NoInputs(), stage.ref(
            job, NoInputs()), return_state=True).name

    one_stage(return_state=True)
    assert attempts == [1]


def test_back_off_doubles():
    assert RetryConfig(attempts=3, delay_s=10).delays == [10, 20, 40]


def test_the_store_alone_decides_what_is_cached(prefect_harness, tmp_path):
    store, attempts = ArtifactStore(tmp_path), []
    stage, job = flaky_stage(attempts), Job(fail_with="memory", failures=0)
    assert run_stage(store, stage, job, RetryConfig())[0] == "Completed"
    state, ref = run_stage(store, stage, job, RetryConfig())
    assert state == "Cached" and ref == stage.ref(job, NoInputs()) and len(attempts) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts"]  # no Prefect cache or result files
    store.discard(ref)  # deleted by hand: built again
    assert run_stage(store, stage, job, RetryConfig())[0] == "Completed" and len(attempts) == 2


def truncate(path, size=None):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if size is None else size])


def test_a_damaged_artifact_is_set_aside_reported_and_rebuilt(prefect_harness, tmp_path, caplog):
    store, attempts = ArtifactStore(tmp_path), []
    stage, job = flaky_stage(attempts), Job(fail_with="memory", failures=0)
    ref = run_stage(store, stage, job, RetryConfig())[1]
    table = store.path(ref) / "rows.parquet"
    size = table.stat().st_size
    truncate(table, 10)
    with caplog.at_level(logging.WARNING):
        state, rebuilt = run_stage(store, stage, job, RetryConfig())
    assert state == "Completed" and rebuilt == ref and len(attempts) == 2
    assert store.problems(ref) == [] and store.read_table(ref, "rows")["x"].to_pylist() == [1]
    assert f"flaky/{ref.key}: rows.parquet is 10 bytes, expected {size:,} — rebuilding" in caplog.text
    [aside] = (tmp_path / "damaged" / "flaky").iterdir()
    assert (aside / "rows.parquet").stat().st_size == 10
    assert "rows.parquet is 10 bytes" in (aside / "DAMAGED.txt").read_text()


@pytest.mark.parametrize("planted", ["a file", "its folder", "an extra name"])
def test_a_link_out_of_the_store_planted_in_an_artifact_is_set_aside_and_rebuilt(prefect_harness, tmp_path, caplog,
                                                                                 planted):
    store, attempts = ArtifactStore(tmp_path / "store"), []
    stage, job = flaky_stage(attempts), Job(fail_with="memory", failures=0)
    ref = run_stage(store, stage, job, RetryConfig())[1]
    folder, outside = store.path(ref), tmp_path / "outside"
    if planted == "its folder":  # the whole artifact moved out, a link left in its place: the same bytes
        folder.rename(outside)
        folder.symlink_to(outside)
        said = f"its folder is a link to {outside}, outside the store"
    else:
        outside.mkdir()
        name = "rows.parquet" if planted == "a file" else "notes.txt"
        (outside / name).write_bytes((folder / "rows.parquet").read_bytes())
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(outside / name)
        said = f"{name} is a link to {outside / name}, outside the store"
    assert store.artifacts() == [ref] and store.problems(ref) == [said]  # listed through a linked folder too
    with caplog.at_level(logging.WARNING):
        state, rebuilt = run_stage(store, stage, job, RetryConfig())
    assert state == "Completed" and rebuilt == ref and len(attempts) == 2
    assert f"flaky/{ref.key}: {said} — rebuilding" in caplog.text
    assert store.problems(ref) == [] and not store.path(ref).is_symlink()
    assert store.read_table(ref, "rows")["x"].to_pylist() == [1] and any(outside.iterdir())  # what it pointed at stays


def test_a_folder_without_manifest_is_cleared_before_publishing(prefect_harness, tmp_path):
    store, attempts = ArtifactStore(tmp_path), []
    stage, job = flaky_stage(attempts), Job(fail_with="memory", failures=0)
    ref = run_stage(store, stage, job, RetryConfig())[1]
    (store.path(ref) / "manifest.json").unlink()
    state, again = run_stage(store, stage, job, RetryConfig())
    assert state == "Completed" and again == ref and store.problems(ref) == [] and len(attempts) == 2


class ReadsRows(Inputs):
    rows: ArtifactRef


def test_a_damaged_input_is_an_error_that_is_not_retried(prefect_harness, tmp_path, monkeypatch):
    store, attempts = ArtifactStore(tmp_path), []
    source = run_stage(store, flaky_stage(attempts), Job(fail_with="memory", failures=0), RetryConfig())[1]
    truncate(store.path(source) / "rows.parquet")
    reads = []
    reader = Stage("reader", lambda store, job, inputs, out, ref, log: reads.append(inputs.rows))
    inputs, job = ReadsRows(rows=source), Job(fail_with="memory", failures=0)

    checks, check = [], ArtifactStore.check
    monkeypatch.setattr(ArtifactStore, "check", lambda self, ref: checks.append(ref) or check(self, ref))

    @flow
    def read_it():
        state = reader.as_task(RetryConfig(attempts=3, delay_s=0))(str(store.root), job, inputs,
                                                                   reader.ref(job, inputs), return_state=True)
        return state.name, state.result(raise_on_failure=False)

    state, error = read_it()
    assert state == "Failed" and isinstance(error, DamagedArtifactError)
    assert reads == [] and checks == [source]  # checked before the build starts, once: not retried
    assert f"flaky/{source.key}: rows.parquet is" in str(error)


class Reads(Inputs):
    source: ArtifactRef


def test_what_was_built_from_other_bytes_of_an_input_is_rebuilt(tmp_path):
    """Each manifest records the bytes of its inputs: a reader is served only while they are unchanged."""
    store, values = ArtifactStore(tmp_path), [1]

    def write(store, job, inputs, out, ref, log):
        out.write_table("rows", pa.table({"x": values}))

    def copy(store, job, inputs, out, ref, log):
        out.write_table("rows", store.read_table(inputs.source, "rows"))

    source, reader = Stage("source", write), Stage("reader", copy)
    job = Job(fail_with="memory", failures=0)
    built = reader.run(store, job, Reads(source=source.run(store, job, NoInputs())))
    store.discard(source.ref(job, NoInputs()))  # rebuilt with the same bytes: the reader is still right
    source.run(store, job, NoInputs())
    assert reader.cached(store, built, logging.getLogger())
    values[0] = 2  # rebuilt with other bytes (e.g. after damage, by a non-deterministic build)
    store.discard(source.ref(job, NoInputs()))
    source.run(store, job, NoInputs())
    assert not reader.cached(store, built, logging.getLogger()) and not store.exists(built)
    reader.run(store, job, Reads(source=source.ref(job, NoInputs())))
    assert store.read_table(built, "rows")["x"].to_pylist() == [2]


# Runs ingest without Prefect (Stage.run) from argv[2], a time both processes are past their imports.
INGEST_RUN = """
import logging, sys, time
from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.ingest import INGEST
from tasks.core.stage import NoInputs
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
time.sleep(max(0, float(sys.argv[2]) - time.time()))
INGEST.run(ArtifactStore(sys.argv[1]), DataConfig(path=sys.argv[3]), NoInputs())
"""


def test_two_processes_running_one_stage_at_once_build_it_once(tmp_path):
    start = str(time.time() + 4)
    procs = [processes.Popen([sys.executable, "-c", INGEST_RUN, str(tmp_path), start, str(DEMO_DOCS)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    out = "".join(p.communicate(timeout=120)[0] for p in procs)
    assert [p.returncode for p in procs] == [0, 0], out
    assert out.count("wrote artifacts/ingest/") == 1, out  # the other waited, or found it published
