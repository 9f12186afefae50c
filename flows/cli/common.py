"""What every `embforge` command shares: the console, its store, `--set`'s values, tables, and running a flow."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flows.params import RunParams
from storage.catalog import SCORE_STAGES, Catalog
from storage.store import ArtifactStore
from storage.stores import open_store
from tasks.config.base import ConfigError
from tasks.config.loading import load_config

# Wide enough for the report when piped to a file or CI log (rich defaults to 80 columns there). Warnings
# go to stderr through the root logger's handler, which importing Prefect sets up: stdout stays the report.
console = Console(width=None if sys.stdout.isatty() else 160)
Command = Callable[[argparse.Namespace], int]


def say(text: str) -> None:
    """Print text as it is: a label such as `train[crops@2e-05]` or a Markdown image is not console markup."""
    console.print(text, markup=False, highlight=False)


def error(said: str) -> None:
    """The one line of a refused command: `error:` in red, then what is wrong, as it is."""
    console.print(f"[bold red]error:[/bold red] {escape(said)}", highlight=False)


def add_command(sub: argparse._SubParsersAction, name: str, fn: Command, help: str,
                config: str | None = "option") -> argparse.ArgumentParser:
    """A command with `--store`, and its config as a positional argument, an option or none."""
    sp = sub.add_parser(name, help=help, description=help)
    sp.add_argument("--store", help="artifact store folder or URL, e.g. s3://bucket/prefix (default: "
                    "EMBFORGE_STORE, the config's `store`, or ./embforge-store)")
    if config == "positional":
        sp.add_argument("config", help="YAML config, e.g. configs/demo.yaml")
    elif config == "option":
        sp.add_argument("--config", help="take the store from this config")
    sp.set_defaults(fn=fn)
    return sp


def command_store(args: argparse.Namespace) -> ArtifactStore:
    config = getattr(args, "config", None)
    store = open_store(args.store, load_config(config, check_files=False).store if config else None)
    store.check_reachable()
    if not store.fs.exists(store.location()):  # a mistyped path, not an empty store
        raise FileNotFoundError(f"no store at {store.url}: check --store, EMBFORGE_STORE or the config's store")
    return store


def overrides(settings: list[str]) -> dict:
    """`--set train.epochs=2` → {"train.epochs": 2}: values are YAML, so numbers, booleans, lists
    and null mean what they mean in the config file."""
    parsed = {}
    for setting in settings:
        field, sep, value = setting.partition("=")
        if not sep or not field.strip():
            raise ConfigError(f"--set {setting}: expected FIELD=VALUE, e.g. --set train.epochs=2")
        try:
            parsed[field.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {setting}: the value is not valid YAML: {e}") from None
    return parsed


def print_table(title: str, rows: list[dict]) -> None:
    if not rows:
        console.print(f"[yellow]{escape(title)}: nothing yet[/yellow]")
        return
    table = Table(title=Text(title))
    for col in rows[0]:
        table.add_column(Text(str(col)))
    for row in rows:
        table.add_row(*(Text("" if v is None else str(v)) for v in row.values()))
    console.print(table)


def run_entries(catalog: Catalog, run_id: str) -> list[dict]:
    return catalog.query(f"SELECT label, method, key FROM run_stages WHERE run_id = ? AND stage IN {SCORE_STAGES} "
                         "ORDER BY position", [run_id])


def run_flow(command: str, module: str, name: str, params: RunParams, store: ArtifactStore) -> tuple[str, Any]:
    """Run the flow `module.name` against this command's own Prefect API (or PREFECT_API_URL's), its log kept in
    the store as the command's (logs/<command>-...); returns the flow run's id and what the flow returned, or raises
    the run's own error (e.g. an InputError naming the bad row)."""
    store.check_writable()  # a read-only, full or unreachable store: one line now, not a stage's traceback
    from flows.api import prefect_api  # Prefect is slow to import: only when running

    api = prefect_api()  # its server boots while the flows import
    from flows.logs import logged
    from flows.runners import outcome

    flow = getattr(importlib.import_module(module), name)
    with api, logged(store.log_file(command)) as log_file:
        state = flow(params, return_state=True)
    store.upload(log_file)  # an object store keeps it too
    if state.is_failed():
        say(f"the full log, with tracebacks: {log_file}")
    outcome(state, None)
    return str(state.state_details.flow_run_id), state.result()


