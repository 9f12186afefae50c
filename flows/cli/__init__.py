"""The `embforge` command: run a config or only train its models, select a recipe, show reports, list runs, models
and artifacts, query the catalog, and run the Prefect server with embforge's deployments.
"""

from __future__ import annotations

import argparse
import signal

from flows.cli import catalog, running, service
from flows.cli.common import console, error
from storage.base import disk_fault
from tasks.config.base import INPUT_ERRORS, OutsideFault
from tasks.core import stopping

# Each command adds its own arguments (its group's module); this is the order `embforge --help` lists them in.
COMMANDS = {**running.COMMANDS, **catalog.COMMANDS, **service.COMMANDS}
ORDER = ("run", "train", "select", "report", "runs", "artifacts", "models", "verify", "server", "serve", "deploy",
         "export", "mteb-results", "sql")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="embforge", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ORDER:
        COMMANDS[name](sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with stopping.stop_on_signals():
        return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """The command, its errors said in one line, a signal's stop too."""
    try:
        try:
            return args.fn(args)
        except BaseException:  # whatever Prefect's engine raised on its way out of a run whose server died
            if what := stopping.lost():
                raise stopping.Lost(what) from None
            raise
    except (*INPUT_ERRORS, FileNotFoundError, NotADirectoryError) as e:
        error(str(e))
        return 2
    except (OSError, OutsideFault) as e:
        if (said := str(e) if isinstance(e, OutsideFault) else disk_fault(e)) is None:
            raise
        error(said)  # a run's log has the traceback
        return 1 if isinstance(e, OutsideFault) else 2  # a full or read-only disk fails until the user acts
    except stopping.Lost as e:  # the run's server or LLM engine died: nothing to wait for, a rerun resumes
        error(f"{e.what}; every finished stage is in the store; the same command resumes from it")
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signal", signal.SIGINT)
        console.print(f"stopped by {signum.name}: every finished stage is in the store; the same command resumes "
                      "from it", highlight=False)
        return 128 + signum
