"""DuckDB views over the artifact store: what ran, on what, with what result.

Every report is a query over these views, so users can re-derive any number with SQL:

    artifacts    one row per finished artifact (stage, key, inputs, config, rows, wall time)
    runs         one row per flow run (flow, status, config, start and end, host, pid, heartbeat)
    models       every model a run registered (trained, base, reference): what `evaluate` scores
    run_stages   which artifact each stage of each run used, and whether it was cached
    metrics      every score of the evaluate, semantic and mteb stages (one schema: METRICS_SCHEMA)
    summaries    every LLM summary of every summarize artifact (key = the artifact), with its status
    sts_pairs    each STS pair's gold score and cosine per evaluate artifact (key): what the report bootstraps
    query_scores each query's nDCG@10 (and rank) per evaluate artifact (the held-out generated queries) and mteb
                 artifact (a local retrieval task's queries), by key: paired over queries
    yardstick_scores  the same per evaluate artifact for the yardstick's queries (what `embforge select` ranks by)
    run_metrics  metrics joined to the runs that produced or reused them
    score_changes  per evaluate run: each score new, changed (with the previous value) or unchanged

A run still `running` whose process is gone is shown `crashed`. The catalog is read-only: a query
runs only if it is one SELECT, and it reads no file outside the store. A damaged file (a truncated
run record, manifest or Parquet file) is left out of the views with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.base import HOST, MANIFEST, process_alive
from storage.store import ArtifactStore

log = logging.getLogger("embforge.catalog")

# The stages whose artifacts hold a metrics.parquet: a run's scores are their artifacts.
SCORE_STAGES = ("evaluate", "semantic", "mteb", "speed")
STS_PAIRS = "sts_pairs"  # the evaluate stage's table of each STS pair's cosine (its own file in the artifact)
QUERY_SCORES = "query_scores"  # each query's nDCG@10: the held-out generated ones (evaluate), local retrieval (mteb)
YARDSTICK_SCORES = "yardstick_scores"  # the same table (one schema) for the evaluate stage's yardstick queries
YARDSTICK_TOP = "yardstick_top"  # a consensus's best documents, the neighbours' rankings: what select fuses
PAIRED = "paired"  # the report stage's paired differences of two models, with their 95% intervals

# Every metrics.parquet has these columns, so any query over the `metrics` view works on any store.
METRICS_SCHEMA = pa.schema([
    ("key", pa.string()),  # the score stage's artifact that holds it (one of SCORE_STAGES)
    ("model", pa.string()),  # train/<key>, init/<key> or the external model's name
    ("dataset", pa.string()),
    ("metric", pa.string()),  # knn_accuracy, sts_spearman, ... or the MTEB task's name
    ("value", pa.float64()),  # None when the score could not be computed (see status, note)
    ("std", pa.float64()),
    ("n", pa.int64()),
    ("repeats", pa.int64()),
    ("split", pa.string()),
    ("layer", pa.int64()),  # hidden layer the embeddings came from (0 = embedding layer)
    ("pooling", pa.string()),
    ("step", pa.int64()),  # training batches, for learning-curve points
    ("task_type", pa.string()),  # MTEB: clustering, sts, retrieval, reranking, ...
    ("main_score", pa.string()),
    ("subset", pa.string()),
    ("revision", pa.string()),
    ("mteb_version", pa.string()),
    ("dtype", pa.string()),
    ("batch_size", pa.int64()),
    ("max_length", pa.int64()),
    ("status", pa.string()),  # ok or skipped
    ("note", pa.string()),
])


# One row per score an evaluate run touched: `new` (first score of this model on this metric),
# `changed` / `same` (scored again, e.g. a new task revision, next to the previous value) or
# `unchanged` (already scored with the same model, task, revision and settings: not recomputed).
CHANGES_SCHEMA = pa.schema([
    ("label", pa.string()), ("model", pa.string()), ("dataset", pa.string()), ("metric", pa.string()),
    ("layer", pa.int64()), ("pooling", pa.string()), ("split", pa.string()), ("subset", pa.string()),
    ("status", pa.string()), ("value", pa.float64()), ("previous", pa.float64()), ("delta", pa.float64()),
    ("key", pa.string()), ("previous_key", pa.string()),
])


# A score, not a point of a curve (the learning curve's steps, the layer-wise curves) nor one split's
# score (knn_accuracy_split), over `metrics AS m`.
FINAL_SCORE = "m.step IS NULL AND NOT ends_with(m.metric, '_layerwise') AND NOT ends_with(m.metric, '_split')"


def metrics_table(rows: list[dict], **common) -> pa.Table:
    """Score rows (plus fields shared by all of them) as a table with METRICS_SCHEMA."""
    names = METRICS_SCHEMA.names
    return pa.Table.from_pylist([{n: {**common, **r}.get(n) for n in names} for r in rows], schema=METRICS_SCHEMA)

# Empty stand-ins keep every view queryable before the first run has written anything.
_EMPTY = {
    "artifacts": "SELECT NULL::VARCHAR stage, NULL::VARCHAR key, NULL::VARCHAR[] inputs, NULL::JSON config,"
    " NULL::VARCHAR code_version, NULL::JSON rows, NULL::JSON extra, NULL::TIMESTAMP created_at, NULL::DOUBLE wall_s,"
    " NULL::VARCHAR path WHERE false",
    "runs": "SELECT NULL::VARCHAR run_id, NULL::VARCHAR name, NULL::VARCHAR flow, NULL::VARCHAR status,"
    " NULL::VARCHAR config_path, NULL::JSON overrides, NULL::JSON config, NULL::TIMESTAMP started_at,"
    " NULL::TIMESTAMP finished_at, NULL::VARCHAR error, NULL::JSON stages, NULL::JSON models, NULL::VARCHAR host,"
    " NULL::BIGINT pid, NULL::TIMESTAMP heartbeat_at, NULL::DOUBLE heartbeat_s WHERE false",
    "score_changes": "SELECT NULL::VARCHAR run_id, * FROM empty_changes",
    "metrics": "SELECT * FROM empty_metrics",
    "summaries": "SELECT NULL::VARCHAR key, NULL::VARCHAR doc_id, NULL::BIGINT prompt_id, NULL::BIGINT sample,"
    " NULL::VARCHAR text, NULL::VARCHAR status, NULL::VARCHAR continuation, NULL::VARCHAR finish, NULL::BIGINT tokens,"
    " NULL::VARCHAR model, NULL::VARCHAR backend, NULL::VARCHAR sampling, NULL::BIGINT seed WHERE false",
    STS_PAIRS: "SELECT NULL::VARCHAR key, NULL::INTEGER pair, NULL::DOUBLE score, NULL::FLOAT cosine WHERE false",
    QUERY_SCORES: "SELECT NULL::VARCHAR key, NULL::VARCHAR query_id, NULL::BIGINT rank, NULL::DOUBLE ndcg WHERE false",
    YARDSTICK_SCORES: f"SELECT * FROM {QUERY_SCORES}",
    PAIRED: "SELECT NULL::VARCHAR key, NULL::VARCHAR dataset, NULL::VARCHAR metric, NULL::VARCHAR model,"
    " NULL::VARCHAR versus, NULL::DOUBLE difference, NULL::DOUBLE low, NULL::DOUBLE high, NULL::BIGINT n,"
    " NULL::VARCHAR interval, NULL::BOOLEAN significant WHERE false",
}


# A run still `running` has crashed once it missed this many heartbeats (its machine went down, or
# the process died where its pid cannot be checked).
MISSED_HEARTBEATS = 3


class QueryError(ValueError):
    """SQL the read-only catalog does not run: empty, several statements, or not a SELECT."""


def _crashed(record: dict) -> bool:
    """Whether a run recorded as `running` is gone: its process on this machine has ended, or its
    heartbeat stopped. Records written before runs had a pid and heartbeat keep their status."""
    if record.get("status") != "running":
        return False
    if record.get("host") == HOST and record.get("pid") is not None:  # on this machine the process decides
        return not process_alive(int(record["pid"]))
    if record.get("heartbeat_at") is None or record.get("heartbeat_s") is None:
        return False
    silent = datetime.now(UTC) - datetime.fromisoformat(record["heartbeat_at"])
    return silent > timedelta(seconds=MISSED_HEARTBEATS * record["heartbeat_s"])


def _json_object(blob: bytes | Exception) -> dict:
    if isinstance(blob, Exception):
        raise blob
    record = json.loads(blob)
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return record


def _readable(paths: list[str], read: Callable[[str], Any]) -> dict[str, Any]:
    """The files, each with what `read` made of it. A file it cannot read (cut short by a full disk
    or a killed copy) is skipped with a warning, so the others stay queryable."""
    found = {}
    for path in paths:
        try:
            found[path] = read(path)
        except (OSError, ValueError, TypeError) as e:
            log.warning("skipped the damaged file %s: %s", path, e)
    return found


def _json_files(store: ArtifactStore, *pattern: str) -> dict[str, dict]:
    blobs = store.cat(store.glob(*pattern))  # at once: an object store fetches them concurrently
    return _readable(list(blobs), lambda path: _json_object(blobs[path]))


def _sql_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]::VARCHAR[]"


class Catalog:
    """An in-memory DuckDB connection with the store's views defined on it, that can read only the
    store's files (internal code may still register tables and create temporary ones). The views
    cover the files that were there and readable when it was built: build a new one to see later runs."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        self.con = duckdb.connect()
        self.con.register("empty_metrics", METRICS_SCHEMA.empty_table())
        self.con.register("empty_changes", CHANGES_SCHEMA.empty_table())
        if store.remote:  # DuckDB reads the object store through the same fsspec filesystem
            self.con.register_filesystem(store.fs)

        def metadata(path: str) -> pq.FileMetaData:
            with store.fs.open(path, "rb") as fh:
                return pq.read_metadata(fh)

        manifests = _json_files(store, "artifacts", "*", "*", MANIFEST)
        self._view("artifacts", manifests, """
            SELECT stage, key, inputs, config, code_version, rows, extra, created_at, wall_s,
                   'artifacts/' || stage || '/' || key AS path
            FROM read_json({files}, columns={stage: 'VARCHAR', key: 'VARCHAR', inputs: 'VARCHAR[]',
                 config: 'JSON', code_version: 'VARCHAR', rows: 'JSON', extra: 'JSON', created_at: 'TIMESTAMP',
                 wall_s: 'DOUBLE'})""")
        runs = {path: _crashed(record) for path, record in _json_files(store, "runs", "*.json").items()}
        self._view("runs", runs, """
            SELECT * EXCLUDE (filename) REPLACE (
                CASE WHEN list_contains({crashed}, filename) THEN 'crashed' ELSE status END AS status)
            FROM read_json({files}, filename=true, columns={run_id: 'VARCHAR', name: 'VARCHAR', flow: 'VARCHAR',
                 status: 'VARCHAR', config_path: 'VARCHAR', overrides: 'JSON', config: 'JSON',
                 started_at: 'TIMESTAMP', finished_at: 'TIMESTAMP', error: 'VARCHAR', stages: 'JSON',
                 models: 'JSON', host: 'VARCHAR', pid: 'BIGINT', heartbeat_at: 'TIMESTAMP', heartbeat_s: 'DOUBLE'})
            """.replace("{crashed}", _sql_list([path for path, crashed in runs.items() if crashed])))
        self._view("score_changes", _readable(store.glob("runs", "*.changes.parquet"), metadata), r"""
            SELECT regexp_extract(filename, '([^/]+)\.changes\.parquet$', 1) AS run_id, * EXCLUDE (filename)
            FROM read_parquet({files}, filename=true)""")
        self._view("metrics", _readable(store.artifact_files("metrics.parquet", manifests), metadata),
                   "SELECT * FROM read_parquet({files}, union_by_name=true)")

        def per_artifact(view: str, *stages: str) -> None:
            """View `view` over the `<view>.parquet` of every artifact of `stages`, with the artifact's key."""
            files = [f for f in store.artifact_files(f"{view}.parquet", manifests)
                     if f.startswith(tuple(store.location("artifacts", stage, "") for stage in stages))]
            self._view(view, _readable(files, metadata), f"""
                SELECT regexp_extract(filename, '/artifacts/(?:{"|".join(stages)})/([^/]+)/', 1) AS key,
                       * EXCLUDE (filename)
                FROM read_parquet({{files}}, filename=true)""")

        per_artifact("summaries", "summarize")
        per_artifact(STS_PAIRS, "evaluate")
        per_artifact(QUERY_SCORES, "evaluate", "mteb")
        per_artifact(YARDSTICK_SCORES, "evaluate")
        per_artifact(PAIRED, "report")
        self.con.execute("""
            CREATE VIEW run_stages AS
            SELECT r.run_id, r.started_at, t.i AS position, s->>'stage' AS stage, s->>'label' AS label,
                   s->>'method' AS method, s->>'key' AS key, s->>'state' AS state,
                   s->'version_changes' AS version_changes
            FROM runs r, range(json_array_length(r.stages)::BIGINT) AS t(i),
                 LATERAL (SELECT r.stages->(t.i::INTEGER) AS s)
            ORDER BY r.started_at, position""")
        self.con.execute("""
            CREATE VIEW models AS
            SELECT m->>'label' AS label, m->>'method' AS method, m->>'artifact' AS artifact,
                   m->>'external' AS external, m->>'pooling' AS pooling,
                   (m->>'knn_holdout')::BOOLEAN AS knn_holdout, m->>'tokenizer' AS tokenizer, m->>'teacher' AS teacher,
                   coalesce(m->>'family', 'dense') AS family, r.name AS experiment, r.run_id,
                   r.started_at AS registered_at
            FROM runs r, range(coalesce(json_array_length(r.models), 0)::BIGINT) AS t(i),
                 LATERAL (SELECT r.models->(t.i::INTEGER) AS m)""")
        self.con.execute(f"""
            CREATE VIEW run_metrics AS
            SELECT rs.run_id, rs.started_at, rs.label, rs.method, m.*
            FROM run_stages rs JOIN metrics m ON rs.stage IN {SCORE_STAGES} AND rs.key = m.key""")

        # Views read the store's files when queried, so the store stays readable; nothing else is (COPY TO,
        # ATTACH, read_csv('/etc/passwd'), INSTALL), and a locked configuration cannot be SET back. No spill
        # folder: DuckDB would allow reading its default one, ./.tmp, too (the catalog's queries are small).
        self.con.execute("SET temp_directory = ''")
        self.con.execute(f"SET allowed_directories = {_sql_list([store.location('')])}")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def _view(self, name: str, files: dict[str, Any], select: str) -> None:
        # read_json/read_parquet fail on an empty list of files.
        sql = select.replace("{files}", _sql_list(list(files))) if files else _EMPTY[name]
        self.con.execute(f"CREATE VIEW {name} AS {sql}")

    def query(self, sql: str, params: list | None = None) -> list[dict]:
        """The rows of one SELECT (DESCRIBE, SHOW and SUMMARIZE are SELECTs too). Anything else is
        refused with a QueryError before it runs: the catalog is read-only (EXPLAIN ANALYZE, for one,
        would run the statement it explains)."""
        statements = self.con.extract_statements(sql)
        if not statements:
            raise QueryError("the query is empty")
        if len(statements) > 1:
            raise QueryError(f"one query at a time, got {len(statements)} statements")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise QueryError(f"the catalog is read-only: only SELECT queries run, not {statements[0].type.name}")
        cur = self.con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def latest_run_id(self) -> str | None:
        rows = self.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
        return rows[0]["run_id"] if rows else None
