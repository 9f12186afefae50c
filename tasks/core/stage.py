"""Stage identity and the thin Prefect wrapper that every stage shares.

A stage's key = hash(stage name, its config section, its inputs' keys by role, extra key material
such as input-file digests, and its code version: the source of the module that defines its build
function and of every first-party module it imports, transitively; tasks/core/identity.py). The
same key is the artifact's folder name. Whether a stage is cached is decided from the store alone:
the task returns a `Cached` state when the store holds a trustworthy artifact for its key, so
nothing outside the store (no Prefect result file, no PREFECT_HOME) is needed to resume a run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from pydantic import BaseModel, ConfigDict

from storage import leases
from storage.base import ArtifactRef, StoreUnusable, disk_fault, stable_hash
from storage.store import ArtifactStore, ArtifactWriter
from storage.stores import store_at
from tasks.config.base import IDENTITY, INPUT_ERRORS
from tasks.config.run import RetryConfig
from tasks.core import identity
from tasks.core.parallel import GLOBAL_RNG
from tasks.core.progress import current_stage
from tasks.core.stopping import lost


class Inputs(BaseModel):
    """A stage's input artifacts, each under the name of its role (`sentences`, `documents`, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def key_by_role(self) -> dict[str, Any]:
        """role → key (or list of keys, or mapping of them): what the stage's key hashes."""
        return {role: _map_refs(getattr(self, role), lambda ref: ref.key) for role in type(self).model_fields}

    def refs(self) -> list[ArtifactRef]:
        """Every input artifact, in role order."""
        found: list[ArtifactRef] = []
        for role in type(self).model_fields:
            _map_refs(getattr(self, role), found.append)
        return found


def _map_refs(value: Any, fn: Callable[[ArtifactRef], Any]) -> Any:
    """`value` with `fn` applied to every ArtifactRef in it (inputs nest them in lists and dicts)."""
    if isinstance(value, ArtifactRef):
        return fn(value)
    if isinstance(value, list):
        return [_map_refs(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_refs(v, fn) for k, v in value.items()}
    return value


class NoInputs(Inputs):
    """For stages that start from their config alone (ingest, init, llm)."""


# build(store, config, inputs, out, ref, log) writes the artifact's files into `out`.
BuildFn = Callable[[ArtifactStore, Any, Any, ArtifactWriter, ArtifactRef, logging.Logger], None]

# Every stage, by name: the stage-identity test walks them all.
STAGES: dict[str, Stage] = {}

# The tag of stages that run a model on the accelerator: a Prefect concurrency limit on it
# (`prefect concurrency-limit create gpu N`) caps them at one per GPU however many run at once. A run tags them
# only where its server has that limit (flows/runs.py: `gpu_capped`).
GPU_TAG = "gpu"


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: a pure build function plus what makes its identity."""

    name: str
    build: BuildFn
    extra_key: Callable[[Any], Any] | None = None
    # False for an artifact that must be built again on the next run (an MTEB task skipped
    # because its data was not reachable gets scored once the data is there).
    complete: Callable[[ArtifactStore, ArtifactRef], bool] | None = None
    gpu: bool = False  # runs a model (training, encoding, generation): tagged GPU_TAG where the tag is capped
    seeds_global_rng: bool = False  # seeds and draws from torch's process-wide generator: holds GLOBAL_RNG

    def __post_init__(self) -> None:
        STAGES[self.name] = self
        # Hashed now, while the stage's module is being loaded: a source edited later, during a long
        # run, must not key what the loaded (older) code builds as the new code's artifact.
        identity.code_version(self.build.__module__)

    @property
    def code_version(self) -> str:
        return identity.code_version(self.build.__module__)

    def cached(self, store: ArtifactStore, ref: ArtifactRef, log: logging.Logger | logging.LoggerAdapter) -> bool:
        """Whether the store holds a finished artifact for `ref` that can be served. One that fails its
        size check is set aside (to damaged/) and one that is incomplete is discarded: both are rebuilt."""
        if not store.exists(ref):
            return False
        if damage := store.problems(ref):
            aside = store.set_aside(ref, "; ".join(damage))
            log.warning("%s: %s — rebuilding%s", ref.address, "; ".join(damage),
                        f" (the damaged one is kept in {aside})" if aside else "")
            return False
        if changed := store.changed_inputs(ref):
            log.info("artifact %s was built from other bytes of %s, building it again", ref.key, ", ".join(changed))
            store.discard(ref)
            return False
        if self.complete and not self.complete(store, ref):
            log.info("artifact %s is incomplete, building it again", ref.key)
            store.discard(ref)
            return False
        log.info("artifact %s already in the store, reusing it", ref.key)
        return True

    def ref(self, config: BaseModel, inputs: Inputs) -> ArtifactRef:
        extra = self.extra_key(config) if self.extra_key else None
        key = stable_hash(self.name, config.model_dump(mode="json", context=IDENTITY), inputs.key_by_role(), extra,
                          self.code_version)
        return ArtifactRef(self.name, key)

    def version_changes(self, store: ArtifactStore, ref: ArtifactRef) -> dict[str, list[str | None]]:
        """Libraries whose version differs from the one the stored artifact was built with."""
        manifest = store.readable_manifest(ref)  # none, or damaged: `cached` sets it aside
        return {} if manifest is None else identity.version_changes(manifest.get("libraries"), self.build.__module__)

    def display(self, label: str = "") -> str:
        """How logs and progress name what is built: `embed[crops]`, or the stage's name alone."""
        return f"{self.name}[{label}]" if label else self.name

    def run(self, store: ArtifactStore, config: BaseModel, inputs: Inputs, log: logging.Logger | None = None,
            ref: ArtifactRef | None = None, label: str = "") -> ArtifactRef:
        """Build the artifact unless the store already has it. Runs without Prefect; `ref` is
        `self.ref(config, inputs)` when the caller has it already; `label` names the model,
        recipe or corpus it is for in logs and progress."""
        ref = ref or self.ref(config, inputs)
        log = self._log(log, label)
        if not self.cached(store, ref, log):
            self.publish_once(store, config, inputs, ref, log, label)
        return ref

    def _log(self, log: logging.Logger | None, label: str) -> Labelled:
        return Labelled(log or logging.getLogger(f"embforge.{self.name}"), self.display(label))

    def publish(self, store: ArtifactStore, config: BaseModel, inputs: Inputs, ref: ArtifactRef,
                log: logging.Logger | logging.LoggerAdapter, label: str = "") -> ArtifactRef:
        """Build the artifact from inputs that pass their size check, and publish it."""
        for source in inputs.refs():
            store.check(source)
        building = current_stage.set((self.display(label), ref.key))
        try:
            with store.writing(ref, config=config.model_dump(mode="json"), inputs=inputs.refs(),
                               roles=inputs.key_by_role(), code_version=self.code_version,
                               libraries=identity.library_versions(self.build.__module__)) as out:
                with GLOBAL_RNG if self.seeds_global_rng else contextlib.nullcontext():
                    self.build(store, config, inputs, out, ref, log)
        except Exception as e:  # a full or read-only disk: one line naming the store and the stage, not retried
            if (fault := disk_fault(e)) is None:
                raise
            raise StoreUnusable(f"store {store.url}: {self.display(label)} could not be written: {fault}; every "
                                "finished stage is kept and the same command resumes from them") from e
        finally:
            current_stage.reset(building)
        store.drop_scratch(ref)  # checkpoints are only needed until the artifact is published
        log.info("wrote artifacts/%s", ref.address)
        return ref

    def publish_once(self, store: ArtifactStore, config: BaseModel, inputs: Inputs, ref: ArtifactRef,
                     log: logging.Logger | logging.LoggerAdapter, label: str = "") -> bool:
        """Publish the artifact under the key's lease (storage/leases.py), so that runs sharing the store
        build it once: False when another process published it meanwhile (waited for, or just before)."""
        with leases.hold(store, ref, lambda: store.exists(ref), log) as mine:
            if mine and not self.cached(store, ref, log):
                self.publish(store, config, inputs, ref, log, label)
                return True
        if not mine:
            log.info("artifact %s was built by another run, reusing it", ref.key)
        return False

    def as_task(self, retry: RetryConfig | None = None, tag_gpu: bool = False):
        """The Prefect task for this stage, with retries and back-off for transient failures (training
        resumes from its checkpoint). It is called with the artifact's ref, computed once by the caller,
        and ends `Cached` when the store has the artifact: Prefect's own cache and result files are
        not used, so the store alone decides. `tag_gpu`: a model stage carries GPU_TAG."""
        retry = retry or RetryConfig()

        def run_stage(store_url: str, config: BaseModel, inputs: Inputs, ref: ArtifactRef, label: str = ""):
            store, log = store_at(store_url), self._log(get_run_logger(), label)
            if self.cached(store, ref, log) or not self.publish_once(store, config, inputs, ref, log, label):
                return Completed(data=ref, name="Cached", message=f"artifacts/{ref.address} is in the store")
            return ref

        return task(run_stage, name=self.name, tags=[GPU_TAG] if self.gpu and tag_gpu else None, cache_policy=NO_CACHE,
                    persist_result=False, retries=retry.attempts, retry_delay_seconds=retry.delays,
                    retry_condition_fn=transient_failure)


class Labelled(logging.LoggerAdapter):
    """Starts every line with what is being built (`embed[crops]: 2758 texts ...`)."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter, label: str):
        super().__init__(log, {})
        self.label = label

    def process(self, msg, kwargs):
        return f"{self.label}: {msg}", kwargs


def transient_failure(_task, task_run, state) -> bool:
    """Retry unless the stage failed on bad input, config, a damaged input artifact or a disk that is
    full or read-only, or its run is being cancelled: a cancel's SIGTERM can come out of a library as an
    ordinary error of its own (torch's checkpoint writer did; Checkpoints.save now raises the stop itself),
    and a retry would train on after the user asked it to stop; or the run is stopping because a process it
    needs died (its Prefect server, the LLM engine: `stopping.lost`)."""
    error = state.result(raise_on_failure=False)
    return (not isinstance(error, INPUT_ERRORS) and disk_fault(error) is None and not lost()
            and not run_cancelling(task_run))


def run_cancelling(task_run) -> bool:
    """Whether the task run's flow run is being cancelled (asked of the server: the source of truth)."""
    if task_run is None or task_run.flow_run_id is None:
        return False
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(task_run.flow_run_id).state
    return state is not None and (state.is_cancelling() or state.is_cancelled())
