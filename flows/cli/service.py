"""`embforge server`, `serve` and `deploy`: the Prefect server with its UI, and embforge's deployments on it."""

from __future__ import annotations

import argparse
import os

from flows.cli.common import add_command, console


def cmd_server(args: argparse.Namespace) -> int:
    from flows import server

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/yellow] the Prefect API has no authentication; {args.host} "
                      "exposes it beyond this machine")
    then = cmd_deploy if args.pool else cmd_serve
    return server.run_server(args.host, args.port, args.database, lambda: then(args), keep_up=bool(args.pool),
                             hosts=tuple(args.allowed_host))


def cmd_serve(args: argparse.Namespace) -> int:
    from flows import server

    if args.store:
        os.environ["EMBFORGE_STORE"] = args.store  # the served flow runs inherit it
    server.serve_deployments(args.nightly_config, args.cron, args.timezone)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from flows import server

    server.deploy_to_pool(args.pool, args.nightly_config, args.cron, args.timezone, args.working_dir, args.store)
    return 0


def add_service(sub: argparse._SubParsersAction, name: str, fn, help: str) -> None:
    sp = add_command(sub, name, fn, help, config=None)
    if name == "server":
        sp.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
        sp.add_argument("--port", type=int, default=4200, help="port of the UI and API (default 4200)")
        sp.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="another name clients reach the server by (repeatable); requests naming any other "
                        "host are refused (default: the --host address, and the loopback names on loopback)")
        sp.add_argument("--database", help="run Prefect's server on PostgreSQL: "
                        "postgresql://user:pass@host:port/db (default: a SQLite file in PREFECT_HOME); the "
                        "password can also come from PGPASSWORD")
    if name in ("server", "deploy"):
        sp.add_argument("--pool", required=name == "deploy", help="register the deployments on this work pool "
                        "(created as a process pool if missing); `prefect worker start --pool NAME` runs them"
                        + (" (default: serve them from here)" if name == "server" else ""))
        sp.add_argument("--working-dir", default=os.getcwd(), help="folder a process pool's runs start in, "
                        "config paths are relative to it (default: this one)")
    sp.add_argument("--nightly-config", default="configs/demo.yaml",
                    help="config whose benchmark set the nightly deployment scores (default configs/demo.yaml)")
    sp.add_argument("--cron", help="nightly schedule as a cron line (default 03:00: \"0 3 * * *\")")
    sp.add_argument("--timezone", help="time zone of the schedule (default: this machine's)")


COMMANDS = {name: lambda sub, name=name, fn=fn, help=help: add_service(sub, name, fn, help) for name, fn, help in (
    ("server", cmd_server, "start a local Prefect server with its UI and serve embforge's deployments"),
    ("serve", cmd_serve, "serve embforge's deployments against the Prefect server at PREFECT_API_URL"),
    ("deploy", cmd_deploy, "register embforge's deployments on a work pool of the Prefect server at "
     "PREFECT_API_URL; `prefect worker start --pool NAME` runs them"))}
