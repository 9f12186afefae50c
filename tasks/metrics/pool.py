"""Label-free scores a model earns against a pool of other models (the `consensus`, `neighbours` and `clusters`
yardsticks of tasks/config/yardsticks.py, and information), and effective rank, the single-model baseline they are
measured beside.

- Consensus (after LARMOR, Xu et al., SIGIR 2024: fusing many retrievers' rankings of generated queries into
  pseudo-judgements ranked 47 retrievers closer to human judgements than the generated queries alone): every model
  ranks the corpus for each held-out query; the rankings are fused by reciprocal rank fusion, and each model is scored
  by nDCG@10 against the fusion of the *others* (leave-one-out), so a model's own ranking is never part of the
  judgements it is scored by: it cannot vote for itself.
- Information (after "information sufficiency", Darrin et al., NeurIPS 2024: a model whose embeddings predict the
  others' carries what they carry): the mean share of each other model's embedding variance that a ridge regression
  from this model's embeddings explains, fitted on one half of the documents and scored on the other (cross-fitted,
  so a wide embedding cannot explain noise).
- Clusters (ours, measured in benchmarks/yardsticks.py): what kNN accuracy asks of labels, asked of the pool
  instead. The other models' unit vectors side by side are split into 20 groups by k-means, and each model is
  scored by the share of each asking document's 10 nearest others (by its own vectors) that fall in that document's
  group: its neighbourhoods' purity against the others' consensus grouping (leave-one-out, as above), averaged over
  four k-means seeds. A sparse model's codes are grouped as they are, sparse.
- Term overlap (ours, measured in benchmarks/yardsticks.py; not pool-relative): the mean TF-IDF cosine between
  each document and its 10 nearest others by the model's vectors. Labels that group documents by topic group their
  words too, so a model whose neighbourhoods share words may group as the labels do, without any other model's say;
  its bias: it rewards lexical neighbours, which a paraphrase-aware model is right to look past.
- Effective rank (Roy and Vetterli 2007; RankMe, Garrido et al. 2023): exp of the entropy of the normalised singular
  values. Weak or reversed for text encoders in the literature: a baseline, not a yardstick to trust.

`pool_scores` reads what evaluate artifacts stored (YARDSTICK_TOP) for the select stage, which judges a
search's candidates by each other, and the report, which judges its models so.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import sparse

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_TOP
from storage.codes import CODES, codes_matrix
from storage.store import ArtifactStore
from storage.stores import store_at
from tasks.config.yardsticks import CLUSTERS, NEAREST, SEEDS
from tasks.metrics import block_rows, unit_rows
from tasks.metrics.retrieval import cosines

RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009)
DEPTH = 100  # each model's ranking is fused down to this depth
JUDGED = 10  # the leave-one-out fusion's top documents are the pseudo-relevant ones
VECTOR = "vector"  # the clusters yardstick's column of each asking document's vector (a sparse model's: CODES)


def top_documents(queries: np.ndarray, docs: np.ndarray, depth: int = DEPTH, own: np.ndarray | None = None
                  ) -> np.ndarray:
    """(queries, depth) row numbers of each query's best documents by cosine, best first; `own`, (queries,) row
    numbers: a query that is itself a document of `docs` (asking for its neighbours) never finds itself. Either may be
    a sparse model's codes, kept sparse."""
    q, d = unit_rows(queries, np.float32), unit_rows(docs, np.float32)
    depth = min(depth, d.shape[0] - (own is not None))
    top = np.empty((q.shape[0], depth), dtype=np.int64)
    step = block_rows(d.shape[0], 4)
    for start in range(0, q.shape[0], step):
        scores = cosines(q[start : start + step], d)  # (block, docs)
        if own is not None:
            scores[np.arange(len(scores)), own[start : start + step]] = -np.inf
        part = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]  # (block, depth), unordered
        order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
        top[start : start + step] = np.take_along_axis(part, order, axis=1)
    return top


def neighbour_rankings(x: np.ndarray, rows: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """(len(rows), depth) row numbers of each of `rows`' documents' nearest other documents among `x` (documents,
    dims), best first: the neighbours yardstick's rankings, a document asking by its own vector."""
    return top_documents(x[rows], x, depth, own=rows)


def fusion(rankings: np.ndarray, documents: int, k: int = RRF_K) -> np.ndarray:
    """(models, queries, depth) rankings → (models, queries, documents): each model's reciprocal rank fusion
    contribution, 1 / (k + rank) at each document it ranked; their sum over models is the fusion."""
    models, queries, depth = rankings.shape
    out = np.zeros((models, queries, documents), dtype=np.float32)
    weight = (1.0 / (k + np.arange(1, depth + 1))).astype(np.float32)  # (depth,)
    m, q = np.meshgrid(np.arange(models), np.arange(queries), indexing="ij")  # (models, queries) each
    out[m[..., None], q[..., None], rankings] = weight  # a ranking names a document once
    return out


def consensus_ndcg(rankings: np.ndarray, documents: int, own: np.ndarray | None = None, judged: int = JUDGED,
                   k: int = 10) -> np.ndarray:
    """(models, queries) nDCG@k of each model's ranking against pseudo-judgements fused from the other models'
    (leave-one-out): the fusion's top `judged` documents are relevant (gain 1); a query's own document, where it has
    one (`own`, (queries,) row numbers: a title's or generated query's), gain 2, as the evidence a person wrote."""
    models, queries, _ = rankings.shape
    if models < 2:
        raise ValueError("a consensus needs at least 2 models: each is judged by the others")
    parts = fusion(rankings, documents)  # (models, queries, documents)
    total = parts.sum(axis=0)  # (queries, documents)
    discount = 1 / np.log2(np.arange(2, k + 2))  # (k,)
    scores = np.empty((models, queries))
    for m in range(models):
        others = total - parts[m]  # (queries, documents): the fusion without model m
        relevant = np.argpartition(-others, judged - 1, axis=1)[:, :judged]  # (queries, judged)
        gain = np.zeros((queries, documents), dtype=np.float32)
        np.put_along_axis(gain, relevant, np.take_along_axis(others, relevant, axis=1) > 0, axis=1)
        if own is not None:
            gain[np.arange(queries), own] = 2
        got = np.take_along_axis(gain, rankings[m, :, :k], axis=1) @ discount[: rankings.shape[2]]  # (queries,)
        ideal = -np.sort(-gain, axis=1)[:, :k] @ discount  # (queries,)
        scores[m] = np.divide(got, ideal, out=np.zeros(queries), where=ideal > 0)
    return scores


def explained_share(source: np.ndarray, target: np.ndarray, alpha: float = 1.0) -> float:
    """The share of `target`'s variance (documents, d_t) a ridge regression from `source` (documents, d_s) explains
    on documents it was not fitted on: two folds, each fitted on one half and scored on the other."""
    n = len(source)
    if n < 4:
        raise ValueError(f"explained_share needs at least 4 documents, got {n}")
    halves = np.arange(n) % 2 == 0
    residual = total = 0.0
    for fit in (halves, ~halves):
        xs, ys = source[fit], target[fit]
        mx, my = xs.mean(0), ys.mean(0)
        a, b = xs - mx, ys - my
        # ridge in its dual form, closed: (n/2 x n/2) whatever the widths, no (d_s, d_t) coefficients (two SPLADE
        # models' would take 7 GB)
        dual = np.linalg.solve(a @ a.T + alpha * np.eye(len(a)), b)  # (n/2, d_t)
        pred = ((source[~fit] - mx) @ a.T) @ dual + my
        residual += float(((target[~fit] - pred) ** 2).sum())
        total += float(((target[~fit] - target[~fit].mean(0)) ** 2).sum())
    return 1 - residual / total if total > 0 else 0.0


def information(embeddings: list[np.ndarray], alpha: float = 1.0) -> np.ndarray:
    """(models,) each model's mean explained_share of every other model's unit-normalised embeddings of the same
    documents."""
    if len(embeddings) < 2:
        raise ValueError("information needs at least 2 models")
    unit = [unit_rows(x, np.float64) for x in embeddings]
    return np.array([np.mean([explained_share(unit[m], unit[j], alpha) for j in range(len(unit)) if j != m])
                     for m in range(len(unit))])


def consensus_groups(embeddings: list[np.ndarray | sparse.csr_matrix], clusters: int, seed: int = 0) -> np.ndarray:
    """(documents,) each document's group: k-means over the models' unit vectors side by side, every model weighing
    the same (a wide embedding no more than a narrow one); sparse (CSR) where a model's are codes."""
    from sklearn.cluster import KMeans

    unit = [unit_rows(x, np.float64) for x in embeddings]
    joined = sparse.hstack(unit, format="csr") if any(map(sparse.issparse, unit)) else np.concatenate(unit, axis=1)
    return KMeans(clusters, n_init=4, random_state=seed).fit_predict(joined / np.sqrt(len(embeddings)))


def group_share(nearest: np.ndarray, groups: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) the share of each of `rows`' documents' nearest others (`nearest`, (rows, k) row numbers) that
    are in its group (`groups`, (documents,))."""
    return (groups[nearest] == groups[rows][:, None]).mean(axis=1)


def cluster_purity(embeddings: list[np.ndarray], rows: np.ndarray, clusters: int = CLUSTERS, k: int = NEAREST,
                   seeds: Iterable[int] = range(SEEDS), nearest: list[np.ndarray] | None = None) -> np.ndarray:
    """(models, len(rows)) the share of each of `rows`' documents' k nearest other documents (by each model's own
    vectors, cosine; or `nearest`, each model's (rows, k) of them) that fall in its group of the consensus_groups of
    the *other* models' vectors of the same documents (leave-one-out: no model groups the documents it is judged by),
    averaged over k-means `seeds` (one seed's grouping is luck at a few thousand documents)."""
    if len(embeddings) < 2:
        raise ValueError("cluster purity needs at least 2 models: each is judged by the others' grouping")
    seeds = list(seeds)
    nearest = nearest or [neighbour_rankings(x, rows, depth=k) for x in embeddings]  # each (rows, k)
    purity = np.zeros((len(embeddings), len(rows)))
    for m in range(len(embeddings)):
        for seed in seeds:
            groups = consensus_groups(embeddings[:m] + embeddings[m + 1:], clusters, seed)  # (documents,)
            purity[m] += group_share(nearest[m], groups, rows) / len(seeds)
    return purity


def term_vectors(texts: list[str]):
    """(documents, terms) the texts' L2-normalised TF-IDF vectors (scipy sparse): sublinear term frequency, English
    stop words out, terms in at least two documents."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(sublinear_tf=True, stop_words="english", min_df=2).fit_transform(texts)


def term_overlap(nearest: np.ndarray, terms, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) the mean TF-IDF cosine between each of `rows`' documents and its nearest others (`nearest`,
    (rows, k) row numbers by a model's vectors; `terms`, term_vectors of every document)."""
    k = nearest.shape[1]
    asking = terms[np.repeat(rows, k)]  # (rows * k, terms): each document once per neighbour
    return np.asarray(asking.multiply(terms[nearest.ravel()]).sum(axis=1)).reshape(len(rows), k).mean(axis=1)


def effective_rank(x: np.ndarray) -> float:
    """exp(entropy) of the normalised singular values of the centred embeddings (documents, dims): 1 for vectors on
    a line, up to min(documents, dims)."""
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    p = s / s.sum() if s.sum() > 0 else np.ones(1)
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def pool_scores(store: ArtifactStore, pool: dict[str, ArtifactRef]) -> dict[str, pd.Series]:
    """Each model's per-query score against the others of `pool` (name → its evaluate artifact on one pooled
    yardstick, whose YARDSTICK_TOP table holds what each model found), by query id: no model judges itself. A
    consensus or the neighbours: nDCG@10 against the others' fused rankings (consensus_ndcg); the clusters: each
    document's neighbours' purity in the others' grouping (cluster_purity). Remembered for a few pools by the store's
    address and the artifacts' bytes (their manifests' SHA-256): the select flow judges each rung's pool, and its
    stage the same pools again."""
    held = tuple((name, ref, store.files_digest(ref)) for name, ref in pool.items())
    return {name: scores.copy() for name, scores in _judged(store.url, held)}


def top_vectors(table: pa.Table) -> np.ndarray | sparse.csr_matrix:
    """(rows, dims) a clusters yardstick's vectors (its YARDSTICK_TOP table) in the table's order: dense rows, or a
    sparse model's codes, kept sparse."""
    if VECTOR not in table.column_names:
        return codes_matrix(table)
    vectors = table[VECTOR].combine_chunks()
    return vectors.flatten().to_numpy().reshape(len(vectors), -1)


@functools.lru_cache(maxsize=8)
def _judged(url: str, pool: tuple[tuple[str, ArtifactRef, str], ...]) -> tuple[tuple[str, pd.Series], ...]:
    store = store_at(url)
    tables = {name: store.read_table(ref, YARDSTICK_TOP) for name, ref, _ in pool}
    tops = {name: t.drop_columns([c for c in (VECTOR, *CODES) if c in t.column_names]).to_pandas()
            .set_index("query_id").sort_index() for name, t in tables.items()}
    first, first_table = next(iter(tops.values())), next(iter(tables.values()))
    rankings = np.stack([np.stack(t.loc[first.index, "top"].to_numpy()) for t in tops.values()])  # (models, q, depth)
    if {VECTOR, CODES[0]} & set(first_table.column_names):  # the clusters: every document asks
        own = first["own"].to_numpy()  # each asking document's row among the evaluated documents
        asking = first.index[np.argsort(own)]  # the queries in the documents' order
        vectors = [top_vectors(t)[pd.Index(t["query_id"].to_pandas()).get_indexer(asking)]
                   for t in tables.values()]  # each (documents, dims)
        scores = cluster_purity(vectors, own, nearest=list(rankings))  # (models, queries)
    else:
        own = first["own"].to_numpy() if "own" in first else None  # a text query's own document (not the neighbours')
        documents = int(max(rankings.max(), own.max() if own is not None else 0)) + 1
        scores = consensus_ndcg(rankings, documents, own=own)  # (models, queries)
    return tuple((name, pd.Series(row, index=first.index)) for name, row in zip(tops, scores))
