"""The report's serving table: what a deployer weighs between the model families (tasks/evaluate.py's
serving_costs), beside the scores of tasks/reporting/tables.py."""

from __future__ import annotations

import pandas as pd

from storage.base import ArtifactRef
from storage.catalog import Catalog
from tasks.metrics.speed import LATENCY_METRIC
from tasks.reporting.tables import entries_loaded, query


def _number(value: float | None, spec: str) -> str:
    return "" if value is None or value != value else format(value, spec)


# What serving each model costs (tasks/evaluate.py's serving_costs), and a sparse model's active codes.
SERVING_SQL = """
SELECT DISTINCT e.ord, e.label AS model, a.extra->'serving'->>'family' AS family,
       (a.extra->'serving'->>'bytes_per_document')::DOUBLE AS bytes,
       (a.extra->'serving'->>'documents_per_s')::DOUBLE AS per_s,
       (a.extra->'active_dims'->>'documents')::DOUBLE AS active_documents,
       (a.extra->'active_dims'->>'queries')::DOUBLE AS active_queries,
       (a.extra->'active_dims'->>'width')::BIGINT AS width
FROM entries e JOIN artifacts a ON a.key = e.key
WHERE a.stage = 'evaluate' AND (a.extra->'serving') IS NOT NULL ORDER BY e.ord"""


def serving_table(catalog: Catalog, entries: list[dict], latency: ArtifactRef | None = None) -> pd.DataFrame:
    """Beside the scores, what a deployer weighs between the families: the index's bytes a document (uncompressed),
    the documents encoded a second, a query's CPU latency (median ms; `latency`: tasks/latency.py's artifact), and a
    sparse model's active codes. Empty where every model is dense."""
    found = query(entries_loaded(catalog, entries), SERVING_SQL)
    if (found["family"] == "dense").all():
        return pd.DataFrame()
    timed = catalog.query("SELECT model, value FROM metrics WHERE key = ? AND metric = ?",
                          [latency.key, LATENCY_METRIC]) if latency else []
    ms = {r["model"]: r["value"] for r in timed}
    active = [f"{r.active_documents:.0f} / {_number(r.active_queries, '.0f') or '–'} of {r.width:,}"
              if r.family == "sparse" else "" for r in found.itertuples()]
    return pd.DataFrame({"model": found["model"], "family": found["family"],
                         "index bytes a document": [_number(b, ",.0f") for b in found["bytes"]],
                         "documents/s": [_number(v, ",.1f") for v in found["per_s"]],
                         "query ms (CPU)": [_number(ms.get(m), ",.1f") for m in found["model"]],
                         "active codes (document / query)": active})
