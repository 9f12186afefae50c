"""What docs/stages.md's "What embforge guarantees" promises, end to end through the `embforge` command:
a run killed inside any stage resumes to the same numbers, a run stopped by Ctrl-C or SIGTERM stops
within seconds and resumes to them too, a store copied elsewhere reruns all cached, and runs started
together on one store all finish with the same numbers."""

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests import processes
from tests.flows.test_cli import EMBFORGE, REPO, embforge
from tests.helpers import cli_env, tiny_config
from tests.workers import alone

# In pipeline order; `train` is killed mid-epoch, right after its first checkpoint.
STAGES = ["ingest", "sentences", "pairs", "tokens", "train", "text_tokens", "embed", "evaluate", "report"]


def latest_scores(store) -> dict:
    """(model, metric, split, layer, step) → value of the latest run's scores."""
    catalog = Catalog(ArtifactStore(store))
    rows = catalog.query("SELECT label, metric, split, layer, step, value FROM run_metrics WHERE run_id = ?",
                         [catalog.latest_run_id()])
    assert rows
    return {(r["label"], r["metric"], r["split"], r["layer"], r["step"]): r["value"] for r in rows}


def statuses(store) -> list[str]:
    return [r["status"] for r in Catalog(ArtifactStore(store)).query("SELECT status FROM runs ORDER BY started_at")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One tiny two-recipe run without faults: the numbers every other run must reproduce."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = tiny_config(tmp)
    first = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "HF_HUB_OFFLINE": "1"}  # no database yet
    result = embforge("run", str(config), env=first, forked=False)  # as a user's first run starts
    assert result.returncode == 0, result.stdout + result.stderr
    return config, tmp / "store", latest_scores(tmp / "store")


@pytest.mark.slow
def test_a_store_copied_elsewhere_reruns_all_cached_with_another_prefect_home(uninterrupted, tmp_path, prefect_api):
    config, store, scores = uninterrupted
    shutil.copytree(store, tmp_path / "copy")
    env = cli_env(tmp_path / "other-home", prefect_api)
    result = embforge("run", str(config), "--store", str(tmp_path / "copy"), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    catalog = Catalog(ArtifactStore(tmp_path / "copy"))
    states = catalog.query("SELECT DISTINCT state FROM run_stages WHERE run_id = ?", [catalog.latest_run_id()])
    assert states == [{"state": "Cached"}]
    assert latest_scores(tmp_path / "copy") == scores

    # Damage it as a full disk, a crash mid-copy or a hand would: two data files and a manifest cut
    # short, a manifest gone.
    artifacts = tmp_path / "copy" / "artifacts"
    cut = [next((artifacts / stage).glob(f"*/{name}")) for stage, name in (
        ("pairs", "pairs.parquet"), ("embed", "embeddings.parquet"), ("evaluate", "manifest.json"))]
    sizes = [path.stat().st_size for path in cut]
    for path in cut:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    next((artifacts / "report").glob("*/manifest.json")).unlink()
    result = embforge("run", str(config), "--store", str(tmp_path / "copy"), env=env)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, output
    for path, size in zip(cut[:2], sizes):
        assert (f"{path.parent.parent.name}/{path.parent.name}: {path.name} is {size // 2:,} bytes, expected "
                f"{size:,} — rebuilding") in output
    assert f"evaluate/{cut[2].parent.name}: manifest.json cannot be read" in output
    catalog = Catalog(ArtifactStore(tmp_path / "copy"))
    built = catalog.query("SELECT stage FROM run_stages WHERE run_id = ? AND state = 'Completed' ORDER BY stage",
                          [catalog.latest_run_id()])
    # Only what was damaged (the report lost its manifest); each came out with the bytes it was published
    # with before, which every reader's manifest records, so what reads them stays cached.
    assert [r["stage"] for r in built] == ["embed", "evaluate", "pairs", "report"]
    assert latest_scores(tmp_path / "copy") == scores
    assert embforge("verify", "--store", str(tmp_path / "copy"), env=env).returncode == 0


@pytest.mark.slow
def test_kill_9_inside_every_stage_then_resume_gives_the_uninterrupted_numbers(uninterrupted, tmp_path, prefect_api):
    config, _, scores = uninterrupted
    store, env = tmp_path / "store", cli_env(tmp_path / "prefect", prefect_api)
    for number, stage in enumerate(STAGES, 1):
        killed = processes.run([sys.executable, "-m", "tests.flows.faults", stage, "run", str(config), "--store",
                                str(store)], cwd=REPO, env=env, start_new_session=True,
                               capture_output=True, text=True, timeout=600)
        assert killed.returncode == -signal.SIGKILL, f"{stage}: {killed.stdout}{killed.stderr}"
        assert statuses(store) == ["crashed"] * number, stage  # the killed run does not stay `running`
        assert list((store / ".tmp").glob(f"{stage}-*")), stage  # killed inside it: its temp folder is left
    result = embforge("run", str(config), "--store", str(store), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "removed " in result.stdout + result.stderr and "temp folder(s) left" in result.stdout + result.stderr
    assert not (store / ".tmp").exists()
    assert statuses(store) == ["crashed"] * len(STAGES) + ["completed"]
    assert latest_scores(store) == scores
    assert embforge("verify", "--store", str(store), env=env).returncode == 0


def run_processes(prefect_home: str) -> list[psutil.Process]:
    """Processes started with this PREFECT_HOME: a run, its Prefect server, its workers."""
    def ours(p: psutil.Process) -> bool:
        try:
            return p.environ().get("PREFECT_HOME") == prefect_home
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
    return [p for p in psutil.process_iter() if p.pid != os.getpid() and ours(p)]


@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_within_seconds_and_the_rerun_resumes_to_the_same_numbers(uninterrupted, tmp_path):
    """Also the run's own Prefect server dying under it (kill -9): one error line within 30 s (not minutes of retries
    against a closed port), exit 2, and the rerun resumes."""
    config, _, scores = uninterrupted
    # The run's own temporary Prefect server, as a user's: the stop must end it too.
    store, env = tmp_path / "store", cli_env(tmp_path / "prefect", EMBFORGE_SIGNALLED_AT=str(tmp_path / "at"))
    stops = [("train:SIGINT", 130, 10), ("train:SIGTERM:pid", 143, 10), ("embed:SIGTERM", 143, 10),
             ("evaluate:SIGKILL:server", 2, 30)]
    for i, (where, code, within_s) in enumerate(stops):
        hold, log = tmp_path / f"hold-{i}", tmp_path / f"stop-{i}.log"
        hold.mkdir()
        with open(log, "w") as out:
            stopped = subprocess.Popen([sys.executable, "-m", "tests.flows.faults", where, "run", str(config),
                                        "--store", str(store)], env={**env, "EMBFORGE_HOLD_SIGNAL": str(hold)},
                                       cwd=REPO, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while not (hold / "ready").exists() and stopped.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the run starts beside other tests; it waits at its signal for the cores
            with alone():  # each stop is timed: no other test's processes beside it
                (hold / "go").touch()
                stopped.wait(timeout=600)
        finally:
            if stopped.poll() is None:
                os.killpg(stopped.pid, signal.SIGKILL)
        took = time.time() - float((tmp_path / "at").read_text())
        output = log.read_text()
        assert stopped.returncode == code, f"{where}: {output}"
        assert took < within_s, f"{where}: {took:.1f} s from the signal to the exit"
        said = "error: the run's Prefect server (pid " if code == 2 else f"stopped by {where.split(':')[1]}: "
        assert said in output and "every finished stage is in the store; the same command resumes" in output, output
        assert output.count("error:") == (code == 2), output
        assert "Error logging to API" not in output and "Traceback" not in output, output
        assert "EventsWorker" not in output, output  # nothing queued for a dead server is tried at exit
        assert not run_processes(env["PREFECT_HOME"]), f"{where}: a process of the run is left"
        if where == "train:SIGINT":  # signalled during step 3: the step ends, its checkpoint is saved
            assert "train[crops]: stopped after step 3 of" in " ".join(output.split())
        if where == "train:SIGTERM:pid":  # where the Ctrl-C'd run stopped, not its last periodic checkpoint (2)
            assert "train[crops]: resuming from checkpoint at step 3 of" in " ".join(output.split())
    runs = Catalog(ArtifactStore(store)).query("SELECT status, error FROM runs ORDER BY started_at")
    assert runs[:3] == [{"status": "interrupted", "error": f"stopped by {where.split(':')[1]}"}
                        for where, _, _ in stops[:3]]
    assert runs[3]["status"] == "failed" and runs[3]["error"].endswith("died (killed by SIGKILL)"), runs[3]
    result = embforge("run", str(config), "--store", str(store), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert latest_scores(store) == scores


@pytest.mark.slow
def test_runs_started_together_on_one_store_all_finish_with_the_same_numbers(uninterrupted, tmp_path, prefect_api):
    config, _, scores = uninterrupted
    crops_only = tmp_path / "crops.yaml"  # another config sharing ingest, sentences, init and crops' stages
    crops_only.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "name": "crops-only",
                                          "methods": [{"name": "crops", "recipe": "crops"}]}))
    store, env = tmp_path / "store", cli_env(tmp_path / "prefect", prefect_api)  # one PREFECT_HOME, as for one user
    runs = [processes.Popen([*EMBFORGE, "run", str(c), "--store", str(store)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for c in (config, config, crops_only)]
    for run in runs:
        output = run.communicate(timeout=900)[0]
        assert run.returncode == 0, output
    catalog = Catalog(ArtifactStore(store))
    for run in catalog.query("SELECT run_id, name FROM runs"):
        rows = catalog.query("SELECT label, metric, split, layer, step, value FROM run_metrics WHERE run_id = ?",
                             [run["run_id"]])
        got = {(r["label"], r["metric"], r["split"], r["layer"], r["step"]): r["value"] for r in rows}
        assert got == {k: v for k, v in scores.items() if k[0] in {r["label"] for r in rows}}, run["name"]
        assert {k[0] for k in got} == ({"base (random init)", "crops"} if run["name"] == "crops-only"
                                       else {k[0] for k in scores})
    assert embforge("verify", "--store", str(store), env=env).returncode == 0
