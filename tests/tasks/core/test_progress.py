"""Stage progress in the Prefect UI: progress artifacts under the real Prefect engine, nothing outside it."""

import logging

import pytest
from prefect import flow, get_client, task
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType
from prefect.runtime import flow_run

from storage.store import ArtifactStore
from tasks.config.data import DataConfig
from tasks.core.progress import StageProgress, current_stage, silenced
from tasks.core.stage import NoInputs
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.ingest import INGEST
from tests.helpers import DEMO_DOCS


def progress_artifacts(flow_run_id) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), type=ArtifactFilterType(any_=["progress"])))


def test_outside_prefect_it_only_counts():
    with StageProgress(4, "items") as progress:
        progress.advance(3)
        progress.update(4)
    assert progress.percent == 100.0 and progress.description == "progress: 4 of 4 items"
    assert StageProgress(0, "items").percent == 100.0


def test_it_is_named_after_the_stage_being_built():
    building = current_stage.set(("train[crops]", "3f9a1c2e77"))
    try:
        assert StageProgress(8, "steps").description == "train[crops]: 0 of 8 steps · 3f9a1c2e"
    finally:
        current_stage.reset(building)


@pytest.mark.usefixtures("prefect_harness")
def test_updates_land_on_the_task_runs_artifact_and_end_at_100():
    seen = {}

    @task
    def count():
        with StageProgress(5, "items") as progress:
            progress.min_interval_s = 0  # every update is sent, so the one mid-way can be read back
            progress.update(2)
            seen["mid"] = [(a.description, a.data) for a in progress_artifacts(flow_run.id)]
            progress.min_interval_s = 3600  # throttled: the rest arrives with close()
            progress.advance(3)

    @flow
    def counting():
        count()

    state = counting(return_state=True)
    assert state.is_completed()
    assert seen["mid"] == [("progress: 2 of 5 items", 40.0)]
    [artifact] = progress_artifacts(state.state_details.flow_run_id)
    assert (artifact.description, artifact.data) == ("progress: 5 of 5 items", 100.0)
    assert artifact.task_run_id is not None


@pytest.mark.usefixtures("prefect_harness")
def test_silenced_progress_sends_nothing_so_timed_work_times_no_api_call():
    @task
    def count():
        with silenced(), StageProgress(5, "items") as quiet:
            quiet.min_interval_s = 0
            quiet.advance(5)
        with StageProgress(2, "items") as shown:  # after the block: shown again
            shown.advance(2)
        return quiet.shown, shown.shown

    @flow
    def counting():
        return count()

    state = counting(return_state=True)
    assert state.result() == (False, True)
    [artifact] = progress_artifacts(state.state_details.flow_run_id)
    assert artifact.description == "progress: 2 of 2 items"


@pytest.mark.usefixtures("prefect_harness")
def test_a_failing_prefect_api_logs_once_and_the_work_goes_on(caplog):
    @task
    def count() -> int:
        progress = StageProgress(3, "items")
        progress.min_interval_s = 0
        [artifact] = progress_artifacts(flow_run.id)
        with get_client(sync_client=True) as client:  # the artifact disappears: every update is a 404
            client.delete_artifact(artifact.id)
        for _ in range(3):
            progress.advance()
        progress.close()
        return progress.done

    @flow
    def counting() -> int:
        return count()

    with caplog.at_level(logging.WARNING, logger="embforge.progress"):
        assert counting() == 3
    assert len([r for r in caplog.records if r.name == "embforge.progress"]) == 1
    assert "progress: Prefect progress updates stopped" in caplog.text


@pytest.mark.usefixtures("prefect_harness")
def test_embed_stage_reports_its_texts_under_the_models_label(tmp_path, tiny_dir):
    store = ArtifactStore(tmp_path / "store")
    docs = INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=10), NoInputs())
    job = EmbedJob(model=tiny_dir, max_length=32, batch_size=4)

    @flow
    def embedding():
        inputs = EmbedInputs(documents=docs)
        return EMBED.as_task()(str(store.root), job, inputs, EMBED.ref(job, inputs), "tiny")

    state = embedding(return_state=True)
    ref = state.result()
    [artifact] = progress_artifacts(state.state_details.flow_run_id)
    assert (artifact.description, artifact.data) == (f"embed[tiny]: 10 of 10 texts · {ref.key[:8]}", 100.0)
