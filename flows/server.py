"""Run embforge as a service: a local Prefect server with its UI, and embforge's deployments.

`embforge server` starts `prefect server start` on 127.0.0.1 (analytics off, and
PREFECT_SERVER_API_PORT set so the UI calls the API on the chosen port), waits until it answers,
then serves the deployments from this process: flow runs started from the UI, the CLI or the
nightly schedule run here, in the folder the command was started in. `embforge serve` serves the
same deployments against the server PREFECT_API_URL names (an existing Prefect server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.evaluate_registered import evaluate
from flows.pipeline import pipeline, summarize, train

NIGHTLY_CRON = "0 3 * * *"


def deployments(nightly_config: str, cron: str | None = None, timezone: str | None = None) -> list[RunnerDeployment]:
    """`pipeline`, `train`, `evaluate`, `summarize`, and `nightly`: `evaluate` of every registered
    model on `nightly_config`'s benchmark set, on a cron schedule (default 03:00 local time)."""
    tags = ["embforge"]
    return [
        pipeline.to_deployment(name="pipeline", tags=tags, description="Train and evaluate an experiment config."),
        train.to_deployment(name="train", tags=tags, description="Train a config's methods; register the models."),
        evaluate.to_deployment(name="evaluate", tags=tags, description="Score registered models on a config's "
                               "benchmark set; only what is not scored yet is computed."),
        evaluate.to_deployment(name="nightly", tags=tags,
                               schedule=Cron(cron or NIGHTLY_CRON, timezone=timezone or local_timezone()),
                               parameters={"params": {"config": nightly_config}},
                               description="Nightly re-evaluation of every registered model."),
        summarize.to_deployment(name="summarize", tags=tags, description="Generate a config's LLM summaries."),
    ]


def local_timezone() -> str:
    """The machine's IANA time zone, so that 03:00 means 03:00 where the server runs."""
    import tzlocal  # a Prefect dependency

    return tzlocal.get_localzone_name() or "UTC"


def server_env(host: str, port: int) -> dict[str, str]:
    return {**os.environ, "PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": api_url(host, port)}


def api_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/api"


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {server.returncode}; see its output above")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise RuntimeError(f"prefect server did not answer on {url} within {timeout_s:.0f} s")


def serve_deployments(nightly_config: str, cron: str | None, timezone: str | None, api: str | None = None) -> None:
    """Register the deployments and run their flow runs until interrupted."""
    deps = deployments(nightly_config, cron, timezone)
    if api is None:
        serve(*deps)
        return
    with temporary_settings(updates={PREFECT_API_URL: api}):
        serve(*deps)


def run_server(host: str, port: int, nightly_config: str, cron: str | None, timezone: str | None) -> int:
    env = server_env(host, port)
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host,
                               "--port", str(port)], env=env)
    try:
        wait_healthy(env["PREFECT_API_URL"], server)
        print(f"Prefect UI: http://{host}:{port}  (API {env['PREFECT_API_URL']})", flush=True)
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED")})
        serve_deployments(nightly_config, cron, timezone, api=env["PREFECT_API_URL"])
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0
