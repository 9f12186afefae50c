"""Evaluate one model on the labelled documents: kNN accuracy (also layer-wise), STS Spearman,
embedding geometry, a t-SNE map and the learning curve.

Inputs: `documents`; `embeddings` (the documents' embed artifact); `sts_embeddings` (the STS
pairs' embed artifact) when `sts` is set; `model`, the train or init artifact holding the model,
if any (its learning curve is reported). The vectors come
from the embeddings cache (tasks/embed.py), so nothing is encoded here; a sparse model's codes are read once and kept
sparse (kNN, geometry, retrieval and the yardsticks score them so), made dense only for a t-SNE map's sample and the
STS pairs. Output `metrics.parquet`
(storage.METRICS_SCHEMA, one row per score), `sts_pairs.parquet` (each STS pair's gold score and
cosine, when `sts` is set) and PNG pictures next to it.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field
from scipy import sparse

from storage.base import ArtifactRef
from storage.catalog import QUERY_SCORES, STS_PAIRS, YARDSTICK_SCORES, YARDSTICK_TOP, metrics_table
from storage.codes import code_columns
from storage.store import ArtifactStore, ArtifactWriter
from tasks import embed
from tasks.config.base import Section
from tasks.config.evaluation import TSNE_MAX, KnnConfig, MaxSimSearch, StsConfig
from tasks.config.queries import HELD_OUT
from tasks.config.yardsticks import NEAREST, TEXT_QUERIES, YARDSTICKS, yardstick_kind, yardstick_source
from tasks.core import eval_sets
from tasks.core.held_out import held_out_queries
from tasks.core.stage import Stage
from tasks.encoders.encode import POOLINGS
from tasks.encoders.models import trained_ref
from tasks.methods import health
from tasks.metrics import geometry, knn, pool, retrieval, sts
from tasks.reporting import plots
from tasks.reporting.plots import PICTURES
from tasks.reporting.tables import PER_SPLIT, POINTS
from tasks.search import Searcher, searcher


class EvalJob(Section):
    label: str = Field(description="Model name shown in pictures.")
    model: str | None = Field(None, description="External model (name or path); None when the "
                              "inputs carry a train or init artifact.")
    dataset: str = Field(description="Dataset name recorded with each score.")
    knn: KnnConfig | None
    sts: StsConfig | None
    pooling: str = Field("mean", description="mean, cls or sep: the pooling the model was trained with.")
    knn_holdout: bool = Field(False, description="The model never saw kNN's test documents in training.")
    layerwise: bool = False
    geometry: bool = True
    tsne: bool = True
    tsne_max: int = TSNE_MAX
    maxsim: MaxSimSearch | None = Field(None, description="A multi-vector model's: how its queries search (None: "
                                        "another family, or the defaults).")


def knn_rows(emb: np.ndarray, labels: list[str], cfg: KnnConfig, held_out: bool = False) -> list[dict]:
    acc, n_test = knn.knn_accuracy(emb, labels, cfg.k, cfg.test_size, cfg.seed)
    split = f"seed {cfg.seed}" + (", test documents held out of training" if held_out else "")
    rows = [dict(metric="knn_accuracy", value=acc, n=n_test, repeats=1, split=split)]
    # Other splits' test documents were trained on by a held-out model: no spread for it.
    if cfg.repeats > 1 and not held_out:
        # A 10% test split of a small corpus is noisy: report the spread over other splits too.
        scores = knn.knn_accuracy_splits(emb, labels, cfg.k, cfg.test_size, range(cfg.repeats))
        mean, std = knn.spread(scores)
        rows.append(dict(metric="knn_accuracy_splits", value=mean, std=std, n=n_test,
                         repeats=cfg.repeats, split=f"seeds 0-{cfg.repeats - 1}"))
        # each split's score: the report pairs two models' scores split by split (tasks/metrics/significance.py)
        rows += [dict(metric=PER_SPLIT, value=score, n=n_test, repeats=1, split=f"seed {seed}")
                 for seed, score in enumerate(scores)]
    return rows


def layerwise_rows(store: ArtifactStore, emb_ref: ArtifactRef, labelled: np.ndarray, labels: list[str],
                   cfg: KnnConfig) -> list[dict]:
    rows = []
    for layer in embed.embedded_layers(store, emb_ref):
        for pooling in POOLINGS:
            x = embed.read_embeddings(store, emb_ref, pooling, layer)[labelled]
            acc, n_test = knn.knn_accuracy(x, labels, cfg.k, cfg.test_size, cfg.seed)
            rows.append(dict(metric="knn_accuracy_layerwise", value=acc, n=n_test, repeats=1,
                             split=f"seed {cfg.seed}", layer=layer, pooling=pooling))
    return rows


def learning_curve_rows(store: ArtifactStore, model_ref: ArtifactRef | None) -> list[dict]:
    """kNN accuracy measured during training (train.eval_every), as catalog rows."""
    model_ref = trained_ref(store, model_ref)
    if model_ref is None or model_ref.stage != "train":
        return []
    steps = store.read_table(model_ref, "training").to_pandas()
    if "knn_accuracy" not in steps:
        return []
    steps = steps[steps["knn_accuracy"].notna()]
    return [dict(metric="knn_accuracy_curve", value=float(a), step=int(s), split="training")
            for s, a in zip(steps["step"], steps["knn_accuracy"])]


def training_health_rows(store: ArtifactStore, model_ref: ArtifactRef | None, x: retrieval.Texts) -> list[dict]:
    """How training went (collapse, divergence, a trivial view: tasks/methods/health.py) and whether the
    evaluated documents `x` ended at one vector, as catalog rows."""
    model_ref = trained_ref(store, model_ref)
    if model_ref is None or model_ref.stage != "train":
        return []
    # Older versions' train artifacts (a registered model scored again) have no health, or a verdict without
    # findings: no rows, rather than a guess from their text.
    found = store.manifest(model_ref)["extra"].get("health") or {}
    return health.health_rows(health.evaluated(found, geometry.mean_random_cosine(x))) if "findings" in found else []


class EvaluateInputs(embed.EmbeddedDocumentsInputs):
    sts_embeddings: ArtifactRef | None = None
    queries: ArtifactRef | None = None  # with query_embeddings: the held-out generated queries (docs/gpl.md)
    query_embeddings: ArtifactRef | None = None
    yardstick: ArtifactRef | None = None  # tasks/yardstick.py's held-out documents
    yardstick_embeddings: ArtifactRef | None = None  # its titles' vectors (the titles kind)


def active_dims(x: retrieval.Texts, asked: list[retrieval.Texts]) -> dict:
    """A sparse model's mean count of non-zero codes in a document (`x`) and in a query (`asked`: every embedded query
    set's, the held-out generated queries, the yardstick's), of its `width`: what an inverted index stores and visits.
    Codes as a sparse matrix, or, from an embed artifact older than the codes', as dense rows."""
    def active(v: retrieval.Texts) -> np.ndarray:
        return v.getnnz(axis=1) if sparse.issparse(v) else (v != 0).sum(1)

    return dict(documents=float(active(x).mean()), width=x.shape[1],
                queries=float(np.concatenate([active(q) for q in asked]).mean()) if asked else None)


FLOAT_BYTES = 4  # a vector's number in an index: float32
SPARSE_CODE_BYTES = 8  # a sparse code in an inverted index: its dimension (int32) and its weight (float32)


def serving_costs(store: ArtifactStore, docs_emb: ArtifactRef, active: dict | None) -> dict:
    """What serving the model costs, for comparing the families: its family, the bytes a document takes in an
    uncompressed index (a dense model's vector in float32; a multi-vector model's scoring token vectors in float32,
    where the embed stage kept them; a sparse model's active codes, 8 bytes each) and the documents its embed artifact
    encoded a second (its whole run: loading the model included, on the machine that made it)."""
    made = store.manifest(docs_emb)
    extra = made["extra"]
    family = extra.get("family", "dense")  # the embed stage's encoder's
    per_token = extra["dim"] * FLOAT_BYTES
    tokens = extra.get("tokens_per_text")  # None: the token vectors were not kept
    bytes_per_document = {"dense": per_token, "sparse": active and active["documents"] * SPARSE_CODE_BYTES,
                          "multi_vector": tokens and tokens * per_token}[family]
    return dict(family=family, bytes_per_document=bytes_per_document, documents_per_s=extra["texts"] / made["wall_s"])


def held_out_query_rows(store: ArtifactStore, queries: ArtifactRef, embeddings: ArtifactRef, search: Searcher,
                        doc_ids: list[str], out: ArtifactWriter, prefix: str, table: str) -> list[dict]:
    """Retrieval of held-out queries (the generated ones: prefix `query_`; the yardstick's titles: `title_`): each
    one's own document among all the corpus's, by cosine (a multi-vector model: MaxSim). Each query's rank and nDCG@10
    are kept too, in `table`: the report pairs two models over the queries."""
    held = held_out_queries(store, queries)
    if held.num_rows == 0:  # a small corpus can draw no held-out document: nothing to score
        return []
    position = {d: i for i, d in enumerate(doc_ids)}
    ranks = search.ranks(embeddings, np.array([position[d] for d in held["doc_id"].to_pylist()]))
    out.write_table(table, pa.table({"query_id": held["query_id"], "rank": ranks, "ndcg": retrieval.ndcg_at(ranks)}))
    return [dict(row, split=HELD_OUT) for row in retrieval.retrieval_rows(ranks, prefix=prefix)]


def yardstick_rows(store: ArtifactStore, inputs: EvaluateInputs, x: retrieval.Texts, docs: pd.DataFrame,
                   out: ArtifactWriter, search: Searcher, token_mean: bool, log: logging.Logger) -> list[dict]:
    """The yardstick (tasks/yardstick.py) by its kind: each held-out title or LLM query finds its text among the corpus
    (`title_`, `generated_`); each of the user's queries finds its relevant documents among the corpus (`qrels_`); or
    each labelled held-out document, by its vector (a multi-vector model's token vectors, by MaxSim), finds its
    label's among the labelled documents not held out (`label_`). Each query's scores go in YARDSTICK_SCORES, which
    the select stage pairs; for a consensus, each query's best documents too (YARDSTICK_TOP), which the select stage
    (and a report) fuses across the models; for the neighbours, each held-out document's nearest others, and nothing
    else (no score of one model); for the clusters, every document's nearest others and its vector, which the select
    stage groups across the models. Each by the model's similarity (`search`); a multi-vector model (`token_mean`) on
    the kinds that rank each model by itself (titles, LLM queries, the user's, labels: by MaxSim), without a
    consensus's best documents."""
    manifest = store.manifest(inputs.yardstick)
    kind, source = yardstick_kind(manifest), yardstick_source(manifest)
    if YARDSTICKS[source].queried != (inputs.yardstick_embeddings is not None):
        raise ValueError(f"a {kind} yardstick is scored {'with' if YARDSTICKS[source].queried else 'without'} its "
                         "queries' embeddings")
    if token_mean and not YARDSTICKS[source].maxsim:
        log.warning("a multi-vector model: the %s yardstick reads one vector a text, not scored by MaxSim yet", kind)
        return []
    if source in TEXT_QUERIES:
        if kind == "consensus" and not token_mean:
            held = held_out_queries(store, inputs.yardstick)
            top = pool.top_documents(search.read(inputs.yardstick_embeddings), x)
            top = pa.array(list(top.astype(np.int32)), pa.list_(pa.int32()))  # row numbers of `docs`
            own = docs.reset_index(drop=True).reset_index().set_index("doc_id")["index"][held["doc_id"].to_pylist()]
            out.write_table(YARDSTICK_TOP, pa.table({"query_id": held["query_id"], "top": top,
                                                     "own": pa.array(own.to_numpy(), pa.int32())}))
        return held_out_query_rows(store, inputs.yardstick, inputs.yardstick_embeddings, search,
                                   docs["doc_id"].tolist(), out, YARDSTICKS[source].prefix, YARDSTICK_SCORES)
    row_of = pd.Series(np.arange(len(docs)), index=docs["doc_id"])
    if source == "clusters":  # every document asks; select (and a report) groups the other models' vectors
        asked = store.read_table(inputs.yardstick, "queries", columns=["query_id", "doc_id", "status"]).to_pandas()
        asked = asked[(asked["status"] == "ok") & asked["doc_id"].isin(row_of.index)]  # those of a sample, if one
        rows = row_of[asked["doc_id"]].to_numpy()
        top = pool.neighbour_rankings(x, rows, NEAREST)  # (documents, NEAREST) rows of `docs`
        # each asking document's vector, a sparse model's as its codes
        vectors = code_columns(x[rows]) if sparse.issparse(x) else \
            {pool.VECTOR: pa.array(list(x[rows].astype(np.float32)), pa.list_(pa.float32()))}
        out.write_table(YARDSTICK_TOP, pa.table({
            "query_id": asked["query_id"], "own": pa.array(rows, pa.int32()),
            "top": pa.array(list(top.astype(np.int32)), pa.list_(pa.int32())), **vectors}))
        return []
    asked = held_out_queries(store, inputs.yardstick).to_pandas()
    if source == "neighbours":  # no score of one model: select (and a report) fuses the models' rankings
        top = pool.neighbour_rankings(x, row_of[asked["doc_id"]].to_numpy())  # (queries, depth) rows of `docs`
        out.write_table(YARDSTICK_TOP, pa.table({"query_id": asked["query_id"],
                                                 "top": pa.array(list(top.astype(np.int32)), pa.list_(pa.int32()))}))
        return []
    if source == "qrels":
        relevant = store.read_table(inputs.yardstick, "relevant").to_pandas()
        query_row = pd.Series(np.arange(len(asked)), index=asked["query_id"])
        ranks, ndcg = retrieval.qrels_ranks(search.read(inputs.yardstick_embeddings), search.docs,
                                            query_row[relevant["query_id"]].to_numpy(),
                                            row_of[relevant["doc_id"]].to_numpy(), similarity=search.similarity)
    else:
        held = store.read_table(inputs.yardstick, "queries", columns=["doc_id"])["doc_id"].to_pylist()
        labels = docs["label"].to_numpy()
        index = np.flatnonzero(docs["label"].notna().to_numpy() & ~docs["doc_id"].isin(held).to_numpy())
        queries = row_of[asked["doc_id"]].to_numpy()
        ranks, ndcg = retrieval.same_label_ranks(search.texts(queries), search.among(index), labels[queries],
                                                 labels[index], similarity=search.similarity)
    out.write_table(YARDSTICK_SCORES, pa.table({"query_id": asked["query_id"], "rank": ranks, "ndcg": ndcg}))
    rows = retrieval.set_rows(ranks, ndcg, prefix=YARDSTICKS[source].prefix)
    return [dict(row, split=HELD_OUT) for row in rows]


def build_metrics(store: ArtifactStore, job: EvalJob, inputs: EvaluateInputs,
                  out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs_emb = inputs.embeddings
    last = max(embed.embedded_layers(store, docs_emb))
    docs = store.read_table(inputs.documents, "documents").to_pandas()
    labelled = np.flatnonzero(docs["label"].notna().to_numpy())
    labels = docs["label"].iloc[labelled].tolist()
    x = embed.read_vectors(store, docs_emb, job.pooling, last)  # a sparse model's codes: kept sparse
    rows = []
    skipped = job.knn and knn.knn_skipped(labels, job.knn.k)
    if skipped:
        log.warning(skipped)
    elif job.knn:
        rows += knn_rows(x[labelled], labels, job.knn, job.knn_holdout)
        if job.layerwise:
            rows += layerwise_rows(store, docs_emb, labelled, labels, job.knn)
    pos_a = pos_b = None
    if job.sts:
        pairs = eval_sets.read_pairs(job.sts.path, job.sts.split)
        s = embed.read_embeddings(store, inputs.sts_embeddings, job.pooling)
        a, b = s[: len(pairs)], s[len(pairs) :]
        cosines, gold = sts.pair_cosines(a, b), pairs["score"].to_numpy()
        rows.append(dict(metric="sts_spearman", value=sts.cosine_spearman(cosines, gold), n=len(pairs), repeats=1,
                         split=job.sts.split))
        # Each pair's cosine: the report bootstraps the pairs to compare two models' Spearman.
        out.write_table(STS_PAIRS, pa.table({"pair": np.arange(len(pairs), dtype=np.int32), "score": gold,
                                             "cosine": cosines}))
        positive = gold >= 4  # SimCSE's positives for alignment
        pos_a, pos_b = a[positive], b[positive]
    if job.geometry:
        rows += geometry.geometry_rows(x, pos_a, pos_b)
    # A multi-vector model's one vector is its mean token vector (tasks/encoders/encode.py's TokenMeanEncoder): what
    # kNN, STS and geometry read, but not what it retrieves by: MaxSim over its token vectors.
    token_mean = out.extra["token_mean"] = bool(store.manifest(docs_emb)["extra"].get("token_mean"))
    search = searcher(store, docs_emb, job.pooling, token_mean, x, job.maxsim)
    if search is None and (inputs.query_embeddings or inputs.yardstick):
        log.warning("a multi-vector model embedded without its token vectors: its held-out query and yardstick "
                    "retrieval is not scored (not from its mean token vector either)")
    if store.manifest(docs_emb)["extra"].get("family") == "sparse":  # how sparse its codes are
        out.extra["active_dims"] = active_dims(x, [search.read(ref) for ref in (inputs.query_embeddings,
                                                                                 inputs.yardstick_embeddings) if ref])
    out.extra["serving"] = serving_costs(store, docs_emb, out.extra.get("active_dims"))
    if inputs.query_embeddings and search:
        rows += held_out_query_rows(store, inputs.queries, inputs.query_embeddings, search, docs["doc_id"].tolist(),
                                    out, "query_", QUERY_SCORES)
    if inputs.yardstick and search:
        rows += yardstick_rows(store, inputs, x, docs, out, search, token_mean, log)
    rows += learning_curve_rows(store, inputs.model) + training_health_rows(store, inputs.model, x)
    for row in rows:  # the headline rows are the model's own pooling on its last layer
        row.setdefault("layer", last)
        row.setdefault("pooling", job.pooling)
    table = metrics_table(rows, key=ref.key, model=inputs.model_name(job.model), dataset=job.dataset, status="ok")
    out.write_table("metrics", table)
    # Texts cut to the character budget before they were embedded (docs and STS pairs), for the report.
    out.extra.update(cut=sum(store.manifest(e)["extra"].get("cut", 0)
                             for e in (docs_emb, inputs.sts_embeddings, inputs.query_embeddings,
                                       inputs.yardstick_embeddings) if e is not None))
    draw_pictures(job, x[labelled], labels, table.to_pandas(), out)
    for r in rows:
        if r["metric"] not in POINTS and r["value"] is not None:
            log.info("%s = %.4f%s", r["metric"], r["value"],
                     f" ± {r['std']:.4f}" if r.get("std") is not None else "")


def draw_pictures(job: EvalJob, x: np.ndarray, labels: list[str], metrics: pd.DataFrame,
                  out: ArtifactWriter) -> None:
    title = f"{job.label} on {job.dataset}"
    if job.tsne and len(labels) > 1:
        name = plots.tsne_name(len(labels), job.tsne_max)
        plots.tsne_png(x, labels, out.folder / PICTURES["tsne"], f"{name}: {title} ({job.pooling} pooling)",
                       max_points=job.tsne_max)
        out.extra["tsne"] = dict(documents=len(labels), max_points=job.tsne_max)  # the report's caption
    curves = metrics.assign(model=job.label)
    layerwise = curves[curves["metric"] == "knn_accuracy_layerwise"]
    if len(layerwise):
        plots.layerwise_png(layerwise, out.folder / PICTURES["layerwise"], f"kNN accuracy per layer: {title}")
    curve = curves[curves["metric"] == "knn_accuracy_curve"]
    if len(curve):
        plots.learning_curve_png(curve, out.folder / PICTURES["learning_curve"], f"Learning curve: {title}")


# The STS file's digest is part of its embed artifact's key, an input of this stage.
EVALUATE = Stage("evaluate", build_metrics)
