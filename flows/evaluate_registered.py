"""The `evaluate` flow (also the `nightly` deployment): score every registered model on the
config's benchmark set (with the held-out generated queries where the config trains on queries),
and say what was new, what changed and by how much.

Registered models are those a run recorded (the catalog's `models` view: trained, base and
reference models) whose artifacts are still in the store. Every score is a content-addressed
artifact per (model, task, task revision, settings), so scoring again finds it Cached and computes
nothing; a new model, a new task or a new task revision is scored, and `force` scores all again.
"""

from __future__ import annotations

import pyarrow as pa
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.params import EvaluateParams
from flows.pipeline import summarize_corpus, write_queries, yardstick_of
from flows.runs import ReportedModel, open_run, recorded
from flows.scoring import Corpus, report_models
from storage.base import ArtifactRef
from storage.catalog import CHANGES_SCHEMA, SCORE_STAGES, Catalog
from storage.store import ArtifactStore
from tasks.config.base import ConfigError
from tasks.core.stage import NoInputs
from tasks.ingest import INGEST

REGISTERED_SQL = """
SELECT m.* FROM models m LEFT JOIN artifacts a ON a.stage || '/' || a.key = m.artifact
WHERE m.artifact IS NULL OR a.key IS NOT NULL  -- deleted from the store: no longer registered
QUALIFY row_number() OVER (PARTITION BY coalesce(m.artifact, m.external), m.pooling
                           ORDER BY m.registered_at DESC) = 1
ORDER BY m.registered_at, m.run_id"""


def registered_models(catalog: Catalog, wanted: list[str]) -> list[ReportedModel]:
    """The store's registered models (latest registration of each), or those named in `wanted`
    (by label or artifact). Labels shared by different models get their experiment's name, and
    then, if still shared, their artifact's key (or pooling), so the report tells them apart."""
    rows = catalog.query(REGISTERED_SQL)
    unknown = sorted(set(wanted) - {r["label"] for r in rows} - {r["artifact"] for r in rows})
    if unknown:
        raise ConfigError(f"models {unknown} are not registered in {catalog.store.url}; "
                          "see `embforge models`")
    rows = [r for r in rows if not wanted or r["label"] in wanted or r["artifact"] in wanted]
    labels = [r["label"] for r in rows]
    labels = [label if labels.count(label) == 1 else f"{label} ({r['experiment']})" for label, r in zip(labels, rows)]
    models = []
    for label, r in zip(labels, rows):
        if labels.count(label) > 1:
            label += f" [{ArtifactRef.parse(r['artifact']).key[:8] if r['artifact'] else r['pooling']}]"
        models.append(ReportedModel.registered(label, r))
    return models


# Every score in the store with its artifact's time: taken before a run, so that a score the run
# replaces (`force`) can still be compared with what it was.
SNAPSHOT_SQL = "SELECT m.*, a.created_at FROM metrics m JOIN artifacts a ON a.key = m.key"

# This run's score rows, each next to the latest score of the same model on the same metric (same
# dataset, layer, pooling, split, subset) that the store held before the run.
CHANGES_SQL = f"""
WITH scored AS (
    SELECT DISTINCT rs.label, rs.state, m.*
    FROM run_stages rs JOIN metrics m ON m.key = rs.key
    WHERE rs.run_id = $run_id AND rs.stage IN {SCORE_STAGES})
SELECT s.label, s.model, s.dataset, s.metric, s.layer, s.pooling, s.split, s.subset,
       CASE WHEN s.state = 'Cached' THEN 'unchanged' WHEN p.key IS NULL THEN 'new'
            WHEN s.value IS NOT DISTINCT FROM p.value THEN 'same' ELSE 'changed' END AS status,
       s.value, p.value AS previous, s.value - p.value AS delta, s.key, p.key AS previous_key
FROM scored s LEFT JOIN LATERAL (
    SELECT e.key, e.value FROM earlier e
    WHERE e.model = s.model AND e.metric = s.metric
      AND e.dataset IS NOT DISTINCT FROM s.dataset AND e.layer IS NOT DISTINCT FROM s.layer
      AND e.pooling IS NOT DISTINCT FROM s.pooling AND e.split IS NOT DISTINCT FROM s.split
      AND e.subset IS NOT DISTINCT FROM s.subset AND e.step IS NOT DISTINCT FROM s.step
    ORDER BY e.created_at DESC LIMIT 1) p ON true
WHERE s.step IS NULL  -- learning-curve points belong to training, not to a night's scores
ORDER BY s.label, s.dataset, s.metric, s.layer, s.pooling"""


def score_changes(catalog: Catalog, run_id: str, earlier: pa.Table) -> pa.Table:
    """What the run scored: `earlier` is SNAPSHOT_SQL's result from before the run."""
    catalog.con.register("earlier", earlier)
    rows = catalog.con.execute(CHANGES_SQL, dict(run_id=run_id)).to_arrow_table()
    return rows.select(CHANGES_SCHEMA.names).cast(CHANGES_SCHEMA)


def changes_markdown(changes: pa.Table, title: str) -> str:
    rows = changes.to_pylist()
    counts = {s: sum(r["status"] == s for r in rows) for s in ("new", "changed", "same", "unchanged")}
    lines = [f"# {title}", "",
             f"{counts['new']} new scores, {counts['changed']} changed, {counts['same']} scored again with "
             f"the same value, {counts['unchanged']} already scored (not recomputed).", ""]
    moved = [r for r in rows if r["status"] in ("new", "changed")]
    if moved:
        lines += ["| model | dataset | metric | layer | pooling | status | value | previous | delta |",
                  "|---|---|---|---|---|---|---|---|---|"]
        fmt = lambda v: "" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
        lines += ["| " + " | ".join(fmt(r[c]) for c in ("label", "dataset", "metric", "layer", "pooling", "status",
                                                         "value", "previous", "delta")) + " |" for r in moved]
    return "\n".join(lines) + "\n"


def publish_changes(store: ArtifactStore, run_id: str, earlier: pa.Table, title: str) -> dict:
    """Write this run's score changes to the store (`score_changes` view) and show them in the UI."""
    changes = score_changes(Catalog(store), run_id, earlier)
    store.write_run_table(run_id, "changes", changes)
    create_markdown_artifact(markdown=changes_markdown(changes, title), key="embforge-changes",
                             description="What this evaluation scored anew, and by how much scores moved")
    statuses = changes["status"].to_pylist()
    return {s: statuses.count(s) for s in ("new", "changed", "same", "unchanged")}


@flow(name="evaluate")
def evaluate(params: EvaluateParams) -> dict:
    """Score registered models on the config's benchmark set; returns how many scores were new,
    changed, the same or already there."""
    run = open_run(params, "evaluate")
    cfg, store = run.cfg, run.store

    def body() -> dict:
        catalog = Catalog(store)
        models, earlier = registered_models(catalog, params.models), catalog.con.execute(SNAPSHOT_SQL).to_arrow_table()
        if not models:
            raise ConfigError(f"no registered models in {store.url}: run the `pipeline` or `train` flow first")
        docs = run.stage(INGEST, cfg.data, NoInputs())
        summaries = summarize_corpus(run, docs) if cfg.evaluate.semantic else None
        queries = write_queries(run, cfg.methods, docs)  # as the pipeline: held-out queries scored when trained on
        yardstick = yardstick_of(run, docs, (m.family for m in models), len(models))
        report_models(run, models, Corpus(docs, summaries, queries, yardstick), params.force)
        return publish_changes(store, run.record.run_id, earlier,
                               f"{cfg.name}: scores of {len(models)} registered models")

    return recorded(run, body)
