"""The task runner a run's stages go through (`run.task_runner` in the config), and what a stage's
final state gives back (`outcome`).

`sequential` keeps the one-machine default exactly as it was: each stage runs in the flow's
process when the flow reaches it. The others are Prefect's own runners: stages are submitted
with their inputs' futures to wait for, so independent ones (the methods of a config, every
model's embeddings and scores) run side by side; nothing here schedules anything itself.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from prefect.client.schemas.objects import State
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from tasks.config.run import RunConfig
from tasks.core.parallel import available_cores

T = TypeVar("T")


def task_runner(run: RunConfig) -> TaskRunner | None:
    """Prefect's runner for `run.task_runner`; None for `sequential` (stages called in turn)."""
    workers = run.max_workers or available_cores()
    if run.task_runner == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if run.task_runner == "processes":
        return ProcessPoolTaskRunner(max_workers=workers)
    if run.task_runner == "dask":
        import dask
        from prefect_dask import DaskTaskRunner  # imports dask.distributed: only when asked for

        if run.dask_address:
            return DaskTaskRunner(address=run.dask_address)
        # One process per stage (stages hold the GIL in tokenisers and numpy loops). distributed spawns
        # them with OMP_NUM_THREADS=1, and a worker imports torch at its start (with the main module),
        # too early for a later `env` to count: set the threads torch has here before the spawn, so that
        # sums are added in the same order and the scores are the ones the other runners give.
        dask.config.set({f"distributed.nanny.pre-spawn-environ.{name}": torch.get_num_threads()
                         for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
        return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                              cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})
    return None


def outcome(state: State, value: T) -> T:
    """`value`, what the run returns (known to the caller), if `state` is completed; else the run's own error,
    raised. A completed state is never asked for its data: when the server rejects a final state as one it
    already has (a request retried after the server took it), Prefect hands back the server's copy, which
    carries no result (MissingResult for a run that succeeded)."""
    if not state.is_completed():
        state.result()
    return value
