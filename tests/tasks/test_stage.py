"""Stage retries through the real Prefect engine: transient failures are retried, bad input is not."""

import pyarrow as pa
from prefect import flow

from storage.store import ArtifactStore
from tasks.config import InputError, RetryConfig, Section
from tasks.stage import NoInputs, Stage


class Job(Section):
    fail_with: str
    failures: int


def flaky_stage(attempts: list) -> Stage:
    def build(store, job, inputs, out, ref, log):
        attempts.append(job.fail_with)
        if len(attempts) <= job.failures:
            raise {"memory": MemoryError, "input": InputError}[job.fail_with]("attempt failed")
        out.write_table("rows", pa.table({"x": [1]}))

    return Stage("flaky", build)


def run_stage(store: ArtifactStore, stage: Stage, job: Job, retry: RetryConfig) -> tuple[str, object]:
    """The task's final state name and its result (the artifact, or the exception)."""
    @flow
    def one_stage():
        state = stage.as_task(store, retry)(str(store.root), job, NoInputs(), stage.ref(job, NoInputs()),
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


def test_back_off_doubles():
    assert RetryConfig(attempts=3, delay_s=10).delays == [10, 20, 40]
