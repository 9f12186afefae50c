"""A flow run: its config, store and record, how it runs a stage as a cached Prefect task, and how it
starts and finishes (the record completed, failed, interrupted or cancelled; MLflow told). The flows that
compose stages are in flows/pipeline.py and flows/evaluate_registered.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run

from flows.params import RunParams
from flows.runners import outcome, task_runner
from storage.base import ArtifactRef
from storage.runs import RunRecord
from storage.store import ArtifactStore
from storage.stores import open_store
from tasks.config.loading import load_config
from tasks.config.pipeline import PipelineConfig
from tasks.core.stage import GPU_TAG, Inputs, Stage
from tasks.core.stopping import lost, stop_signal

T = TypeVar("T")


@dataclass(frozen=True)
class ReportedModel:
    label: str  # the name shown in the report
    method: str  # the recipe it was trained with, "none" for the base, "reference" for yardsticks
    artifact: ArtifactRef | None  # the train or init artifact holding it, if any
    external: str | None = None  # else: its Hub name, folder or package:<name>
    pooling: str = "mean"  # the recipe's sentence vector; untrained models are read with mean pooling
    knn_holdout: bool = False  # trained without kNN's test documents
    swept: dict = field(default_factory=dict)  # {field: value} of a method made by a sweep
    # The model whose tokenizer it has, when not its own: its run's `model.name_or_path` (a random init and every
    # trained model keep that tokenizer), so the models of a run, any reference model with the same tokenizer, and
    # every later evaluation of them, embed a text set from the same stored token ids (tasks/text_tokens.py).
    tokenizer: str | None = None
    teacher: str | None = None  # a static model's: the label of the model it was distilled from
    family: str = "dense"  # tasks/config/families.py: a multi-vector model's retrieval is scored by MaxSim

    def registration(self) -> dict:
        """The model's entry in the run record: the catalog's `models` view reads these."""
        return dict(label=self.label, method=self.method, artifact=self.artifact.address if self.artifact else None,
                    external=self.external, pooling=self.pooling, knn_holdout=self.knn_holdout,
                    tokenizer=self.tokenizer, teacher=self.teacher, family=self.family)

    @classmethod
    def registered(cls, label: str, row: dict) -> ReportedModel:
        """A model as a catalog `models` row registered it (`registration`), under `label`."""
        artifact = ArtifactRef.parse(row["artifact"]) if row["artifact"] else None
        return cls(label, row["method"], artifact, row["external"], row["pooling"], knn_holdout=row["knn_holdout"],
                   tokenizer=row["tokenizer"], teacher=row["teacher"], family=row["family"])


@dataclass
class Submitted:
    """A stage handed to the task runner, and what its record entry says."""

    ref: ArtifactRef
    future: PrefectFuture
    label: str
    method: str
    changes: dict
    recorded: bool = False


def gpu_capped() -> bool:
    """Whether the run's Prefect server has an active concurrency limit on GPU_TAG: then the run's model stages carry
    the tag and each waits for a slot. Else they go untagged: Prefect asks its server for a slot at the start of every
    tagged task, which on SQLite can wait a minute (docs/scale-out.md, "GPUs")."""
    with get_client(sync_client=True) as client:
        try:  # Prefect 3 keeps a tag's limit (`prefect concurrency-limit create gpu N`) as the global limit `tag:gpu`
            return bool(client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}").active)
        except ObjectNotFound:
            return False


class Run:
    """A flow run: its config, store and record, and how it runs a stage as a cached Prefect task.

    With a task runner (`run.task_runner`), `stage` submits the task and returns its artifact's ref
    at once (keys are derived from configs and input keys, not from results): the task waits for the
    tasks that build its inputs, so independent stages run side by side. `wait` collects them all."""

    def __init__(self, cfg: PipelineConfig, store: ArtifactStore, params: RunParams, flow_name: str):
        self.cfg, self.store = cfg, store
        self.rebuild_stale = params.rebuild_stale_versions
        self.runner = task_runner(cfg.run)
        self.gpu_capped = gpu_capped()
        self.submitted: dict[str, Submitted] = {}  # key → the task that builds it (with a task runner)
        self.staged: set[str] = set()  # keys this run has built or submitted: each is built and recorded once
        self._recording = threading.Lock()
        self.forced: set[str] = set()  # keys built again on request this run
        self.record = RunRecord(store, str(flow_run.id or f"local-{os.getpid()}"), name=cfg.name, flow=flow_name,
                                config_path=params.config, overrides=params.changes(),
                                config=cfg.model_dump(mode="json"))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The task runner's lifetime (a Dask cluster, a process pool), if there is one."""
        with self.runner or contextlib.nullcontext():
            yield

    def stage(self, stage: Stage, config, inputs: Inputs, label: str = "", method: str = "",
              force: bool = False) -> ArtifactRef:
        """Run `stage` as a cached task; `force` builds it again even if the store has it."""
        ref = stage.ref(config, inputs)  # once per call: the task is handed it
        if ref.key in self.staged:  # another model or method of this run asked for it first (shared ids, views)
            return ref
        self.staged.add(ref.key)
        changes = stage.version_changes(self.store, ref)
        # What reads an artifact built again on request is built again too (same keys, new build).
        force = force or bool(changes and self.rebuild_stale) or any(i.key in self.forced for i in inputs.refs())
        if changes and not force:
            get_run_logger().warning(
                "%s: cached artifact %s was built with other library versions (%s); rerun with "
                "--rebuild-stale-versions (rebuild_stale_versions in the UI) to rebuild it", stage.display(label),
                ref.address, ", ".join(f"{lib} {was} → {now_}" for lib, (was, now_) in changes.items()))
        if force:
            self.forced.add(ref.key)
            self.store.discard(ref)
        runner = stage.as_task(self.cfg.retries, self.gpu_capped).with_options(task_run_name=stage.display(label))
        args = dict(store_url=self.store.url, config=config, inputs=inputs, ref=ref, label=label)
        if self.runner is None:
            state = runner(**args, return_state=True)
            self.record.add_stage(ref, state.name, label, method, changes)
            return outcome(state, ref)  # a stage's task returns the ref it was handed
        future = self.runner.submit(runner, args, wait_for=[self.submitted[i.key].future for i in inputs.refs()
                                                            if i.key in self.submitted])
        submitted = self.submitted[ref.key] = Submitted(ref, future, label, method, changes)
        future.add_done_callback(lambda _: self._finished(submitted))
        return ref

    def _finished(self, submitted: Submitted) -> None:
        """Record a submitted stage's end once: its callback and `wait` both get here, in either order."""
        with self._recording:
            if submitted.recorded:
                return
            submitted.recorded = True
            submitted.future.wait()  # done already; this keeps its final state (`state` would ask the API)
            self.record.add_stage(submitted.ref, submitted.future.state.name, submitted.label, submitted.method,
                                  submitted.changes)

    def wait(self) -> None:
        """Wait for every submitted stage, record them, and raise the first failure (in the order submitted)."""
        for submitted in self.submitted.values():
            submitted.future.wait()
            self._finished(submitted)
        for submitted in self.submitted.values():
            if submitted.future.state.is_failed() or submitted.future.state.is_crashed():
                submitted.future.state.result()

    def settled(self, ref: ArtifactRef) -> dict:
        """The manifest of a stage this run asked for, once it is built (with a task runner: waited for), or the
        stage's own error, raised: for a flow that decides what to run next from what a stage made (a search)."""
        if submitted := self.submitted.get(ref.key):
            submitted.future.wait()
            self._finished(submitted)
            outcome(submitted.future.state, None)
        return self.store.manifest(ref)

    def register(self, models: list[ReportedModel]) -> None:
        self.record.register([m.registration() for m in models])


def open_run(params: RunParams, flow_name: str) -> Run:
    """Load the config with the run's overrides (a bad one fails here, before any task) and start the record."""
    cfg = load_config(params.config, params.changes())
    store = open_store(params.store, cfg.store)
    store.check_writable()  # a served run too: one line naming the store, before any stage
    folders, freed = store.clear_leftovers()
    if folders:
        get_run_logger().info("removed %d temp folder(s) left in %s by killed runs: %.1f MB freed", folders,
                              store.root / ".tmp", freed / 1e6)
    return Run(cfg, store, params, flow_name)


def recorded(run: Run, body: Callable[[], T]) -> T:
    """Run a flow's body with the run's task runner, wait for its stages, and mark the record completed or failed."""
    try:
        with run.running():
            result = body()
            run.wait()
    except BaseException as e:  # KeyboardInterrupt and SIGTERM too: the record must not stay "running"
        if what := lost():  # a process it needs died: whichever stop or error that raised here
            run.record.finish("failed", error=what)
        elif stop := stop_signal(e):
            signum = signal.Signals(getattr(stop, "signal", signal.SIGINT))
            run.record.finish(stopped_as(), error=f"stopped by {signum.name}")
        else:
            run.record.finish("failed", error="".join(traceback.format_exception_only(e)).strip())
        track(run)
        raise
    run.record.finish("completed")
    track(run)
    return result


def stopped_as() -> str:
    """`cancelled` when the signal was Prefect's runner carrying out a cancellation from the UI or the
    API (it sets the flow run Cancelling first), else `interrupted`."""
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.get_id()).state
    except Exception:  # noqa: BLE001 (no API: a CLI run stopping; its server is still up, but be sure)
        return "interrupted"
    cancelling = state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED)
    return "cancelled" if cancelling else "interrupted"


def track(run: Run) -> None:
    """Log the finished run to the config's MLflow server, if any. A tracker that cannot be reached
    costs the run nothing: its results are in the store, and the error is in the run's log."""
    if run.cfg.tracking is None:
        return
    from tasks.reporting.tracking import log_run

    try:
        mlflow_id = log_run(run.store, run.record.run_id, run.cfg.tracking.mlflow)
        get_run_logger().info("logged to MLflow at %s: run %s", run.cfg.tracking.mlflow, mlflow_id)
    except Exception as e:  # noqa: BLE001 (any client or server error)
        get_run_logger().error("not logged to MLflow at %s: %s: %s", run.cfg.tracking.mlflow, type(e).__name__, e)
