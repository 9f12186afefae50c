"""Run embforge as a service: a local Prefect server with its UI, and embforge's deployments.

`embforge server` starts Prefect's server app (API and UI, as `prefect server start` does) on 127.0.0.1,
answering only the Host names it serves (analytics off, and PREFECT_SERVER_API_PORT set so the UI calls
the API on the chosen port), waits until it answers,
then serves the deployments from this process: flow runs started from the UI, the CLI or the
nightly schedule run here, in the folder the command was started in. `embforge serve` serves the
same deployments against the server PREFECT_API_URL names (an existing Prefect server).
`embforge deploy --pool NAME` (or `embforge server --pool NAME`) registers them on a work pool
instead: `prefect worker start --pool NAME` on each machine runs them. `--database` puts the
server's database on PostgreSQL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable

from prefect import deploy, get_client, serve
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import WorkPool
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.schedules import Cron
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.workers.process import ProcessWorker
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from flows.api import HOSTS_ENV, api_url, host_name, served_hosts, start_app, stop, wait_healthy
from flows.evaluate_registered import evaluate
from flows.pipeline import pipeline, summarize, train
from flows.select import select
from tasks.config.base import ConfigError

NIGHTLY_CRON = "0 3 * * *"


def deployments(nightly_config: str, cron: str | None = None, timezone: str | None = None,
                **options) -> list[RunnerDeployment]:
    """`pipeline`, `train`, `evaluate`, `summarize`, `select`, and `nightly`: `evaluate` of every registered
    model on `nightly_config`'s benchmark set, on a cron schedule (default 03:00 local time).
    `options` go to every `to_deployment` (a work pool's entrypoint type and job variables)."""
    tags = ["embforge"]
    return [
        pipeline.to_deployment(name="pipeline", tags=tags, description="Train and evaluate an experiment config.",
                               **options),
        train.to_deployment(name="train", tags=tags, description="Train a config's methods; register the models.",
                            **options),
        evaluate.to_deployment(name="evaluate", tags=tags, description="Score registered models on a config's "
                               "benchmark set; only what is not scored yet is computed.", **options),
        evaluate.to_deployment(name="nightly", tags=tags,
                               schedule=Cron(cron or NIGHTLY_CRON, timezone=timezone or local_timezone()),
                               parameters={"params": {"config": nightly_config}},
                               description="Nightly re-evaluation of every registered model.", **options),
        summarize.to_deployment(name="summarize", tags=tags, description="Generate a config's LLM summaries.",
                                **options),
        select.to_deployment(name="select", tags=tags, description="Pick the recipe for a corpus, train the winner "
                             "and export it.", **options),
    ]


def local_timezone() -> str:
    """The machine's IANA time zone, so that 03:00 means 03:00 where the server runs."""
    import tzlocal  # a Prefect dependency

    return tzlocal.get_localzone_name() or "UTC"


def server_env(host: str, port: int, database: str | None = None, hosts: tuple[str, ...] = ()) -> dict[str, str]:
    """The server's settings. A page open in the user's browser must not start runs on it: browsers may call
    its API from the UI's own origins only (CORS: the names it serves, `served_hosts`), and every change
    carries a CSRF token the server issued, which Prefect's UI and clients fetch and send, and which another
    site's page can neither read nor forge. `hosts`: the other names remote clients reach it by."""
    names = served_hosts(host, hosts)
    origins = [f"http://{name}:{port}" for name in names]
    env = {**os.environ, "PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": api_url(host, port),
           "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": ",".join(origins), "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
           HOSTS_ENV: ",".join(names)}
    if database:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url(database)
    return env


def database_url(url: str) -> str:
    """A PostgreSQL URL with the asyncpg driver, the one Prefect's server uses; `postgresql://` is
    accepted too. Errors never repeat the URL: it may hold a password."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError("--database: not a database URL; expected postgresql://user:pass@host:port/db") from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigError(f"--database: {parsed.get_backend_name()} is not supported; Prefect's server runs on "
                          "PostgreSQL (postgresql://user:pass@host:port/db) or on its default SQLite file")
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def shown_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def serve_deployments(nightly_config: str, cron: str | None, timezone: str | None) -> None:
    """Register the deployments and run their flow runs until interrupted."""
    serve(*deployments(nightly_config, cron, timezone))


def start_server(env: dict[str, str], **popen_args) -> subprocess.Popen:
    """Prefect's server app with `server_env`'s settings on its host and port, answering the Host names
    they list, returned once it answers. A port in use is a ConfigError naming --port."""
    host, port = env["PREFECT_SERVER_API_HOST"], int(env["PREFECT_SERVER_API_PORT"])
    try:
        sock = socket.create_server((host.strip("[]"), port),
                                    family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as e:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); is another "
                          "server on that port?") from None
    with sock:
        server = start_app(sock, env, **popen_args)
    try:
        wait_healthy(env["PREFECT_API_URL"], server)
    except BaseException:
        server.kill()
        raise
    return server


def run_server(host: str, port: int, database: str | None, then: Callable[[], None], keep_up: bool = False,
               hosts: tuple[str, ...] = ()) -> int:
    """Start the server; once it answers, run `then` against it. Serving the deployments blocks until
    interrupted; after registering them on a work pool, `keep_up` waits on the server instead."""
    env = server_env(host, port, database, hosts)
    server = start_server(env)
    try:
        db = env.get("PREFECT_SERVER_DATABASE_CONNECTION_URL")
        print(f"Prefect UI: http://{host_name(host)}:{port}  (API {env['PREFECT_API_URL']}"
              + (f", database {shown_url(db)})" if db else ")"), flush=True)
        # Flow runs started from here inherit the environment; Prefect read its settings at import.
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED")})
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            then()
        # Not server.wait(): a signal the kernel hands to another thread would not end a blocking
        # waitpid, and the Ctrl-C would wait on the server forever.
        while keep_up and server.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop(server)
    return 0


def work_pool(name: str) -> WorkPool:
    """The work pool `name`, created as a process pool (flow runs in subprocesses of the worker) if
    there is none; a docker or kubernetes pool is made beforehand with its own job template."""
    with get_client(sync_client=True) as client:
        try:
            return client.read_work_pool(name)
        except ObjectNotFound:
            return client.create_work_pool(WorkPoolCreate(
                name=name, type="process", base_job_template=ProcessWorker.get_default_base_job_template()))


def deploy_to_pool(pool: str, nightly_config: str, cron: str | None, timezone: str | None, working_dir: str,
                   store: str | None = None) -> None:
    """Register the deployments on a work pool. The flows are loaded by module path
    (`flows.pipeline.pipeline`), so a worker needs embforge importable, installed or on PYTHONPATH,
    not this checkout; on a process pool the runs start in `working_dir`, the folder config paths are
    relative to (containers have their own)."""
    if not PREFECT_API_URL.value():  # Prefect would register them on a temporary server that then stops
        raise ConfigError("embforge deploy needs a Prefect server: set PREFECT_API_URL, e.g. "
                          "http://127.0.0.1:4200/api (`embforge server --pool NAME` starts one)")
    variables = {"env": {"EMBFORGE_STORE": store}} if store else {}
    if work_pool(pool).type == "process":
        variables["working_dir"] = working_dir
    deploy(*deployments(nightly_config, cron, timezone, entrypoint_type=EntrypointType.MODULE_PATH,
                        job_variables=variables),
           work_pool_name=pool, build=False, push=False, ignore_warnings=True)
