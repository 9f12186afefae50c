"""Stages through Prefect's task runners: independent stages run side by side (threads, worker
processes, a local Dask cluster of 2 processes) and give the sequential run's numbers."""

import os
from unittest import mock

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests.helpers import tiny_config

pytestmark = pytest.mark.slow  # whole pipelines through worker processes and a Dask cluster: minutes

METRICS = "SELECT model, dataset, metric, layer, value FROM metrics ORDER BY ALL"


def same_scores(catalog: Catalog, reference: Catalog) -> bool:
    """The same models (keys), tasks and scores. Scores may differ in the 7th digit: MKL picks how many
    threads a matrix product uses by the machine's load (MKL_DYNAMIC), and so the order of its sums."""
    return catalog.query(METRICS) == [row | {"value": pytest.approx(row["value"], rel=1e-5)}
                                      if row["value"] is not None else row  # a health verdict is a note
                                      for row in reference.query(METRICS)]


def run_tiny(tmp_path, runner: str) -> tuple[str, Catalog]:
    from flows.params import RunParams
    from flows.pipeline import pipeline

    # Training long enough for the two methods' to be seen side by side, past the scheduler's delays:
    # at 10 epochs each took ~20 s in worker processes and Dask, and they overlapped by 15-17 s; at 5,
    # in the full suite, Dask started the second 3 s after the first ended.
    config = tiny_config(tmp_path, run={"task_runner": runner, "max_workers": 2}, train={"epochs": 15})
    state = pipeline(RunParams(config=str(config)), return_state=True)
    assert state.is_completed(), state.message
    return str(state.state_details.flow_run_id), Catalog(ArtifactStore(tmp_path / "store"))


@pytest.fixture(autouse=True)
def environment_kept():
    """Dask's nanny leaves its pre-spawn variables (the threads, PYTHONHASHSEED) in this process's environment,
    where every process a later test starts would inherit them."""
    with mock.patch.dict(os.environ):
        yield


@pytest.fixture(scope="module")
def sequential(prefect_harness, tmp_path_factory):
    return run_tiny(tmp_path_factory.mktemp("sequential"), "sequential")


def task_runs(flow_run_id: str, name: str) -> list:
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r for r in runs if r.name.startswith(name)]


@pytest.mark.parametrize("runner", ["threads", "processes", "dask"])
def test_a_task_runner_gives_the_sequential_numbers_with_stages_side_by_side(sequential, tmp_path, runner):
    run_id, catalog = run_tiny(tmp_path, runner)
    first_id, first = sequential
    assert same_scores(catalog, first)
    # Stages finish out of order; the record still holds each of them once, all built.
    in_order = "SELECT stage, label, key, state FROM run_stages WHERE run_id = ? ORDER BY ALL"
    assert catalog.query(in_order, [run_id]) == first.query(in_order, [first_id])
    assert {s["state"] for s in catalog.query(in_order, [run_id])} == {"Completed"}
    assert catalog.query("SELECT status FROM runs WHERE run_id = ?", [run_id]) == [{"status": "completed"}]

    train = task_runs(run_id, "train")
    assert len(train) == 2 and all(t.tags == [] for t in train)  # no limit on `gpu`: untagged (the next test sets one)
    if runner != "threads":  # in threads, training holds the process-wide RNG: one at a time (tasks/core/rng.py)
        (a, b) = sorted(train, key=lambda t: t.start_time)
        assert b.start_time < a.end_time, "the two methods' training did not overlap"


def test_a_concurrency_limit_on_the_gpu_tag_runs_model_stages_one_at_a_time(sequential, tmp_path):
    """What `prefect concurrency-limit create gpu 1` does on a one-GPU machine."""
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag="gpu", concurrency_limit=1)
    try:
        run_id, catalog = run_tiny(tmp_path, "processes")
    finally:
        with get_client(sync_client=True) as client:
            client.delete_concurrency_limit_by_tag("gpu")
    assert same_scores(catalog, sequential[1])
    gpu = sorted(task_runs(run_id, ""), key=lambda t: t.start_time)
    gpu = [t for t in gpu if t.tags == ["gpu"]]
    assert len(gpu) == 8  # 2 trainings, 6 embeddings (3 models × documents and STS pairs)
    assert all(b.start_time >= a.end_time for a, b in zip(gpu, gpu[1:])), "two gpu stages ran at once"
