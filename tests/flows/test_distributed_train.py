"""`train.devices: 2` from a config: 2 gloo processes through torchrun, killed with their launcher's
process group mid-training, then resumed by a rerun with the uninterrupted run's numbers."""

import signal
import sys
import time

import psutil
import pyarrow.parquet as pq
import pytest
from sentence_transformers import SentenceTransformer

from tests import processes
from tests.flows.test_guarantees import latest_scores
from tests.helpers import REPO, cli_env, tiny_config

pytestmark = pytest.mark.slow


def run(config, store, env, **kwargs):
    return processes.run([sys.executable, "-m", "flows.cli", "run", str(config), "--store", str(store)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600, **kwargs)


def curve(store):
    return pq.read_table(next((store / "artifacts" / "train").glob("*/training.parquet"))).to_pylist()


def survivors(store) -> list[psutil.Process]:
    """Processes still running whose command line names this store's temp folders (torchrun's)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(store) in arg for arg in p.info["cmdline"] or []):
            found.append(p)
    return found


def test_two_processes_killed_with_their_launcher_resume_to_the_uninterrupted_numbers(tmp_path, prefect_api):
    config = tiny_config(tmp_path, methods=[{"name": "crops", "recipe": "crops"}], train={"devices": 2})
    env = cli_env(tmp_path / "prefect", prefect_api)
    straight = run(config, tmp_path / "straight", env)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    assert "training in 2 processes (torchrun, gloo)" in straight.stdout + straight.stderr
    model = next((tmp_path / "straight" / "artifacts" / "train").glob("*/model"))
    assert SentenceTransformer(str(model)).encode(["a sentence"]).shape == (1, 32)

    store = tmp_path / "killed"
    fault = {**env, "PYTHONPATH": f"{REPO / 'tests/flows/ddp_fault'}:{REPO}"}
    killed = run(config, store, fault, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    deadline = time.monotonic() + 30
    while survivors(store) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not survivors(store)  # the training processes died with torchrun: none writes on
    assert list((store / "scratch" / "train").rglob("checkpoint.pt"))

    resumed = run(config, store, env)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output
    assert "resuming from checkpoint at step 2 of 8" in output
    assert curve(store) == curve(tmp_path / "straight")  # every step's loss, to the last bit
    assert latest_scores(store) == latest_scores(tmp_path / "straight")
