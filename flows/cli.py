"""The `embforge` command: run a config, select a recipe, show reports, list runs, models and artifacts, query the
catalog, and run the Prefect server with embforge's deployments.

It is over 400 lines: a short function per command and the one parser that names them all, so that `embforge
--help` and each command's options are read in one place; the work is in flows/ and tasks/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import track
from rich.table import Table

from flows.params import RunParams, SelectParams
from storage.base import disk_fault
from storage.catalog import SCORE_STAGES, Catalog, QueryError
from storage.store import ArtifactStore
from storage.stores import open_store
from tasks.config.base import INPUT_ERRORS, ConfigError, OutsideFault
from tasks.config.loading import load_config
from tasks.core import stopping
from tasks.reporting.tables import comparison_table, long_rows, notes, paired_differences, paired_lines, to_markdown

# Wide enough for the report when piped to a file or CI log (rich defaults to 80 columns there). Warnings
# go to stderr through the root logger's handler, which importing Prefect sets up: stdout stays the report.
console = Console(width=None if sys.stdout.isatty() else 160)
DEFAULT_SELECT = Path(__file__).resolve().parents[1] / "configs" / "select.yaml"


def _store(args: argparse.Namespace) -> ArtifactStore:
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


def _print_table(title: str, rows: list[dict]) -> None:
    if not rows:
        console.print(f"[yellow]{title}: nothing yet[/yellow]")
        return
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(table)


def run_entries(catalog: Catalog, run_id: str) -> list[dict]:
    return catalog.query(f"SELECT label, method, key FROM run_stages WHERE run_id = ? AND stage IN {SCORE_STAGES} "
                         "ORDER BY position", [run_id])


def run_flow(command: str, module: str, name: str, params: RunParams, store: ArtifactStore) -> str:
    """Run the flow `module.name` against this command's own Prefect API (or PREFECT_API_URL's), its log kept in
    the store as the command's (logs/<command>-...); returns the flow run's id, or raises the run's own error (e.g.
    an InputError naming the bad row)."""
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
        console.print(f"the full log, with tracebacks: {log_file}", highlight=False)
    outcome(state, None)
    return str(state.state_details.flow_run_id)


def cmd_run(args: argparse.Namespace) -> int:
    changes = overrides(args.set)
    cfg = load_config(args.config, changes)  # fail on a bad config before Prefect starts; the flow reuses it
    store = open_store(args.store, cfg.store)
    params = RunParams(config=args.config, overrides=changes, store=store.url,
                       rebuild_stale_versions=args.rebuild_stale_versions)
    run_id, catalog = run_flow("run", "flows.pipeline", "pipeline", params, store), Catalog(store)
    _print_table(f"{cfg.name} (run {run_id})",
                 comparison_table(catalog, run_entries(catalog, run_id)).to_dict("records"))
    reused = catalog.query("SELECT stage, label FROM run_stages WHERE run_id = ? AND state = 'Cached' "
                           "ORDER BY position", [run_id])
    if reused:
        console.print(f"resumed {len(reused)} stage(s) from the store: "
                      + ", ".join(f"{r['stage']}[{r['label']}]" if r["label"] else r["stage"] for r in reused))
    stale = catalog.query("SELECT stage, label, key, version_changes FROM run_stages WHERE run_id = ? "
                          "AND state = 'Cached' AND version_changes IS NOT NULL ORDER BY position", [run_id])
    if stale:
        _print_table("cached artifacts built with other library versions (--rebuild-stale-versions rebuilds them)",
                     stale)
    console.print(f"artifacts in {store.url}; query them with `embforge sql` or DuckDB")
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    store = open_store(args.store, load_config(args.config).store)
    try:
        params = SelectParams(config=args.config, corpus=args.corpus, qrels=args.qrels, budget=args.budget,
                              recipes=args.recipes or [], out=args.out, overrides=overrides(args.set), store=store.url)
    except ValidationError as e:  # as the UI's form would refuse it
        said = "; ".join(f"--{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(said) from None
    cfg = load_config(params.config, params.changes())  # a bad corpus path, budget or recipe: exit 2 before Prefect
    run_id = run_flow("select", "flows.select", "select", params, store)
    from flows.select import outcome_lines

    console.print(outcome_lines(store, run_id, cfg), highlight=False)
    return 0


# The latest scores of every model (label) per dataset that passes the filters.
FILTERED_ENTRIES_SQL = f"""
WITH stages AS (
    SELECT rs.*, (SELECT any_value(m.dataset) FROM run_stages e JOIN metrics m ON m.key = e.key
                  WHERE e.run_id = rs.run_id AND e.stage = 'evaluate') AS dataset
    FROM run_stages rs WHERE rs.stage IN {SCORE_STAGES})
SELECT label, dataset, method, key FROM stages
WHERE ($since IS NULL OR started_at >= $since::TIMESTAMP) AND ($method IS NULL OR method = $method)
  AND ($dataset IS NULL OR dataset = $dataset)
QUALIFY dense_rank() OVER (PARTITION BY label, dataset ORDER BY started_at DESC) = 1
ORDER BY started_at, position"""


def iso_time(text: str) -> datetime:
    """`--since`: a date or an ISO timestamp, as UTC without a zone like the runs' `started_at`."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD) or an ISO timestamp") from None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def filtered_entries(catalog: Catalog, dataset: str | None, method: str | None,
                     since: datetime | None) -> list[dict]:
    rows = catalog.con.execute(FILTERED_ENTRIES_SQL, dict(dataset=dataset, method=method, since=since)).df()
    if rows["dataset"].nunique() > 1:  # the same method name on two corpora is two models
        rows["label"] = rows["label"] + " (" + rows["dataset"].fillna("?") + ")"
    return rows[["label", "method", "key"]].to_dict("records")


def cmd_report(args: argparse.Namespace) -> int:
    catalog = Catalog(_store(args))
    if args.dataset or args.method or args.since:
        if args.run:
            console.print("[bold red]error:[/bold red] --run cannot be combined with filters")
            return 2
        run_id, entries = None, filtered_entries(catalog, args.dataset, args.method, args.since)
        title = "latest scores matching the filters"
    else:
        run_id = args.run or catalog.latest_run_id()
        if run_id is None:
            console.print("no runs in this store yet: `embforge run CONFIG` first")
            return 1
        title, entries = f"run {run_id}", run_entries(catalog, run_id)
    if not entries:
        console.print("no scores match")
        return 1
    paired = paired_differences(catalog, entries)
    if args.json:  # each line's `kind`: a score, or a paired difference of two models (as paired.parquet)
        scores = long_rows(catalog, entries).drop(columns=["ord"]).assign(kind="score", run_id=run_id)
        for row in scores.to_dict("records") + paired.assign(kind="paired", run_id=run_id).to_dict("records"):
            print(json.dumps({k: (None if v != v else v) for k, v in row.items()}, default=str))
    elif args.markdown:
        print(to_markdown(title, comparison_table(catalog, entries), notes(catalog, entries), paired=paired), end="")
    else:
        _print_table(title, comparison_table(catalog, entries).to_dict("records"))
        for line in notes(catalog, entries) + paired_lines(paired):
            console.print(line, highlight=False)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    rows = Catalog(_store(args)).query("""
        SELECT r.run_id, r.name, r.status, r.started_at, r.finished_at,
               count(s.stage) FILTER (WHERE s.state = 'Cached') AS cached,
               count(s.stage) FILTER (WHERE s.state = 'Completed') AS computed
        FROM runs r LEFT JOIN run_stages s USING (run_id)
        GROUP BY ALL ORDER BY r.started_at DESC""")
    _print_table("runs", rows)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    _print_table("registered models (what the evaluate and nightly deployments score)", Catalog(_store(args)).query(
        "SELECT label, method, coalesce(artifact, external) AS model, pooling, experiment, registered_at "
        "FROM models ORDER BY registered_at"))
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from flows import server

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/yellow] the Prefect API has no authentication; {args.host} "
                      "exposes it beyond this machine")
    then = cmd_deploy if args.pool else cmd_serve
    return server.run_server(args.host, args.port, args.database, lambda: then(args), keep_up=bool(args.pool))


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


def cmd_artifacts(args: argparse.Namespace) -> int:
    where = "WHERE stage = ?" if args.stage else ""
    rows = Catalog(_store(args)).query(
        f"SELECT stage, key, inputs, rows, created_at, wall_s, path FROM artifacts {where} ORDER BY created_at",
        [args.stage] if args.stage else None)
    _print_table("artifacts", rows)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every finished artifact's files against the sizes and SHA-256 digests in its manifest;
    one that fails is set aside (damaged/), so the next run rebuilds it."""
    store = _store(args)
    if not store.fs.isdir(store.location("artifacts")):
        raise FileNotFoundError(f"no artifacts in {store.url}: is it the store? (--store, EMBFORGE_STORE)")
    refs, damaged, unverifiable = store.artifacts(args.stage), [], 0
    for ref in track(refs, description="verifying", console=console, transient=True):
        if found := store.problems(ref, digests=True):
            store.set_aside(ref, "; ".join(found))
            damaged.append(dict(artifact=ref.address, problem="; ".join(found)))
        unverifiable += store.published_files(ref) is None and not found
    if damaged:
        _print_table("damaged artifacts, set aside to damaged/ (the next run rebuilds them)", damaged)
        return 1
    console.print(f"{len(refs) - unverifiable} artifact(s) verified: every file has the size and SHA-256 its "
                  "manifest records" + (f"; {unverifiable} made before digests were recorded: their files are "
                                        "there, their contents cannot be checked" if unverifiable else ""))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tasks.export import export_model, push_to_hub

    variants = [name + ("-int8" if quantized else "") for name in ("onnx", "openvino") if getattr(args, name)
                for quantized in ([False, True] if args.quantize else [False])]
    if args.quantize and not variants:
        console.print("[bold red]error:[/bold red] --quantize goes with --onnx and/or --openvino")
        return 2
    model = export_model(Catalog(_store(args)), args.model, args.to, variants, args.push_to_hub)
    _print_table(f"{model.label} ({model.ref.address}) exported to {args.to}", [
        dict(score=s["metric"], dataset=s["dataset"], value=round(s["value"], 4),
             sd=None if s["std"] is None else round(s["std"], 4)) for s in model.scores])
    if model.backend_sts:
        _print_table("STS-B Spearman per backend", [
            dict(backend=name, spearman=round(v, 4), change=f"{v - model.backend_sts['torch']:+.4f}")
            for name, v in model.backend_sts.items()])
    if args.push_to_hub:
        console.print(f"pushed to the Hub: {push_to_hub(args.to, args.push_to_hub, args.private)}", highlight=False)
    return 0


def cmd_mteb_results(args: argparse.Namespace) -> int:
    from tasks.mteb import collect_results

    copied = collect_results(_store(args), args.to)
    console.print(f"{copied} MTEB task result(s) in {args.to}; read them with "
                  f"mteb.ResultCache({str(args.to)!r}).load_results()", highlight=False)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    try:
        rows = Catalog(_store(args)).query(args.query)
    except (duckdb.Error, QueryError) as e:  # a typo in the user's query, or a write, is not a crash
        console.print(f"[bold red]error:[/bold red] {str(e).splitlines()[0]}", highlight=False)
        return 2
    _print_table(args.query, rows)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="embforge", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help: str, config: str | None = "option") -> argparse.ArgumentParser:
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

    run = add("run", cmd_run, "run an experiment config through the pipeline flow", config="positional")
    run.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                     help="change a config field for this run, e.g. --set train.epochs=2 --set "
                     "methods.0.train.lr=1e-4 (YAML values, checked like the file; repeatable)")
    run.add_argument("--rebuild-stale-versions", action="store_true",
                     help=RunParams.model_fields["rebuild_stale_versions"].description)
    select = add("select", cmd_select, "pick the recipe for a corpus on a held-out yardstick, train the winner "
                 "and export it (docs/select.md)", config=None)
    select.add_argument("corpus", nargs="?", help=SelectParams.model_fields["corpus"].description)
    select.add_argument("--config", default=str(DEFAULT_SELECT), help="defaults to start from (default: "
                        "configs/select.yaml)")
    select.add_argument("--qrels", metavar="FILE", help=SelectParams.model_fields["qrels"].description)
    select.add_argument("--budget", type=int, help="training steps of the winner (default: the config's "
                        "select.budget)")
    select.add_argument("--recipes", nargs="+", metavar="RECIPE", help="candidate recipes (default: the config's)")
    select.add_argument("--out", help="folder to export the chosen model to (default: selected/<the corpus's name>)")
    select.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field, e.g. --set select.lrs=[3e-5]")
    report = add("report", cmd_report, "show the task × model table of a run, or of the latest scores "
                 "matching filters")
    report.add_argument("--run", help="run id (default: the latest run)")
    report.add_argument("--json", action="store_true", help="one JSON object per score and model")
    report.add_argument("--markdown", action="store_true", help="the table as Markdown")
    report.add_argument("--dataset", help="latest scores of every model evaluated on this dataset")
    report.add_argument("--method", help="... trained with this recipe (none = base, reference = yardsticks)")
    report.add_argument("--since", type=iso_time,
                        help="... from runs started on or after this date (YYYY-MM-DD, or an ISO timestamp)")
    add("runs", cmd_runs, "list pipeline runs")
    artifacts = add("artifacts", cmd_artifacts, "list finished artifacts")
    artifacts.add_argument("--stage", help="only this stage (ingest, sentences, pairs, train, ...)")
    add("models", cmd_models, "list registered models")
    verify = add("verify", cmd_verify, "check every artifact's files against the sizes and digests in its "
                 "manifest; set aside what fails (exit 1), so the next run rebuilds it")
    verify.add_argument("--stage", help="only this stage's artifacts")
    for name, fn, help in (
            ("server", cmd_server, "start a local Prefect server with its UI and serve embforge's deployments"),
            ("serve", cmd_serve, "serve embforge's deployments against the Prefect server at PREFECT_API_URL"),
            ("deploy", cmd_deploy, "register embforge's deployments on a work pool of the Prefect server at "
             "PREFECT_API_URL; `prefect worker start --pool NAME` runs them")):
        sp = add(name, fn, help, config=None)
        if name == "server":
            sp.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
            sp.add_argument("--port", type=int, default=4200, help="port of the UI and API (default 4200)")
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
    export = add("export", cmd_export, "write a trained model as a sentence-transformers folder with a model card "
                 "made from the store (recipe, corpus, training, every score); optionally ONNX/OpenVINO files and "
                 "a push to the Hugging Face Hub")
    export.add_argument("model", help="a label from `embforge models` (its latest registration) or an artifact "
                        "address (train/<key>)")
    export.add_argument("--to", required=True, type=Path, help="folder to create (must not hold anything)")
    export.add_argument("--onnx", action="store_true", help="add onnx/model.onnx (SentenceTransformer(path, "
                        "backend='onnx'))")
    export.add_argument("--openvino", action="store_true", help="add openvino/openvino_model.xml "
                        "(backend='openvino')")
    export.add_argument("--quantize", action="store_true", help="also int8 variants of the backends asked "
                        "(onnx/model_qint8.onnx, openvino/openvino_model_qint8.xml)")
    export.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this Hub model repo "
                        "(org/name; HF_TOKEN or `hf auth login` gives the credentials)")
    export.add_argument("--private", action="store_true", help="with --push-to-hub: a private repo")
    mteb_results = add("mteb-results", cmd_mteb_results, "copy every MTEB score's result file, in mteb's format, "
                       "into a folder that mteb.ResultCache reads")
    mteb_results.add_argument("--to", required=True, type=Path, help="the ResultCache folder")
    sql = add("sql", cmd_sql, "run a SELECT query on the catalog views (runs, run_stages, artifacts, "
              "metrics, run_metrics); it reads nothing outside the store and writes nothing")
    sql.add_argument("query")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with stopping.stop_on_signals():
        return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """The command, its errors said in one line, a signal's stop too."""
    try:
        return args.fn(args)
    except (*INPUT_ERRORS, FileNotFoundError, NotADirectoryError) as e:
        console.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        return 2
    except (OSError, OutsideFault) as e:
        if (said := str(e) if isinstance(e, OutsideFault) else disk_fault(e)) is None:
            raise
        console.print(f"[bold red]error:[/bold red] {said}", highlight=False)  # a run's log has the traceback
        return 1 if isinstance(e, OutsideFault) else 2  # a full or read-only disk fails until the user acts
    except KeyboardInterrupt as e:
        signum = getattr(e, "signal", signal.SIGINT)
        console.print(f"stopped by {signum.name}: every finished stage is in the store; the same command resumes "
                      "from it", highlight=False)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
