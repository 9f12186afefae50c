"""The task runners' workers compute as the flow's own process does: torch gets the same threads, so
a matrix product adds its sums in the same order and every runner gives the sequential scores."""

import json
import os
import subprocess
import sys

import pytest
from prefect.settings import PREFECT_API_URL
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

from flows.runners import task_runner
from tasks.config.run import RunConfig
from tasks.core.parallel import available_cores
from tests.helpers import REPO

# Run as its own main module that imports torch first, like the `embforge` command: a spawned worker
# imports the main module again before it runs anything, and torch fixes its threads on import.
SCRIPT = """
import json, sys
import torch
from prefect import flow, task
from flows.runners import task_runner
from tasks.config.run import RunConfig

@task
def torch_threads() -> int:
    return torch.get_num_threads()

@flow(task_runner=task_runner(RunConfig(task_runner=sys.argv[1], max_workers=2)))
def threads_in_workers() -> list[int]:
    return [f.result() for f in [torch_threads.submit() for _ in range(2)]]

if __name__ == "__main__":
    print(json.dumps({"flow": torch.get_num_threads(), "workers": threads_in_workers()}))
"""


def test_each_runner_is_prefects_own_with_the_configured_workers():
    assert task_runner(RunConfig()) is None  # sequential: stages called in turn in the flow's process
    threads = task_runner(RunConfig(task_runner="threads", max_workers=3))
    assert isinstance(threads, ThreadPoolTaskRunner) and threads._max_workers == 3
    processes = task_runner(RunConfig(task_runner="processes"))
    assert isinstance(processes, ProcessPoolTaskRunner) and processes._max_workers == available_cores()
    local = task_runner(RunConfig(task_runner="dask", max_workers=2))
    assert isinstance(local, DaskTaskRunner) and local.cluster_kwargs["n_workers"] == 2
    remote = task_runner(RunConfig(task_runner="dask", dask_address="tcp://127.0.0.1:8786"))
    assert remote.address == "tcp://127.0.0.1:8786"


@pytest.mark.slow  # a flow in a subprocess with worker processes or a Dask cluster: ~30 s each
@pytest.mark.parametrize("runner", ["processes", "dask"])
def test_workers_get_the_flow_process_torch_threads(prefect_harness, tmp_path, runner):
    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    # Two threads, not the one each pytest-xdist worker gives its processes (tests/workers.py): Dask's
    # workers start with one by default, so only a flow with more tells whether they are given its own.
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(REPO),
           **dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), "2")}
    done = subprocess.run([sys.executable, str(script), runner], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    threads = json.loads(done.stdout.strip().splitlines()[-1])
    assert threads["flow"] == 2 and threads["workers"] == [2, 2]
