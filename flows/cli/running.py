"""`embforge run`, `embforge train` and `embforge select`: a config through the pipeline or the train flow, a corpus
through the select flow."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from flows.cli.common import add_command, overrides, print_table, run_entries, run_flow, say
from flows.params import SELECT_CONFIG, RunParams, SelectParams, TrainParams
from storage.catalog import Catalog
from storage.store import ArtifactStore
from storage.stores import open_store
from tasks.config.base import ConfigError
from tasks.config.loading import load_config
from tasks.config.pipeline import PipelineConfig
from tasks.reporting.tables import comparison_table

DEFAULT_SELECT = Path(__file__).resolve().parents[2] / SELECT_CONFIG


def config_params(args: argparse.Namespace, kind: type[RunParams], **more) -> tuple[RunParams, PipelineConfig,
                                                                                   ArtifactStore]:
    """`run`'s and `train`'s flow parameters, the config they make (loaded now: a bad config fails before Prefect
    starts; the flow reuses it) and its store."""
    changes = overrides(args.set)
    cfg = load_config(args.config, changes)
    store = open_store(args.store, cfg.store)
    return kind(config=args.config, overrides=changes, store=store.url,
                rebuild_stale_versions=args.rebuild_stale_versions, **more), cfg, store


def cmd_run(args: argparse.Namespace) -> int:
    params, cfg, store = config_params(args, RunParams)
    run_id, catalog = run_flow("run", "flows.pipeline", "pipeline", params, store)[0], Catalog(store)
    print_table(f"{cfg.name} (run {run_id})",
                comparison_table(catalog, run_entries(catalog, run_id)).to_dict("records"))
    reused = catalog.query("SELECT stage, label FROM run_stages WHERE run_id = ? AND state = 'Cached' "
                           "ORDER BY position", [run_id])
    if reused:
        say(f"resumed {len(reused)} stage(s) from the store: "
            + ", ".join(f"{r['stage']}[{r['label']}]" if r["label"] else r["stage"] for r in reused))
    stale = catalog.query("SELECT stage, label, key, version_changes FROM run_stages WHERE run_id = ? "
                          "AND state = 'Cached' AND version_changes IS NOT NULL ORDER BY position", [run_id])
    if stale:
        print_table("cached artifacts built with other library versions (--rebuild-stale-versions rebuilds them)",
                    stale)
    say(f"artifacts in {store.url}; query them with `embforge sql` or DuckDB")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    params, cfg, store = config_params(args, TrainParams, methods=args.methods or [])
    run_id, models = run_flow("train", "flows.pipeline", "train", params, store)
    print_table(f"{cfg.name} (run {run_id}): trained, not scored",
                [dict(label=m["label"], method=m["method"], model=m["artifact"] or m["external"]) for m in models])
    say(f"a model is its artifact's model/ folder in {store.url} (`embforge models` lists them)")
    return 0


def select_params(args: argparse.Namespace) -> tuple[SelectParams, PipelineConfig, ArtifactStore]:
    """The select flow's parameters, the config they make (loaded once: a bad corpus path, budget, recipe or store is
    exit 2 before Prefect) and its store: `--store`, else EMBFORGE_STORE, else the config's with `--set` applied."""
    try:
        params = SelectParams(config=args.config, corpus=args.corpus, qrels=args.qrels, budget=args.budget,
                              recipes=args.recipes or [], families=args.families or [], out=args.out,
                              static=args.static,
                              overrides=overrides(args.set))
    except ValidationError as e:  # as the UI's form would refuse it
        said = "; ".join(f"--{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(said) from None
    cfg = load_config(params.config, params.changes())
    store = open_store(args.store, cfg.store)
    return params.model_copy(update={"store": store.url}), cfg, store


def cmd_select(args: argparse.Namespace) -> int:
    params, cfg, store = select_params(args)
    _, selection = run_flow("select", "flows.select", "select", params, store)
    from flows.select import outcome_lines

    say(outcome_lines(store, selection, cfg))
    return 0


def add_config_run(sub: argparse._SubParsersAction, name: str, command, help: str) -> argparse.ArgumentParser:
    run = add_command(sub, name, command, help, config="positional")
    run.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                     help="change a config field for this run, e.g. --set train.epochs=2 --set "
                     "methods.0.train.lr=1e-4 (YAML values, checked like the file; repeatable)")
    run.add_argument("--rebuild-stale-versions", action="store_true",
                     help=RunParams.model_fields["rebuild_stale_versions"].description)
    return run


def add_run(sub: argparse._SubParsersAction) -> None:
    add_config_run(sub, "run", cmd_run, "run an experiment config through the pipeline flow")


def add_train(sub: argparse._SubParsersAction) -> None:
    train = add_config_run(sub, "train", cmd_train, "train a config's methods (the train flow) without scoring them; "
                           "the models are registered for `export` and the evaluate deployment")
    train.add_argument("--methods", nargs="+", metavar="NAME", help=TrainParams.model_fields["methods"].description)


def add_select(sub: argparse._SubParsersAction) -> None:
    select = add_command(sub, "select", cmd_select, "pick the recipe for a corpus on a held-out yardstick, train "
                         "the winner and export it (docs/select.md)", config=None)
    select.add_argument("corpus", nargs="?", help=SelectParams.model_fields["corpus"].description)
    select.add_argument("--config", default=str(DEFAULT_SELECT), help=f"defaults to start from (default: "
                        f"{SELECT_CONFIG})")
    select.add_argument("--qrels", metavar="FILE", help=SelectParams.model_fields["qrels"].description)
    select.add_argument("--budget", type=int, help="training steps of the winner (default: the config's "
                        "select.budget)")
    select.add_argument("--recipes", nargs="+", metavar="RECIPE", help="candidate recipes (default: the config's)")
    select.add_argument("--families", nargs="+", metavar="FAMILY", help="model families each recipe is tried as: "
                        "dense, multi_vector, sparse (default: the config's, dense)")
    select.add_argument("--out", help="folder to export the chosen model to (default: selected/<the corpus's name>)")
    select.add_argument("--static", action="store_true", help="also distil the chosen model into a static embedding "
                        "model (CPU speed), scored and exported beside it to <out>-static")
    select.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field, e.g. --set select.lrs=[3e-5]")


COMMANDS = {"run": add_run, "train": add_train, "select": add_select}
