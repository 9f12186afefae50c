"""Stage identity and the thin Prefect wrapper that every stage shares.

A stage's key = hash(stage name, its config section, its inputs' keys by role, extra key material
such as input-file digests, and its code version: the source of the module that defines its build
function and of every first-party module it imports, transitively; tasks/identity.py). The
same key is the Prefect cache key and the artifact's folder name, so Prefect's `Cached` state and
the store agree. If the store was deleted, Prefect's cache records go with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import CacheKeyFnPolicy
from pydantic import BaseModel, ConfigDict

from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, stable_hash
from tasks import identity
from tasks.config import ConfigError, InputError, RetryConfig
from tasks.progress import current_stage


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


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: a pure build function plus what makes its identity."""

    name: str
    build: BuildFn
    extra_key: Callable[[Any], Any] | None = None
    # False for an artifact that must be built again on the next run (an MTEB task skipped
    # because its data was not reachable gets scored once the data is there).
    complete: Callable[[ArtifactStore, ArtifactRef], bool] | None = None

    def __post_init__(self) -> None:
        STAGES[self.name] = self

    @property
    def code_version(self) -> str:
        return identity.code_version(self.build.__module__)

    def reusable(self, store: ArtifactStore, ref: ArtifactRef) -> bool:
        return store.exists(ref) and (self.complete is None or self.complete(store, ref))

    def ref(self, config: BaseModel, inputs: Inputs) -> ArtifactRef:
        extra = self.extra_key(config) if self.extra_key else None
        key = stable_hash(self.name, config.model_dump(mode="json"), inputs.key_by_role(), extra, self.code_version)
        return ArtifactRef(self.name, key)

    def version_changes(self, store: ArtifactStore, ref: ArtifactRef) -> dict[str, list[str | None]]:
        """Libraries whose version differs from the one the stored artifact was built with."""
        if not store.exists(ref):
            return {}
        return identity.version_changes(store.manifest(ref).get("libraries"), self.build.__module__)

    def display(self, label: str = "") -> str:
        """How logs and progress name what is built: `embed[crops]`, or the stage's name alone."""
        return f"{self.name}[{label}]" if label else self.name

    def run(self, store: ArtifactStore, config: BaseModel, inputs: Inputs, log: logging.Logger | None = None,
            ref: ArtifactRef | None = None, label: str = "") -> ArtifactRef:
        """Build the artifact unless the store already has it. Runs without Prefect; `ref` is
        `self.ref(config, inputs)` when the caller has it already; `label` names the model,
        recipe or corpus it is for in logs and progress."""
        name = self.display(label)
        log = Labelled(log or logging.getLogger(f"embforge.{self.name}"), name)
        ref = ref or self.ref(config, inputs)
        if self.reusable(store, ref):
            log.info("artifact %s already in the store, reusing it", ref.key)
            return ref
        if store.exists(ref):
            log.info("artifact %s is incomplete, building it again", ref.key)
            store.discard(ref)
        building = current_stage.set((name, ref.key))
        try:
            with store.writing(ref, config=config.model_dump(mode="json"), inputs=inputs.refs(),
                               roles=inputs.key_by_role(), code_version=self.code_version,
                               libraries=identity.library_versions(self.build.__module__)) as out:
                self.build(store, config, inputs, out, ref, log)
        finally:
            current_stage.reset(building)
        store.drop_scratch(ref)  # checkpoints are only needed until the artifact is published
        log.info("wrote artifacts/%s", ref.address)
        return ref

    def as_task(self, store: ArtifactStore, retry: RetryConfig | None = None):
        """The Prefect task for this stage, with its cache records kept inside `store` and retries
        with back-off for transient failures (training resumes from its checkpoint). It is called
        with the artifact's ref, computed once by the caller."""
        retry = retry or RetryConfig()

        def cache_key(_ctx, params: dict) -> str:
            ref = params["ref"]
            if not self.reusable(store, ref):
                store.forget_prefect_record(ref.key)  # deleted by hand or incomplete: Prefect must not hit
            return ref.key

        policy = CacheKeyFnPolicy(cache_key_fn=cache_key)

        def run_stage(store_root: str, config: BaseModel, inputs: Inputs, ref: ArtifactRef,
                      label: str = "") -> ArtifactRef:
            return self.run(ArtifactStore(store_root), config, inputs, get_run_logger(), ref, label)

        return task(run_stage, name=self.name, persist_result=True, retries=retry.attempts,
                    retry_delay_seconds=retry.delays, retry_condition_fn=transient_failure,
                    cache_policy=policy.configure(key_storage=str(store.prefect_cache)))


class Labelled(logging.LoggerAdapter):
    """Starts every line with what is being built (`embed[crops]: 2758 texts ...`)."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter, label: str):
        super().__init__(log, {})
        self.label = label

    def process(self, msg, kwargs):
        return f"{self.label}: {msg}", kwargs


def transient_failure(_task, _task_run, state) -> bool:
    """Retry unless the stage failed on bad input or config: that fails the same way every time."""
    return not isinstance(state.result(raise_on_failure=False), (InputError, ConfigError))
