"""Report: the papers' comparison tables (built by tasks/reporting/tables.py) and pictures.

Models are columns and tasks are rows: first the in-domain scores (kNN accuracy, STS, geometry),
then the MTEB tasks grouped by type with the block means and the average of block means (the
cropping paper's headline) at the bottom. The same queries serve the pipeline's report stage
(models named by the run's config) and `embforge report` (models picked from the catalog), so
both always agree with the catalog. Output: `report.parquet` (one row per model and score, the
long form), `paired.parquet` (each model's kNN accuracy minus each earlier model's, paired over the
same splits, with its 95% interval), `report.md` (tables, paired differences and pictures) and the
combined layer-wise and learning curves, and with sweeps kNN accuracy against each swept value.
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
from storage.catalog import PAIRED, Catalog
from storage.store import ArtifactStore, ArtifactWriter
from storage.stores import store_at
from tasks.config.base import Section
from tasks.core.stage import Inputs, Stage
from tasks.reporting import plots
from tasks.reporting.plots import PICTURES
from tasks.reporting.serving import serving_table
from tasks.reporting.tables import (
    POINTS,
    beside_teacher,
    comparison_table,
    curve_rows,
    long_rows,
    notes,
    paired_differences,
    to_markdown,
)


class ReportEntry(Section):
    label: str
    method: str
    swept: dict = {}  # {field: value} of a method made by a sweep (tasks/config/training.py, expand_sweeps)
    teacher: str | None = None  # a static model's: the label of the model it was distilled from


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
    latency: ArtifactRef | None = None  # the models' CPU query latency side by side (tasks/latency.py)


def entries_for(job: ReportJob, inputs: ReportInputs) -> list[dict]:
    """One row per (model, score artifact), in the report's model order."""
    return [dict(label=entry.label, method=entry.method, key=ref.key)
            for entry in job.entries for ref in inputs.scores[entry.label]]


def draw_curves(catalog: Catalog, entries: list[dict], out: ArtifactWriter, title: str) -> list[tuple[str, str]]:
    """Every model's layer-wise and learning curves in one picture each."""
    curves, pictures = curve_rows(catalog, entries), []
    layerwise = curves[curves["metric"] == "knn_accuracy_layerwise"]
    if len(layerwise):
        plots.layerwise_png(layerwise, out.folder / PICTURES["layerwise"], f"kNN accuracy per layer: {title}")
        pictures.append(("kNN accuracy per hidden layer", PICTURES["layerwise"]))
    learning = curves[curves["metric"] == "knn_accuracy_curve"]
    if len(learning):
        plots.learning_curve_png(learning, out.folder / PICTURES["learning_curve"], f"Learning curves: {title}")
        pictures.append(("kNN accuracy during training", PICTURES["learning_curve"]))
    return pictures


def sweep_pictures(long: pd.DataFrame, job: ReportJob, out: ArtifactWriter) -> list[tuple[str, str]]:
    """kNN accuracy against each swept numeric field (the paper's Figure S1), a line per sweep of one
    field; `long`: the report's long rows."""
    knn = long[long["metric"] == "knn_accuracy_splits"].set_index("model")
    points = [dict(field=field, sweep=e.label.removesuffix(f"-{field}-{value}"), value_swept=float(value),
                   value=knn.loc[e.label, "value"], std=knn.loc[e.label, "std"])
              for e in job.entries if len(e.swept) == 1 and e.label in knn.index for field, value in e.swept.items()
              if isinstance(value, int | float) and not isinstance(value, bool)]
    pictures = []
    frames = pd.DataFrame(points, columns=["field", "sweep", "value_swept", "value", "std"])
    for field, frame in frames.groupby("field"):
        name = f"sweep_{field}.png"
        plots.sweep_png(frame, field, out.folder / name, f"kNN accuracy against {field}: {job.title}")
        pictures.append((f"kNN accuracy against {field} (mean ± std over the repeated splits)", name))
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
    long = long_rows(catalog, entries)
    out.write_table("report", pa.Table.from_pandas(long, preserve_index=False))
    pictures = (draw_curves(catalog, entries, out, job.title) + sweep_pictures(long, job, out)
                + tsne_pictures(store, entries, ref))
    paired = paired_differences(catalog, entries)
    out.write_table(PAIRED, pa.Table.from_pandas(paired, preserve_index=False))
    labels = {e.label for e in job.entries}
    beside = [beside_teacher(long, e.label, e.teacher) for e in job.entries if e.teacher in labels]
    markdown = to_markdown(job.title, comparison_table(catalog, entries), notes(catalog, entries), pictures,
                           paired, beside, serving_table(catalog, entries, inputs.latency))
    out.write_text("report.md", markdown)
    log.info("\n%s", markdown)


REPORT = Stage("report", build_report)


@task(name="publish-report")
def publish_report(store_root: str, report: ArtifactRef) -> None:
    """Show the report in the Prefect UI (cheap, so never cached: every run gets its artifacts)."""
    store = store_at(store_root)
    rows = store.read_table(report, "report").to_pandas()
    rows = rows[~rows["metric"].isin(POINTS)]  # the curves are pictures in the report, the splits are paired
    table = rows[["model", "method", "dataset", "metric", "value", "std", "n", "layer", "pooling", "status"]]
    create_table_artifact(table=table.astype(object).where(table.notna(), None).to_dict("records"),
                          key="embforge-metrics", description="Metrics of this run's models")
    create_markdown_artifact(markdown=markdown_for_ui(store, report, "report.md"), key="embforge-report",
                             description="Task × model report")


def markdown_for_ui(store: ArtifactStore, ref: ArtifactRef, name: str) -> str:
    """An artifact's Markdown file as the Prefect UI shows it: it cannot open files relative to the artifact's
    folder, so pictures are named by their place in the store."""
    folder = store.path(ref).relative_to(store.root).as_posix()
    markdown = re.sub(r"\]\((?!https?:)([^)]+\.png)\)",
                      lambda m: f"]({posixpath.normpath(posixpath.join(folder, m.group(1)))})",
                      (store.path(ref) / name).read_text())
    return markdown + f"\nPictures and Parquet files are in the artifact store under `{folder}`.\n"
