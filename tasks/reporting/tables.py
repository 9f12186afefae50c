"""The comparison tables: DuckDB queries over the catalog's metrics, models as columns and tasks as
rows (in-domain scores first, then the MTEB tasks by type, their block means and the average of
block means). The report stage and `embforge report` both build their tables here, so they always
agree with the catalog, and the command needs neither Prefect's tasks nor the encoders to print one.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pandas as pd

from storage.base import ArtifactRef
from storage.catalog import QUERY_SCORES, STS_PAIRS, YARDSTICK_SCORES, YARDSTICK_TOP, Catalog
from storage.store import ArtifactStore
from tasks.config.evaluation import YARDSTICK_METRICS
from tasks.config.queries import HELD_OUT
from tasks.config.yardsticks import yardstick_kind
from tasks.encoders.budget import CHARS_PER_TOKEN
from tasks.metrics.pool import pool_scores
from tasks.metrics.significance import PairedDifference, bootstrap_spearman_difference, paired_difference
from tasks.metrics.speed import SPEED_METRICS

# Scores that are points of a curve (written by the evaluate stage): drawn as pictures, not listed
# as table rows.
CURVES = ("knn_accuracy_layerwise", "knn_accuracy_curve")
PER_SPLIT = "knn_accuracy_split"  # one row per split of knn_accuracy_splits: paired across models, not listed
POINTS = (*CURVES, PER_SPLIT)

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
    "query_ndcg_at_10": "retrieval of the held-out LLM-written queries (never trained on): nDCG@10 of each "
    "query's own document among all documents, by cosine (a multi-vector model's: MaxSim; a sparse one's: dot "
    "product) (docs/gpl.md)",
    "query_recall_at_10": "the same: share of those queries whose document is in the top 10",
    "query_mrr_at_10": "the same: mean reciprocal rank of the document, 0 beyond the top 10",
    "title_ndcg_at_10": "the yardstick by titles: nDCG@10 of each held-out document (never trained on) among all "
    "documents for its title, by cosine (a multi-vector model's: MaxSim; a sparse one's: dot product) "
    "(docs/evaluation.md)",
    "title_recall_at_10": "the same: share of those titles whose document is in the top 10",
    "title_mrr_at_10": "the same: mean reciprocal rank of the document, 0 beyond the top 10",
    "qrels_ndcg_at_10": "the yardstick by your queries: nDCG@10 (binary gains) of the documents you judged relevant "
    "to each query whose judged documents were all held out of training, among all documents, by cosine (a "
    "multi-vector model's: MaxSim; a sparse one's: dot product) (docs/evaluation.md)",
    "qrels_mrr_at_10": "the same: mean reciprocal rank of the first judged document, 0 beyond the top 10",
    "label_ndcg_at_10": "the yardstick by labels: nDCG@10 of the documents of each held-out document's label (every "
    "one relevant) among the labelled documents not held out, by cosine (a multi-vector model's: MaxSim between the "
    "documents' token vectors; a sparse one's: dot product) (docs/evaluation.md)",
    "label_mrr_at_10": "the same: mean reciprocal rank of the first document of its label, 0 beyond the top 10",
    "consensus_ndcg_at_10": "the consensus yardstick: nDCG@10 of each held-out title or LLM query's documents against "
    "the fusion of the report's other models' rankings (its own document weighted most); the models judge each "
    "other, so the score moves with the models beside it (docs/evaluation.md)",
    "neighbours_ndcg_at_10": "the neighbours yardstick: nDCG@10 of each held-out document's nearest other documents "
    "against the fusion of the report's other models' rankings; the models judge each other, so the score moves "
    "with the models beside it (docs/evaluation.md)",
    "health": "how training went: healthy, collapsed (one vector for every text), diverged, or trivial (a view too "
    "easy to teach much), with the first step it showed (docs/health.md)",
    "final_loss": "the training loss at the last step",
    "chance_loss": "the loss of a model that gives every text one vector: ln(batch) for InfoNCE",
    "probe_mean_cosine": "mean cosine of a fixed batch of 64 training texts at the last probe (1 = one vector for all)",
    "grad_norm_min": "smallest gradient norm of a step, before clipping",
    "grad_norm_max": "largest gradient norm of a step, before clipping",
    "cpu_docs_per_s": "a static model's documents encoded a second on the CPU (median of rounds, docs/static.md)",
    "teacher_cpu_docs_per_s": "its teacher's, on the same documents, measured in turn with it (the same rounds)",
}

# Scores where higher is better that a static model keeps as a share of its teacher's (every MTEB task's main
# score too); the geometry and the semantic ranks are not "kept" (lower is better, or neither).
KEPT = ("knn_accuracy", "knn_accuracy_splits", "sts_spearman", "query_ndcg_at_10", "semantic_same_label_5nn")

# Long form: one row per (model, score), models in the order given by `entries`.
LONG_SQL = """
SELECT e.ord, e.label AS model, e.method, m.* EXCLUDE (key), e.key AS score_key
FROM entries e JOIN metrics m ON m.key = e.key
ORDER BY e.ord, m.dataset, m.metric, m.layer, m.pooling, m.step, m.split"""

# The queries below read `scores`: LONG_SQL's rows, materialised once per table (see `_load`).
IN_DOMAIN_SQL = f"""
SELECT ord, model, dataset, metric, value, std, n, note FROM scores
WHERE dataset <> 'mteb' AND metric NOT IN {POINTS}"""

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


def entries_loaded(catalog: Catalog, entries: list[dict]) -> Catalog:
    """Materialise the entries' scores as table `scores`: the metrics view reads every metrics
    file in the store, so it is scanned once per table, not once per query."""
    models = pd.DataFrame(entries, columns=["label", "method", "key"])
    order = {label: i for i, label in enumerate(dict.fromkeys(models["label"]))}
    catalog.con.register("entries", models.assign(ord=models["label"].map(order)))
    catalog.con.execute(f"CREATE OR REPLACE TEMP TABLE scores AS {LONG_SQL}")
    return catalog


def query(catalog: Catalog, sql: str) -> pd.DataFrame:
    return catalog.con.execute(sql).df()


def long_rows(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """Every score of the entries, a pooled yardstick's included (pooled_rows)."""
    pooled = pooled_rows(catalog, entries)
    long = query(entries_loaded(catalog, entries), "SELECT * FROM scores")
    return pd.concat([long, pooled], ignore_index=True) if len(pooled) else long


def curve_rows(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """The points of the entries' curves (layer-wise and learning curves), for the report's pictures."""
    return query(entries_loaded(catalog, entries), CURVE_SQL)


def _cell(value: float, std: float | None = None) -> str:
    if value is None or value != value:
        return ""
    return f"{value:.3f}" if std is None or std != std else f"{value:.3f} ± {std:.3f}"


def comparison_table(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """Tasks as rows, models as columns (a pooled yardstick's among the in-domain rows); MTEB block means and their
    average at the bottom."""
    models = list(dict.fromkeys(e["label"] for e in entries))
    rows: list[dict] = []
    pooled = pooled_rows(catalog, entries)
    catalog = entries_loaded(catalog, entries)
    scores = query(catalog, IN_DOMAIN_SQL)
    if len(pooled):
        scores = pd.concat([scores, pooled])
    metric_order = {m: i for i, m in enumerate(LEGEND)}
    scores = scores.assign(o=scores["metric"].map(metric_order).fillna(len(LEGEND))).sort_values(
        ["dataset", "o", "metric"])
    for (dataset, metric), group in scores.groupby(["dataset", "metric"], sort=False):
        rows.append(dict(task=f"{dataset}: {metric}", **{r.model: _cell(r.value, r.std) or r.note or ""
                                                         for r in group.itertuples()}))
        if metric == "knn_accuracy":
            rows.append(dict(task=f"{dataset}: knn_n", **{r.model: str(r.n) for r in group.itertuples()}))
    tasks = query(catalog, TASK_SQL).sort_values(["task_type", "task"], na_position="last")
    for (task_type, mteb_task), group in tasks.groupby(["task_type", "task"], sort=False, dropna=False):
        main = group["main_score"].dropna()
        name = f"{task_type or 'mteb'}: {mteb_task}" + (f" ({main.iloc[0]})" if len(main) else "")
        rows.append(dict(task=name, **{r.model: _cell(r.value) if r.ok else "skipped" for r in group.itertuples()}))
    for block, group in query(catalog, BLOCK_SQL).groupby("block"):
        n = int(group["tasks"].max())
        rows.append(dict(task=f"block mean: {block} ({n} task{'' if n == 1 else 's'})",
                         **{r.model: _cell(r.value) for r in group.itertuples()}))
    for blocks, group in query(catalog, AVERAGE_SQL).groupby("blocks"):
        rows.append(dict(task=f"average of block means ({blocks})",
                         **{r.model: _cell(r.value) for r in group.itertuples()}))
    return pd.DataFrame(rows, columns=["task", *models]).fillna("")


# Every later model against every earlier one, on the splits both were scored on.
PAIRED_SQL = f"""
SELECT a.dataset, b.model, a.model AS versus, list(b.value ORDER BY a.split) AS scores,
       list(a.value ORDER BY a.split) AS versus_scores
FROM scores a JOIN scores b ON a.dataset = b.dataset AND a.split = b.split AND a.ord < b.ord
WHERE a.metric = '{PER_SPLIT}' AND b.metric = '{PER_SPLIT}' AND a.value IS NOT NULL AND b.value IS NOT NULL
GROUP BY ALL ORDER BY any_value(b.ord), any_value(a.ord), a.dataset"""

# The same for STS Spearman, on the pairs both were scored on: each pair's cosine under both models and its
# gold score, kept only when both scored every pair of the same file (same count, same gold scores).
STS_PAIRED_SQL = f"""
SELECT a.dataset, b.model, a.model AS versus, list(pb.cosine ORDER BY pa.pair) AS scores,
       list(pa.cosine ORDER BY pa.pair) AS versus_scores, list(pa.score ORDER BY pa.pair) AS gold
FROM scores a JOIN scores b ON a.dataset = b.dataset AND a.split IS NOT DISTINCT FROM b.split AND a.ord < b.ord
JOIN {STS_PAIRS} pa ON pa.key = a.score_key JOIN {STS_PAIRS} pb ON pb.key = b.score_key AND pb.pair = pa.pair
WHERE a.metric = 'sts_spearman' AND b.metric = 'sts_spearman'
GROUP BY ALL HAVING bool_and(pa.score = pb.score) AND count(*) = any_value(a.n) AND any_value(a.n) = any_value(b.n)
ORDER BY any_value(b.ord), any_value(a.ord), a.dataset"""

# The same for nDCG@10 over the queries both models were scored on, each set in its table: the held-out generated
# queries (evaluate) and each local retrieval task (mteb: metric = the task, main score nDCG@10); the yardstick's
# held-out documents (evaluate).
QUERY_PAIRED_SQL = """
SELECT a.dataset, a.metric, b.model, a.model AS versus, list(qb.ndcg ORDER BY qa.query_id) AS scores,
       list(qa.ndcg ORDER BY qa.query_id) AS versus_scores
FROM scores a JOIN scores b ON a.dataset = b.dataset AND a.metric = b.metric
     AND a.split IS NOT DISTINCT FROM b.split AND a.ord < b.ord
JOIN {table} qa ON qa.key = a.score_key JOIN {table} qb ON qb.key = b.score_key AND qb.query_id = qa.query_id
WHERE {scored}
GROUP BY ALL ORDER BY any_value(b.ord), any_value(a.ord), a.dataset, a.metric"""
QUERY_SETS = {QUERY_SCORES: "a.metric = 'query_ndcg_at_10' OR (a.dataset = 'mteb' AND a.main_score = 'ndcg_at_10')",
              YARDSTICK_SCORES: "a.metric IN (" + ", ".join(f"'{m}'" for m in YARDSTICK_METRICS.values()) + ")"}

PAIRED_COLUMNS = ["dataset", "metric", "model", "versus", "difference", "low", "high", "n", "interval", "significant"]


def _paired_row(r, metric: str, interval: str, d: PairedDifference) -> dict:
    return dict(dataset=r.dataset, metric=metric, model=r.model, versus=r.versus, difference=d.mean, low=d.low,
                high=d.high, n=d.n, interval=interval, significant=d.significant)


def paired_differences(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """Each model minus each model before it, with a 95% interval (tasks/metrics/significance.py):
    kNN accuracy paired over the splits both were scored on (t interval), then STS Spearman over the
    pairs both scored (bootstrap of the pairs), then nDCG@10 over the queries both were scored on (t
    interval): the held-out generated queries, each local retrieval task (its metric: the task), and the
    yardstick's held-out documents (a pooled yardstick's: pooled_paired)."""
    catalog, rows = entries_loaded(catalog, entries), []
    for r in query(catalog, PAIRED_SQL).itertuples():
        if len(r.scores) >= 2:
            d = paired_difference(np.array(r.scores), np.array(r.versus_scores))
            rows.append(_paired_row(r, "knn_accuracy", "t", d))
    for r in query(catalog, STS_PAIRED_SQL).itertuples():
        if len(r.gold) >= 3:
            d = bootstrap_spearman_difference(np.array(r.scores), np.array(r.versus_scores), np.array(r.gold))
            rows.append(_paired_row(r, "sts_spearman", "bootstrap", d))
    for table, scored in QUERY_SETS.items():
        for r in query(catalog, QUERY_PAIRED_SQL.format(table=table, scored=scored)).itertuples():
            if len(r.scores) >= 2:
                d = paired_difference(np.array(r.scores), np.array(r.versus_scores))
                rows.append(_paired_row(r, r.metric, "t", d))
    return pd.DataFrame(rows + pooled_paired(catalog, entries), columns=PAIRED_COLUMNS)


def pooled_yardsticks(catalog: Catalog, entries: list[dict]) -> list[tuple[str, str, dict[str, pd.Series]]]:
    """The pooled yardsticks (consensus, neighbours, clusters: no score of one model) the entries' evaluate artifacts
    ranked: (dataset, metric, each model's per-query scores), the models that ranked one yardstick's queries judging
    each other (tasks/metrics/pool.py); none for a yardstick fewer than two of them ranked."""
    return _pooled(catalog.store, tuple((e["label"], e["key"]) for e in entries))


@functools.lru_cache(maxsize=4)  # a report's table, long rows and paired differences fuse the same pool once
def _pooled(store: ArtifactStore, entries: tuple[tuple[str, str], ...]) -> list[tuple[str, str, dict[str, pd.Series]]]:
    pools = {}
    for label, key in entries:
        ref = ArtifactRef("evaluate", key)
        if f"{YARDSTICK_TOP}.parquet" in (store.published_files(ref) or {}):
            manifest = store.manifest(ref)
            pools.setdefault((manifest["config"]["dataset"], manifest["input_roles"]["yardstick"]), {})[label] = ref
    return [(dataset, YARDSTICK_METRICS[yardstick_kind(store.manifest(ArtifactRef("yardstick", key)))],
             pool_scores(store, pool)) for (dataset, key), pool in pools.items() if len(pool) > 1]


def pooled_rows(catalog: Catalog, entries: list[dict]) -> pd.DataFrame:
    """Each pooled yardstick's score of each model, the mean over its held-out queries, as long rows."""
    order = {e["label"]: (i, e["method"]) for i, e in enumerate(dict((e["label"], e) for e in entries).values())}
    return pd.DataFrame([dict(ord=order[model][0], model=model, method=order[model][1], dataset=dataset, metric=metric,
                              value=float(s.mean()), std=np.nan, n=len(s), split=HELD_OUT, status="ok",
                              note=f"judged by the other {len(judged) - 1} models (their rankings fused, or grouping)")
                         for dataset, metric, judged in pooled_yardsticks(catalog, entries)
                         for model, s in judged.items()])


def pooled_paired(catalog: Catalog, entries: list[dict]) -> list[dict]:
    """Each model minus each model before it on each pooled yardstick, over the same held-out queries (t interval)."""
    return [_paired_row(SimpleNamespace(dataset=dataset, model=model, versus=versus), metric, "t",
                        paired_difference(judged[model].to_numpy(), judged[versus].to_numpy()))
            for dataset, metric, judged in pooled_yardsticks(catalog, entries)
            for i, model in enumerate(judged) for versus in list(judged)[:i]]


def paired_lines(paired: pd.DataFrame) -> list[str]:
    lines = []
    for r in paired.itertuples():
        over = (f"{r.n:,} pairs (bootstrap)" if r.interval == "bootstrap" else
                f"{r.n} splits" if r.metric == "knn_accuracy" else f"{r.n:,} queries")
        lines.append(f"{r.dataset}: {r.metric}: {r.model} − {r.versus}: {r.difference:+.3f} [{r.low:+.3f}, "
                     f"{r.high:+.3f}] over {over}, {'significant' if r.significant else 'not significant'}")
    return lines


# Score artifacts that embedded texts cut to the character budget first (tasks/encoders/budget.py).
CUT_SQL = """
SELECT DISTINCT e.ord, e.label, a.stage, (a.extra->>'cut')::BIGINT AS cut,
       coalesce(a.config->>'dataset', a.config->'task'->>'name', a.config->>'task') AS scored
FROM entries e JOIN artifacts a ON a.key = e.key
WHERE (a.extra->>'cut')::BIGINT > 0 ORDER BY e.ord, scored"""


# Evaluate artifacts of multi-vector models (tasks/evaluate.py: their one vector is the mean token vector).
TOKEN_MEAN_SQL = """
SELECT DISTINCT e.ord, e.label FROM entries e JOIN artifacts a ON a.key = e.key
WHERE a.stage = 'evaluate' AND (a.extra->>'token_mean')::BOOLEAN ORDER BY e.ord"""


# Evaluate artifacts of sparse models (tasks/evaluate.py: their retrieval is by the codes' dot product).
SPARSE_SQL = """
SELECT DISTINCT e.ord, e.label FROM entries e JOIN artifacts a ON a.key = e.key
WHERE a.stage = 'evaluate' AND a.extra->'serving'->>'family' = 'sparse' ORDER BY e.ord"""

def notes(catalog: Catalog, entries: list[dict]) -> list[str]:
    """What a reader of the table must know: the tasks skipped (and why), the texts cut, which models' one vector is
    a multi-vector model's mean token vector, and which models are sparse."""
    tasks = query(entries_loaded(catalog, entries), TASK_SQL)
    skipped = tasks[~tasks["ok"].astype(bool)].drop_duplicates("task")
    return ([f"skipped: {r.task}: {r.note}" for r in skipped.itertuples()]
            + [f"cut: {r.label}: {r.cut} text(s) of {r.scored} ({r.stage}) were longer than max_length × "
               f"{CHARS_PER_TOKEN} characters and were cut to that before tokenizing"
               for r in query(catalog, CUT_SQL).itertuples()]
            + [f"multi-vector: {r.label}: its one-vector scores (kNN, STS, clustering, the semantic benchmark, "
               "geometry) read its mean token vector; its retrieval (MTEB's retrieval tasks, held-out queries, titles, "
               "labels) is by MaxSim"
               for r in query(catalog, TOKEN_MEAN_SQL).itertuples()]
            + [f"sparse: {r.label}: its retrieval (MTEB's retrieval tasks, held-out queries, titles) is by the dot "
               "product of its codes, its other scores by their cosine"
               for r in query(catalog, SPARSE_SQL).itertuples()])


def beside_teacher(long: pd.DataFrame, static: str, teacher: str) -> pd.DataFrame:
    """A static model's scores beside its teacher's (`long`: the report's long rows): each KEPT score and MTEB
    task both have, with the share the static model keeps, then both CPU documents/s and the speed-up."""
    scored = long[long["status"] == "ok"]
    mteb = scored["dataset"] == "mteb"
    values = pd.concat([
        scored[~mteb & scored["metric"].isin(KEPT)].assign(score=lambda f: f["dataset"] + ": " + f["metric"]),
        scored[mteb].assign(score=lambda f: "mteb: " + f["metric"] + " (" + f["main_score"].fillna("") + ")"),
    ]).groupby(["score", "model"])["value"].mean().unstack()  # a task's subsets and splits averaged, as MTEB does
    rows = [dict(score=score, teacher=_cell(r[teacher]), static=_cell(r[static]),
                 kept=f"{r[static] / r[teacher]:.1%}" if r[teacher] > 0 else "")
            for score, r in values.reindex(columns=[teacher, static]).dropna().iterrows()]
    speed = scored[(scored["model"] == static) & scored["metric"].isin(SPEED_METRICS)]
    rates = dict(zip(speed["metric"], speed["value"]))
    if len(rates) == 2:
        static_rate, teacher_rate = (rates[name] for name in SPEED_METRICS)
        rows.append(dict(score=f"CPU documents/s ({int(speed['n'].iloc[0]):,} documents, in turn)",
                         teacher=f"{teacher_rate:,.1f}", static=f"{static_rate:,.1f}",
                         kept=f"{static_rate / teacher_rate:,.1f}x faster"))
    return pd.DataFrame(rows, columns=["score", "teacher", "static", "kept"]).rename(
        columns={"teacher": teacher, "static": static})


def markdown_rows(table: pd.DataFrame) -> list[str]:
    """`table` as a Markdown table: its header, the rule, a line per row."""
    cols = list(table.columns)
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            *["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]]


def to_markdown(title: str, table: pd.DataFrame, notes: list[str] = (), pictures: list[tuple[str, str]] = (),
                paired: pd.DataFrame | None = None, beside: list[pd.DataFrame] = (),
                serving: pd.DataFrame | None = None) -> str:
    lines = [f"# {title}", "", *markdown_rows(table)]
    shown = " ".join(table["task"])
    lines += ["", *[f"- **{m}**: {text}" for m, text in LEGEND.items() if m in shown]]
    lines += [f"- {note}" for note in notes]
    if paired is not None and len(paired):
        lines += ["", "Paired differences (95% intervals, significant when the interval leaves out 0): kNN accuracy "
                  "over the same splits (t interval), STS Spearman over the same pairs (bootstrap of the pairs), "
                  "nDCG@10 over the same queries (held-out generated queries, local retrieval tasks; t interval):",
                  "",
                  *[f"- {line}" for line in paired_lines(paired)]]
    if serving is not None and len(serving):
        lines += ["", "## Serving the families", "",
                  "Index bytes a document: uncompressed (a dense vector and a multi-vector model's token vectors in "
                  "float32, the latter only where the run kept them: with held-out queries or a yardstick; a sparse "
                  "model's active codes at 8 bytes each); documents/s: the documents' embedding run, loading the "
                  "model included, on the machine that made it; query ms (CPU): a held-out query's text to its ten "
                  "best documents, encoded alone and searched exactly over the whole index, the models in turn in one "
                  "process (median; `evaluate.latency_queries`); active codes: the mean count of non-zero codes in a "
                  "document and in a query (– where no queries were embedded), of the model's width.", "",
                  *markdown_rows(serving)]
    for frame in beside:  # columns: score, the teacher, the static model, kept
        lines += ["", f"## {frame.columns[2]} beside its teacher {frame.columns[1]}", "",
                  "kept: the static model's score as a share of its teacher's; CPU documents/s: both encoders "
                  "took the same documents in turn on the CPU, in the same run (median of the rounds).", "",
                  *markdown_rows(frame)]
    lines += [line for caption, path in pictures for line in ("", f"![{caption}]({path})")]
    return "\n".join(lines) + "\n"
