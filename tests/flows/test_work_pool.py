"""Scale-out on a work pool: `embforge deploy --pool` against a real Prefect server on loopback, a real
`prefect worker start --pool` picking up a pipeline run, the artifacts in the store."""

import subprocess
import sys

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.cli import main
from flows.server import server_env, start_server
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tests import processes
from tests.flows.conftest import Service, pool_worker, stop
from tests.helpers import REPO, free_port, prefect_home, tiny_config

POOL = "embforge-test-pool"


def test_deploy_without_a_server_says_so(capsys):
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert main(["deploy", "--pool", POOL]) == 2
    assert "needs a Prefect server: set PREFECT_API_URL" in capsys.readouterr().out


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory):
    """A bare Prefect server (no served deployments: they would answer the runs themselves), and the
    environment that talks to it."""
    home = prefect_home(tmp_path_factory.mktemp("pool") / "prefect-home")
    env = {**server_env("127.0.0.1", free_port()), "PREFECT_HOME": str(home)}
    with open(home / "server.log", "w") as log:
        server = start_server(env, stdout=log, stderr=subprocess.STDOUT)
    yield Service(env["PREFECT_API_URL"].removesuffix("/api"), home), env
    stop(server)


@pytest.fixture(scope="module")
def deployed(pool_server, tmp_path_factory):
    """`embforge deploy --pool` before the pool exists, the runs to start in a folder outside the
    checkout: the worker imports the flows as it would from an installed embforge."""
    svc, env = pool_server
    folder = tmp_path_factory.mktemp("pool-run")
    config, store = tiny_config(folder), folder / "served-store"
    deploy = processes.run([sys.executable, "-m", "flows.cli", "deploy", "--pool", POOL, "--store", str(store),
                            "--working-dir", str(folder), "--nightly-config", str(config)], cwd=REPO, env=env,
                           capture_output=True, text=True)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    return svc, env, config, store


@pytest.fixture
def worker(deployed):
    svc = deployed[0]
    with pool_worker(POOL, svc.home, PREFECT_API_URL=svc.api) as log:
        yield log


@pytest.mark.slow  # a real server and `embforge deploy`: 20 s
def test_deploy_creates_the_pool_and_registers_every_deployment(deployed):
    svc, _, config, store = deployed
    assert svc.call("GET", f"/work_pools/{POOL}")["type"] == "process"
    registered = svc.call("POST", "/deployments/filter", {})
    assert {f"{d['entrypoint']}/{d['name']}" for d in registered} == {
        "flows.pipeline.pipeline/pipeline", "flows.pipeline.train/train", "flows.pipeline.summarize/summarize",
        "flows.evaluate_registered.evaluate/evaluate", "flows.evaluate_registered.evaluate/nightly",
        "flows.select.select/select"}
    for d in registered:
        assert d["work_pool_name"] == POOL
        assert d["job_variables"] == {"env": {"EMBFORGE_STORE": str(store)}, "working_dir": str(config.parent)}
    nightly = svc.deployment("evaluate/nightly")
    assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["0 3 * * *"]
    assert nightly["parameters"] == {"params": {"config": str(config)}}


@pytest.mark.slow  # a real worker, a flow run in a subprocess: 15 s more
def test_a_worker_on_the_pool_runs_the_pipeline(deployed, worker):
    svc, _, config, store = deployed
    run = svc.wait(svc.start("pipeline/pipeline", config=config.name), timeout_s=300)  # relative to working_dir
    assert run["state"]["type"] == "COMPLETED", (run["state"]["message"], worker.read_text()[-3000:])
    assert run["work_pool_name"] == POOL
    catalog = Catalog(ArtifactStore(store))
    assert catalog.query("SELECT status FROM runs WHERE run_id = ?", [run["id"]]) == [{"status": "completed"}]
    assert {r["stage"] for r in catalog.query("SELECT stage FROM artifacts")} >= {"ingest", "train", "evaluate"}
    assert not (config.parent / "store").exists()  # the config's own store: --store wins
