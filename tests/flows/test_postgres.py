"""`embforge server --database --pool`: Prefect's server on a real PostgreSQL (Debian's, started here
on loopback) with the deployments on a work pool, a worker running a pipeline run, the rows in
PostgreSQL, and the password never printed."""

import asyncio
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import asyncpg
import pytest

from flows.cli import main
from flows.server import database_url
from tests.flows.conftest import embforge_server, pool_worker
from tests.helpers import deployment_count, free_port, tiny_config

USER, PASSWORD = "embforge", "pg_secret_never_printed"


def pg_bin() -> Path | None:
    """Debian keeps the server programs off PATH, in /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1:]), None)
    return Path(found).resolve().parent if found else None


def query(url: str, sql: str, *args) -> list[dict]:
    async def fetch():
        con = await asyncpg.connect(url)
        try:
            return [dict(r) for r in await con.fetch(sql, *args)]
        finally:
            await con.close()

    return asyncio.run(fetch())


@pytest.fixture(scope="module")
def postgres():
    """A throwaway cluster on 127.0.0.1 with password authentication; its URL (plain postgresql://)."""
    bindir = pg_bin()
    if bindir is None:
        pytest.fail("no PostgreSQL server programs: .ci/setup installs Debian's postgresql")
    # PostgreSQL refuses to run as root: as root, run it as the postgres user, in a folder it owns
    # (pytest's tmp_path is root's, mode 0700).
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="embforge-pg-"))
    (folder / "pw").write_text(PASSWORD)
    if as_owner:
        for path in (folder, folder / "pw"):
            shutil.chown(path, "postgres")
    data, port = folder / "data", free_port()
    subprocess.run([*as_owner, bindir / "initdb", "-D", data, "-U", USER, f"--pwfile={folder / 'pw'}",
                    "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"], check=True, capture_output=True)
    subprocess.run([*as_owner, bindir / "pg_ctl", "-D", data, "-l", folder / "log", "-w", "-o",
                    f"-h 127.0.0.1 -p {port} -k {folder}", "start"], check=True, capture_output=True)
    url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}"
    try:
        query(f"{url}/postgres", "CREATE DATABASE prefect")
        yield f"{url}/prefect"
    finally:
        subprocess.run([*as_owner, bindir / "pg_ctl", "-D", data, "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(folder)


def test_database_urls_get_the_asyncpg_driver_and_errors_hide_the_password(capsys):
    assert database_url(f"postgresql://{USER}:{PASSWORD}@db:5432/prefect") == (
        f"postgresql+asyncpg://{USER}:{PASSWORD}@db:5432/prefect")
    assert database_url("postgres://db/prefect") == "postgresql+asyncpg://db/prefect"
    assert database_url("postgresql+asyncpg://db/prefect") == "postgresql+asyncpg://db/prefect"
    for url in (f"mysql://{USER}:{PASSWORD}@db/prefect", f"{USER}:{PASSWORD}@db"):
        assert main(["server", "--database", url]) == 2
        printed = capsys.readouterr().out
        assert "error: --database" in printed and PASSWORD not in printed


@pytest.mark.slow  # PostgreSQL, a real server, a worker, a flow run in a subprocess: a minute and a half
def test_server_on_postgresql_with_a_worker_runs_the_pipeline(postgres, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    config = tiny_config(tmp_path)
    with (embforge_server(home, "--database", postgres, "--pool", "pg-pool", "--nightly-config", str(config)) as svc,
          pool_worker("pg-pool", home, PREFECT_API_URL=svc.api)):
        assert svc.call("GET", "/health") is True
        run = svc.wait(svc.start("pipeline/pipeline", config=str(config)), timeout_s=300)
        assert run["state"]["type"] == "COMPLETED", run["state"]["message"]
    # What the server stored went to PostgreSQL, not to a SQLite file in PREFECT_HOME.
    assert query(postgres, "SELECT state_type FROM flow_run WHERE id = $1::uuid", run["id"]) == [
        {"state_type": "COMPLETED"}]
    assert query(postgres, "SELECT count(*) AS n FROM task_run WHERE flow_run_id = $1::uuid", run["id"])[0]["n"] > 5
    assert {r["type"] for r in query(postgres, "SELECT type FROM work_pool WHERE name = 'pg-pool'")} == {"process"}
    assert len(query(postgres, "SELECT name FROM deployment")) == deployment_count()
    assert not list(home.glob("*.db"))
    printed = (home / "server.log").read_text()
    assert "database postgresql+asyncpg://embforge:***@127.0.0.1" in printed
    assert PASSWORD not in printed
