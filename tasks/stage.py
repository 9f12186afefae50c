"""Stage identity and the thin Prefect wrapper that every stage shares.

A stage's key = hash(stage name, its config section, the keys of its inputs, extra key material
such as input-file digests, and a code version = hash of the source files the stage depends on).
The same key is the Prefect cache key and the artifact's folder name, so Prefect's `Cached`
state and the store agree. If the store was deleted, Prefect's cache records go with it.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from prefect import get_run_logger, task
from prefect.cache_policies import CacheKeyFnPolicy
from pydantic import BaseModel

from storage import ArtifactRef, ArtifactStore
from storage.store import ArtifactWriter, stable_hash
from tasks.config import ConfigError, InputError, RetryConfig

# build(store, config, inputs, out, ref, log) writes the artifact's files into `out`.
BuildFn = Callable[[ArtifactStore, Any, list[ArtifactRef], ArtifactWriter, ArtifactRef, logging.Logger], None]


def code_version(*modules: ModuleType) -> str:
    """Hash of the source of the modules a stage depends on: editing them invalidates its cache."""
    h = hashlib.sha256()
    for module in modules:
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: a pure build function plus what makes its identity."""

    name: str
    build: BuildFn
    code: tuple[ModuleType, ...]
    extra_key: Callable[[Any], Any] | None = None
    # False for an artifact that must be built again on the next run (an MTEB task skipped
    # because its data was not reachable gets scored once the data is there).
    complete: Callable[[ArtifactStore, ArtifactRef], bool] | None = None

    def reusable(self, store: ArtifactStore, ref: ArtifactRef) -> bool:
        return store.exists(ref) and (self.complete is None or self.complete(store, ref))

    def key(self, config: BaseModel, inputs: list[ArtifactRef]) -> str:
        extra = self.extra_key(config) if self.extra_key else None
        return stable_hash(self.name, config.model_dump(mode="json"), [i.key for i in inputs],
                           extra, code_version(*self.code))

    def ref(self, config: BaseModel, inputs: list[ArtifactRef]) -> ArtifactRef:
        return ArtifactRef(self.name, self.key(config, inputs))

    def run(self, store: ArtifactStore, config: BaseModel, inputs: list[ArtifactRef],
            log: logging.Logger | None = None) -> ArtifactRef:
        """Build the artifact unless the store already has it. Runs without Prefect."""
        log = log or logging.getLogger(f"embforge.{self.name}")
        ref = self.ref(config, inputs)
        if self.reusable(store, ref):
            log.info("%s: artifact %s already in the store, reusing it", self.name, ref.key)
            return ref
        if store.exists(ref):
            log.info("%s: artifact %s is incomplete, building it again", self.name, ref.key)
            store.discard(ref)
        with store.writing(ref, config=config.model_dump(mode="json"), inputs=inputs,
                           code_version=code_version(*self.code)) as out:
            self.build(store, config, inputs, out, ref, log)
        store.drop_scratch(ref)  # checkpoints are only needed until the artifact is published
        log.info("%s: wrote artifacts/%s/%s", self.name, ref.stage, ref.key)
        return ref

    def as_task(self, store: ArtifactStore, retry: RetryConfig | None = None):
        """The Prefect task for this stage, with its cache records kept inside `store` and retries
        with back-off for transient failures (training resumes from its checkpoint)."""
        retry = retry or RetryConfig()
        def cache_key(_ctx, params: dict) -> str:
            ref = self.ref(params["config"], params["inputs"])
            if not self.reusable(store, ref):
                store.forget_prefect_record(ref.key)  # deleted by hand or incomplete: Prefect must not hit
            return ref.key

        policy = CacheKeyFnPolicy(cache_key_fn=cache_key)

        def run_stage(store_root: str, config: BaseModel, inputs: list[ArtifactRef]) -> ArtifactRef:
            return self.run(ArtifactStore(store_root), config, inputs, get_run_logger())

        return task(run_stage, name=self.name, persist_result=True, retries=retry.attempts,
                    retry_delay_seconds=retry.delays, retry_condition_fn=transient_failure,
                    cache_policy=policy.configure(key_storage=str(store.prefect_cache)))


def transient_failure(_task, _task_run, state) -> bool:
    """Retry unless the stage failed on bad input or config: that fails the same way every time."""
    return not isinstance(state.result(raise_on_failure=False), (InputError, ConfigError))
