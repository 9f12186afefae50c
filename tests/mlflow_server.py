"""An MLflow tracking server on loopback for the tests: `mlflow server` with a SQLite backend and
its artifact store in a temporary folder, started once per session and stopped with its workers."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_until_answering


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """The tracking URI (http://127.0.0.1:PORT) of a fresh MLflow server."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(folder / "server.log", "w")
    mlflow = str(Path(sys.executable).parent / "mlflow")
    # Its own session: the server's workers are stopped with it. No job runner (huey consumers that
    # would spin on the 2 cores for nothing).
    proc = subprocess.Popen([mlflow, "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                             "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    wait_until_answering(f"{uri}/health", proc, folder / "server.log", "MLflow")
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
