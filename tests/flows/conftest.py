"""The `service` fixture: one `embforge server` (a real Prefect server with its UI, on loopback,
serving embforge's deployments) for the service and browser tests; `tracked_run`: one tiny run
logged to MLflow, for the tracking and export tests."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import processes
from tests.helpers import REPO, SECRET, STSB, deployment_count, free_port, prefect_home, tiny_config
from tests.workers import alone


class Service:
    """A started `embforge server`, and the REST calls the Prefect UI makes."""

    def __init__(self, url: str, home: Path):
        self.url, self.api, self.home = url, f"{url}/api", home
        self.csrf: dict[str, str] = {}

    def call(self, method: str, path: str, body: dict | None = None, attempts: int = 5):
        if method != "GET" and not self.csrf:  # as the UI does: a token for this client, sent with every change
            client = str(uuid.uuid4())
            token = self.call("GET", f"/csrf-token?client={client}")["token"]
            self.csrf = {"Prefect-Csrf-Token": token, "Prefect-Csrf-Client": client}
        request = urllib.request.Request(f"{self.api}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **self.csrf})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            # A busy server's SQLite answers 503 now and then; Prefect's own client retries those too.
            if e.code not in (429, 502, 503) or attempts == 1:
                raise
        time.sleep(2)
        return self.call(method, path, body, attempts - 1)

    def deployment(self, name: str) -> dict:
        return self.call("GET", f"/deployments/name/{name}")

    def start(self, name: str, **params) -> str:
        run = self.call("POST", f"/deployments/{self.deployment(name)['id']}/create_flow_run",
                        {"parameters": {"params": params}})
        return run["id"]

    def wait(self, run_id: str, timeout_s: float = 600) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.call("GET", f"/flow_runs/{run_id}")
            if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return run
            time.sleep(1)
        raise TimeoutError(f"flow run {run_id} did not finish in {timeout_s} s")

    def task_runs(self, run_id: str) -> list[dict]:
        return self.call("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}, "limit": 200})

    def artifacts(self, run_id: str) -> list[dict]:
        return self.call("POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [run_id]}}, "limit": 200})

    def logs(self, run_id: str) -> list[dict]:
        return self.call("POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200})


def stop(proc: subprocess.Popen | processes.Forked, timeout_s: float = 10) -> bool:
    """Ctrl-C to a process started in a session of its own, and its children; kill what hangs on.
    True if it exited by itself within `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):  # a forked process is reaped at once, its group gone with it
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


@contextlib.contextmanager
def embforge_server(home: Path, *args: str, timed_stop: bool = False, **env_vars: str) -> Iterator[Service]:
    """`embforge server ARGS` on a free port with PREFECT_HOME=home and `env_vars`, up once every
    deployment is registered. It must stop by itself at a Ctrl-C: within 10 s where `timed_stop` (the stop
    alone on the cores), else within a minute, beside another worker's test (what a hang looks like)."""
    port = free_port()
    env = {**os.environ, **env_vars, "PREFECT_HOME": str(home), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    env.pop("PREFECT_API_URL", None)
    with open(home / "server.log", "w") as log:
        proc = processes.Popen([sys.executable, "-m", "flows.cli", "server", "--port", str(port), *args], cwd=REPO,
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        svc = Service(f"http://127.0.0.1:{port}", home)
        deadline = time.monotonic() + 180
        while True:
            try:
                if len(svc.call("POST", "/deployments/filter", {})) == deployment_count():
                    break
            except (urllib.error.URLError, OSError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embforge server did not come up:\n{(home / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        yield svc
    finally:
        # Its Prefect server gets no Ctrl-C of its own: the deployments stop first, then the server.
        limit = 10 if timed_stop else 60
        with alone() if timed_stop else contextlib.nullcontext():  # timed: no other test's processes beside it
            assert stop(proc, limit), f"embforge server did not stop within {limit} s of a Ctrl-C"


@contextlib.contextmanager
def pool_worker(pool: str, home: Path, **env_vars: str) -> Iterator[Path]:
    """`prefect worker start --pool POOL` started outside the checkout with this checkout first on the
    path (as on a machine with embforge installed), polling every second; yields its log."""
    env = {**os.environ, **env_vars, "PREFECT_HOME": str(home), "PYTHONPATH": str(REPO),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    with open(home / "worker.log", "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "worker", "start", "--pool", pool],
                                cwd="/", env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield home / "worker.log"
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    home = prefect_home(tmp_path_factory.mktemp("service") / "prefect-home")
    with embforge_server(home, "--nightly-config", str(tiny_config(home)), HF_TOKEN=SECRET) as svc:
        yield svc


@dataclass(frozen=True)
class TrackedRun:
    store: Path
    run_id: str
    config: Path


@pytest.fixture(scope="session")
def tracked_run(tmp_path_factory, prefect_harness, mlflow_server) -> TrackedRun:
    """The tiny pipeline run once, logged to the test MLflow server: crops (with a learning curve)
    next to the base model, scored in-domain and on a local MTEB task. The tracking, export and
    mteb-results tests read it."""
    from flows.params import RunParams
    from flows.pipeline import pipeline

    folder = tmp_path_factory.mktemp("tracked")
    config = tiny_config(folder, name="tiny-tracked", tracking={"mlflow": mlflow_server},
                         methods=[{"name": "crops", "recipe": "crops", "train": {"eval_every": 4}}],
                         evaluate={"mteb": {"max_length": 32, "local": [
                             {"name": "STSB-slice", "type": "sts", "path": str(STSB), "limit": 60}]}})
    state = pipeline(RunParams(config=str(config)), return_state=True)
    assert state.is_completed()
    return TrackedRun(folder / "store", str(state.state_details.flow_run_id), config)
