"""Report: DuckDB queries over the catalog's metrics give the papers' comparison tables.

Models are columns and tasks are rows: first the in-domain scores (kNN accuracy, STS, geometry),
then the MTEB tasks grouped by type with the block means and the average of block means (the
cropping paper's headline) at the bottom. The same queries serve the pipeline's report stage
(models named by the run's config) and `embforge report` (models picked from the catalog), so
both always agree with the catalog. Output: `report.parquet` (one row per model and score, the
long form), `report.md` (tables and pictures) and the combined layer-wise and learning curves.
"""

from __future__ import annotations

import logging
import posixpath
import re

import pandas as pd
import pyarrow as pa
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import model_validator

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore, ArtifactWriter
from storage.stores import store_at
from tasks.config.base import Section
from tasks.core.stage import Inputs, Stage
from tasks.evaluate import CURVES, PICTURES
from tasks.reporting import plots

LEGEND = {
    "knn_accuracy": "kNN accuracy (k=10, Euclidean, raw embeddings with the model's pooling) on the "
    "paper's 90/10 split (seed 42)",
    "knn_accuracy_splits": "the same over repeated random 90/10 splits: mean ± standard deviation",
    "knn_n": "labelled test documents per split",
    "sts_spearman": "STS Spearman correlation of cosine similarity with the human scores",
    "alignment": "mean squared distance of normalised embeddings of STS pairs scored ≥ 4 (lower: positives closer)",
    "uniformity": "log E exp(−2‖x−y‖²) over random pairs of normalised document embeddings (lower: more uniform)",
    "mean_cosine": "mean cosine similarity of random document pairs (anisotropy; 0 = isotropic)",
    "top1_pc_variance": "share of the variance of the centred document embeddings on the top principal "
    "component (anisotropy; ≈ 1/dim when isotropic)",
    "top10_pc_variance": "the same for the top 10 components",
    "semantic_rank_title_abstract": "SemCSE's semantic benchmark: average rank (1 = best, cosine) of a paper's "
    "abstract among all abstracts for its title",
    "semantic_rank_halves": "the same for the second half of an abstract given its first half",
    "semantic_rank_summary_paper": "the same for the paper's abstract given one of its LLM summaries (only "
    "papers that have summaries are candidates)",
    "semantic_same_label_5nn": "share of a labelled document's 5 nearest other documents (cosine) with its label",
}

# Long form: one row per (model, score), models in the order given by `entries`.
LONG_SQL = """
SELECT e.ord, e.label AS model, e.method, m.* EXCLUDE (key), e.key AS score_key
FROM entries e JOIN metrics m ON m.key = e.key
ORDER BY e.ord, m.dataset, m.metric, m.layer, m.pooling, m.step"""

# The queries below read `scores`: LONG_SQL's rows, materialised once per table (see `_load`).
IN_DOMAIN_SQL = f"""
SELECT ord, model, dataset, metric, value, std, n FROM scores
WHERE dataset <> 'mteb' AND metric NOT IN {CURVES}"""

# One score per (model, task): the mean over the task's subsets and splits, as MTEB averages them.
TASK_SQL = """
SELECT ord, model, task_type, metric AS task, any_value(main_score) AS main_score, avg(value) AS value,
       bool_and(status = 'ok') AS ok, any_value(note) AS note
FROM scores WHERE dataset = 'mteb' GROUP BY ALL"""

BLOCK_SQL = f"""
SELECT ord, model, task_type AS block, avg(value) AS value, count(*) AS tasks
FROM ({TASK_SQL}) WHERE ok GROUP BY ALL"""

AVERAGE_SQL = f"""
SELECT ord, model, avg(value) AS value, string_agg(block, ', ' ORDER BY block) AS blocks
FROM ({BLOCK_SQL}) GROUP BY ALL"""

CURVE_SQL = f"SELECT model, metric, layer, pooling, step, value FROM scores WHERE metric IN {CURVES}"


class ReportEntry(Section):
    label: str
    method: str


class ReportJob(Section):
    title: str
    entries: list[ReportEntry]

    @model_validator(mode="after")
    def _unique_labels(self) -> ReportJob:
        labels = [e.label for e in self.entries]
        if len(labels) != len(set(labels)):
            raise ValueError(f"report: model labels must be unique, got {labels}")
        return self


class ReportInputs(Inputs):
    scores: dict[str, list[ArtifactRef]]  # model label → its evaluate, semantic and mteb artifacts


def entries_for(job: ReportJob, inputs: ReportInputs) -> list[dict]:
    """One row per (model, score artifact), in the report's model order."""
    return [dict(label=entry.label, method=entry.method, key=ref.key)
            for entry in job.entries for ref in inputs.scores[entry.label]]


def _load(catalog: Catalog, entries: list[dict]) -> Catalog:
    """Materialise the entries' scores as table `scores`: the metrics view reads every metrics
    file in the store, so it is scanned once per table, not once per query."""
    models = pd.DataFrame(entries, columns=["label", "method", "key"])
    order = {label: i for i, label in enumerate(dict.fromkeys(models["label"]))}
    catalog.con.register("entries", models.assign(ord=models["label"].map(order)))
    catalog.con.execute(f"CREATE OR REPLACE TEMP TABLE scores AS {LONG_SQL}")
    return catalog


def _query(catalog: Catalog, sql: str) -> pd.DataFrame:
    return catalog.con.execute(sql).df()


def long_rows(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    return _query(_load(catalog, entries), "SELECT * FROM scores")


def _cell(value: float, std: float | None = None) -> str:
    if value is None or value != value:
        return ""
    return f"{value:.3f}" if std is None or std != std else f"{value:.3f} ± {std:.3f}"


def comparison_table(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """Tasks as rows, models as columns; MTEB block means and their average at the bottom."""
    models = list(dict.fromkeys(e["label"] for e in entries))
    rows: list[dict] = []
    catalog = _load(catalog, entries)
    scores = _query(catalog, IN_DOMAIN_SQL)
    metric_order = {m: i for i, m in enumerate(LEGEND)}
    scores = scores.assign(o=scores["metric"].map(metric_order).fillna(len(LEGEND))).sort_values(
        ["dataset", "o", "metric"])
    for (dataset, metric), group in scores.groupby(["dataset", "metric"], sort=False):
        rows.append(dict(task=f"{dataset}: {metric}", **{r.model: _cell(r.value, r.std) for r in group.itertuples()}))
        if metric == "knn_accuracy":
            rows.append(dict(task=f"{dataset}: knn_n", **{r.model: str(r.n) for r in group.itertuples()}))
    tasks = _query(catalog, TASK_SQL).sort_values(["task_type", "task"], na_position="last")
    for (task_type, mteb_task), group in tasks.groupby(["task_type", "task"], sort=False, dropna=False):
        main = group["main_score"].dropna()
        name = f"{task_type or 'mteb'}: {mteb_task}" + (f" ({main.iloc[0]})" if len(main) else "")
        rows.append(dict(task=name, **{r.model: _cell(r.value) if r.ok else "skipped" for r in group.itertuples()}))
    for block, group in _query(catalog, BLOCK_SQL).groupby("block"):
        n = int(group["tasks"].max())
        rows.append(dict(task=f"block mean: {block} ({n} task{'' if n == 1 else 's'})",
                         **{r.model: _cell(r.value) for r in group.itertuples()}))
    for blocks, group in _query(catalog, AVERAGE_SQL).groupby("blocks"):
        rows.append(dict(task=f"average of block means ({blocks})",
                         **{r.model: _cell(r.value) for r in group.itertuples()}))
    return pd.DataFrame(rows, columns=["task", *models]).fillna("")


def skipped_notes(catalog: Catalog, entries: list[dict]) -> list[str]:
    tasks = _query(_load(catalog, entries), TASK_SQL)
    skipped = tasks[~tasks["ok"].astype(bool)].drop_duplicates("task")
    return [f"skipped: {r.task}: {r.note}" for r in skipped.itertuples()]


def to_markdown(title: str, table: pd.DataFrame, notes: list[str] = (), pictures: list[tuple[str, str]] = ()) -> str:
    cols = list(table.columns)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    shown = " ".join(table["task"])
    lines += ["", *[f"- **{m}**: {text}" for m, text in LEGEND.items() if m in shown]]
    lines += [f"- {note}" for note in notes]
    lines += [line for caption, path in pictures for line in ("", f"![{caption}]({path})")]
    return "\n".join(lines) + "\n"


def draw_curves(catalog: Catalog, entries: list[dict], out: ArtifactWriter, title: str) -> list[tuple[str, str]]:
    """Every model's layer-wise and learning curves in one picture each."""
    curves, pictures = _query(_load(catalog, entries), CURVE_SQL), []
    layerwise = curves[curves["metric"] == "knn_accuracy_layerwise"]
    if len(layerwise):
        plots.layerwise_png(layerwise, out.folder / PICTURES["layerwise"], f"kNN accuracy per layer: {title}")
        pictures.append(("kNN accuracy per hidden layer", PICTURES["layerwise"]))
    learning = curves[curves["metric"] == "knn_accuracy_curve"]
    if len(learning):
        plots.learning_curve_png(learning, out.folder / PICTURES["learning_curve"], f"Learning curves: {title}")
        pictures.append(("kNN accuracy during training", PICTURES["learning_curve"]))
    return pictures


def tsne_pictures(store: ArtifactStore, entries: list[dict], report: ArtifactRef) -> list[tuple[str, str]]:
    """Links, relative to the report's folder, to each model's t-SNE map, named as its picture is."""
    found = []
    for e in entries:
        scores = ArtifactRef("evaluate", e["key"])
        if (store.path(scores) / PICTURES["tsne"]).is_file():
            mapped = store.manifest(scores)["extra"].get("tsne")  # absent in artifacts of older versions
            name = plots.tsne_name(**mapped) if mapped else "t-SNE"
            found.append((f"{name}: {e['label']}", store.link(report, scores, PICTURES["tsne"])))
    return found


def build_report(store: ArtifactStore, job: ReportJob, inputs: ReportInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    entries = entries_for(job, inputs)
    catalog = Catalog(store)
    out.write_table("report", pa.Table.from_pandas(long_rows(catalog, entries), preserve_index=False))
    pictures = draw_curves(catalog, entries, out, job.title) + tsne_pictures(store, entries, ref)
    markdown = to_markdown(job.title, comparison_table(catalog, entries), skipped_notes(catalog, entries), pictures)
    out.write_text("report.md", markdown)
    log.info("\n%s", markdown)


REPORT = Stage("report", build_report)


@task(name="publish-report")
def publish_report(store_root: str, report: ArtifactRef) -> None:
    """Show the report in the Prefect UI (cheap, so never cached: every run gets its artifacts)."""
    store = store_at(store_root)
    rows = store.read_table(report, "report").to_pandas()
    rows = rows[~rows["metric"].isin(CURVES)]  # the curves are pictures in the report
    table = rows[["model", "method", "dataset", "metric", "value", "std", "n", "layer", "pooling", "status"]]
    create_table_artifact(table=table.astype(object).where(table.notna(), None).to_dict("records"),
                          key="embforge-metrics", description="Metrics of this run's models")
    # The UI cannot open files relative to the report's folder: name pictures by their place in the store.
    folder = store.path(report).relative_to(store.root).as_posix()
    markdown = re.sub(r"\]\((?!https?:)([^)]+\.png)\)",
                      lambda m: f"]({posixpath.normpath(posixpath.join(folder, m.group(1)))})",
                      (store.path(report) / "report.md").read_text())
    create_markdown_artifact(markdown=markdown + "\nPictures and Parquet files are in the artifact store "
                                      f"under `{folder}`.\n",
                             key="embforge-report", description="Task × model report")
