"""Report: one DuckDB query over the catalog's metrics gives the model × metric table.

The same query serves the pipeline's report stage (models named by the run's config) and
`embforge report` (models named by a past run's record), so both always agree with the catalog.
Output: `report.parquet` (one row per model and metric, the long form) and `report.md`.
"""

from __future__ import annotations

import logging
import sys

import pandas as pd
import pyarrow as pa

from storage import ArtifactRef, ArtifactStore, Catalog
from storage.store import ArtifactWriter
from tasks.config import Section
from tasks.stage import Stage

LEGEND = {
    "knn_accuracy": "kNN accuracy (k=10, Euclidean, raw mean-pooled embeddings) on the paper's "
    "90/10 split (seed 42)",
    "knn_accuracy_splits": "the same over repeated random 90/10 splits: mean ± standard deviation",
    "knn_n": "labelled test documents per split",
    "sts_spearman": "STS Spearman correlation of cosine similarity with the human scores",
}

# Long form: one row per (model, metric), models in the order given by `entries`.
LONG_SQL = """
SELECT e.ord, e.label AS model, e.method, m.dataset, m.metric, m.value, m.std, m.n, m.repeats,
       m.split, m.model AS model_source, e.key AS eval_key
FROM entries e JOIN metrics m ON m.key = e.key
ORDER BY e.ord, m.metric"""

# Wide form for people: models as rows, metrics as columns, spread next to each value.
WIDE_SQL = f"""
PIVOT (
    SELECT ord, model, method, dataset, metric,
           CASE WHEN std IS NULL THEN printf('%.3f', value) ELSE printf('%.3f ± %.3f', value, std) END AS cell
    FROM ({LONG_SQL})
    UNION ALL
    SELECT ord, model, method, dataset, 'knn_n', n::VARCHAR FROM ({LONG_SQL}) WHERE metric = 'knn_accuracy'
) ON metric USING first(cell) GROUP BY ord, model, method, dataset ORDER BY ord"""


class ReportEntry(Section):
    label: str
    method: str


class ReportJob(Section):
    title: str
    entries: list[ReportEntry]  # one per evaluate input, same order


def _with_entries(catalog: Catalog, entries: list[dict]) -> Catalog:
    frame = pd.DataFrame(entries, columns=["label", "method", "key"]).reset_index(names="ord")
    catalog.con.register("entries", frame)
    return catalog


def long_rows(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    return _with_entries(catalog, entries).con.execute(LONG_SQL).df()


def wide_table(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    wide = _with_entries(catalog, entries).con.execute(WIDE_SQL).df().drop(columns="ord")
    metrics = [m for m in LEGEND if m in wide.columns] + sorted(set(wide.columns) - set(LEGEND) -
                                                                {"model", "method", "dataset"})
    return wide[["model", "method", "dataset", *metrics]].fillna("")


def to_markdown(title: str, wide: pd.DataFrame) -> str:
    cols = list(wide.columns)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in wide.itertuples(index=False)]
    lines += ["", *[f"- **{m}**: {text}" for m, text in LEGEND.items() if m in cols]]
    return "\n".join(lines) + "\n"


def build_report(store: ArtifactStore, job: ReportJob, inputs: list[ArtifactRef],
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    entries = [dict(label=e.label, method=e.method, key=i.key) for e, i in zip(job.entries, inputs)]
    catalog = Catalog(store)
    out.write_table("report", pa.Table.from_pandas(long_rows(catalog, entries), preserve_index=False))
    markdown = to_markdown(job.title, wide_table(catalog, entries))
    out.write_text("report.md", markdown)
    log.info("report:\n%s", markdown)


REPORT = Stage("report", build_report, code=(sys.modules[__name__],))
