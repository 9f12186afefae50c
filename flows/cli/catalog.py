"""The commands that read the store: `report`, `runs`, `artifacts`, `models`, `verify`, `export`, `mteb-results` and
`sql`."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import duckdb
from rich.progress import track

from flows.cli.common import add_command, command_store, console, error, print_table, run_entries, say
from storage.catalog import SCORE_STAGES, Catalog, QueryError
from tasks.reporting.tables import comparison_table, long_rows, notes, paired_differences, paired_lines, to_markdown

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
    catalog = Catalog(command_store(args))
    if args.dataset or args.method or args.since:
        if args.run:
            error("--run cannot be combined with filters")
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
        print_table(title, comparison_table(catalog, entries).to_dict("records"))
        for line in notes(catalog, entries) + paired_lines(paired):
            say(line)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    rows = Catalog(command_store(args)).query("""
        SELECT r.run_id, r.name, r.status, r.started_at, r.finished_at,
               count(s.stage) FILTER (WHERE s.state = 'Cached') AS cached,
               count(s.stage) FILTER (WHERE s.state = 'Completed') AS computed
        FROM runs r LEFT JOIN run_stages s USING (run_id)
        GROUP BY ALL ORDER BY r.started_at DESC""")
    print_table("runs", rows)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    rows = Catalog(command_store(args)).query(
        "SELECT label, method, coalesce(artifact, external) AS model, pooling, experiment, registered_at "
        "FROM models ORDER BY registered_at")
    print_table("registered models (what the evaluate and nightly deployments score)", rows)
    return 0


def cmd_artifacts(args: argparse.Namespace) -> int:
    where = "WHERE stage = ?" if args.stage else ""
    rows = Catalog(command_store(args)).query(
        f"SELECT stage, key, inputs, rows, created_at, wall_s, path FROM artifacts {where} ORDER BY created_at",
        [args.stage] if args.stage else None)
    print_table("artifacts", rows)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every finished artifact's files against the sizes and SHA-256 digests in its manifest;
    one that fails is set aside (damaged/), so the next run rebuilds it."""
    store = command_store(args)
    if not store.fs.isdir(store.location("artifacts")):
        raise FileNotFoundError(f"no artifacts in {store.url}: is it the store? (--store, EMBFORGE_STORE)")
    refs, damaged, unverifiable = store.artifacts(args.stage), [], 0
    for ref in track(refs, description="verifying", console=console, transient=True):
        if found := store.problems(ref, digests=True):
            store.set_aside(ref, "; ".join(found))
            damaged.append(dict(artifact=ref.address, problem="; ".join(found)))
        unverifiable += store.published_files(ref) is None and not found
    if damaged:
        print_table("damaged artifacts, set aside to damaged/ (the next run rebuilds them)", damaged)
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
        error("--quantize goes with --onnx and/or --openvino")
        return 2
    model = export_model(Catalog(command_store(args)), args.model, args.to, variants, args.push_to_hub)
    print_table(f"{model.label} ({model.ref.address}) exported to {args.to}", [
        dict(score=s["metric"], dataset=s["dataset"], value=round(s["value"], 4),
             sd=None if s["std"] is None else round(s["std"], 4)) for s in model.scores])
    if model.backend_sts:
        print_table("STS-B Spearman per backend", [
            dict(backend=name, spearman=round(v, 4), change=f"{v - model.backend_sts['torch']:+.4f}")
            for name, v in model.backend_sts.items()])
    if args.push_to_hub:
        say(f"pushed to the Hub: {push_to_hub(args.to, args.push_to_hub, args.private)}")
    return 0


def cmd_mteb_results(args: argparse.Namespace) -> int:
    from tasks.mteb import collect_results

    copied = collect_results(command_store(args), args.to)
    say(f"{copied} MTEB task result(s) in {args.to}; read them with mteb.ResultCache({str(args.to)!r}).load_results()")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    try:
        rows = Catalog(command_store(args)).query(args.query)
    except (duckdb.Error, QueryError) as e:  # a typo in the user's query, or a write, is not a crash
        error(str(e).splitlines()[0])
        return 2
    print_table(args.query, rows)
    return 0


def add_report(sub: argparse._SubParsersAction) -> None:
    report = add_command(sub, "report", cmd_report, "show the task × model table of a run, or of the latest scores "
                         "matching filters")
    report.add_argument("--run", help="run id (default: the latest run)")
    report.add_argument("--json", action="store_true", help="one JSON object per score and model")
    report.add_argument("--markdown", action="store_true", help="the table as Markdown")
    report.add_argument("--dataset", help="latest scores of every model evaluated on this dataset")
    report.add_argument("--method", help="... trained with this recipe (none = base, reference = yardsticks)")
    report.add_argument("--since", type=iso_time,
                        help="... from runs started on or after this date (YYYY-MM-DD, or an ISO timestamp)")


def add_artifacts(sub: argparse._SubParsersAction) -> None:
    artifacts = add_command(sub, "artifacts", cmd_artifacts, "list finished artifacts")
    artifacts.add_argument("--stage", help="only this stage (ingest, sentences, pairs, train, ...)")


def add_verify(sub: argparse._SubParsersAction) -> None:
    verify = add_command(sub, "verify", cmd_verify, "check every artifact's files against the sizes and digests in "
                         "its manifest; set aside what fails (exit 1), so the next run rebuilds it")
    verify.add_argument("--stage", help="only this stage's artifacts")


def add_export(sub: argparse._SubParsersAction) -> None:
    export = add_command(sub, "export", cmd_export, "write a trained model as a sentence-transformers folder with a "
                         "model card made from the store (recipe, corpus, training, every score); optionally "
                         "ONNX/OpenVINO files and a push to the Hugging Face Hub")
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


def add_mteb_results(sub: argparse._SubParsersAction) -> None:
    mteb_results = add_command(sub, "mteb-results", cmd_mteb_results, "copy every MTEB score's result file, in "
                               "mteb's format, into a folder that mteb.ResultCache reads")
    mteb_results.add_argument("--to", required=True, type=Path, help="the ResultCache folder")


def add_sql(sub: argparse._SubParsersAction) -> None:
    sql = add_command(sub, "sql", cmd_sql, "run a SELECT query on the catalog views (runs, run_stages, artifacts, "
                      "metrics, run_metrics); it reads nothing outside the store and writes nothing")
    sql.add_argument("query")


COMMANDS = {"report": add_report,
            "runs": lambda sub: add_command(sub, "runs", cmd_runs, "list pipeline runs"),
            "artifacts": add_artifacts,
            "models": lambda sub: add_command(sub, "models", cmd_models, "list registered models"),
            "verify": add_verify, "export": add_export, "mteb-results": add_mteb_results, "sql": add_sql}
