"""How well does each label-free yardstick rank trained candidates? Kendall's tau against the truth labels give.

For each corpus (--corpora: the demo's OHSUMED abstracts, arXiv 2007, medical abstracts and 20 Newsgroups, with labels;
SciFact, with the test claims' relevance judgements), the first --docs documents are made into a pool of candidates:
every --recipes x --lrs x --budgets (`train.max_steps`) from all-MiniLM-L6-v2, and the untrained model, all trained
and embedded by `embforge run` (configs/select.yaml's fields) into one --store, with `evaluate.yardstick` holding
--held-out of the documents (seed 0; default select's `auto`: 500 of them, 10-25% of the corpus) out of every
candidate's training. Two runs per corpus share every train and embed artifact: one with the `titles` yardstick (and
labelled kNN), one with the LLM-`queries` yardstick (offline SmolLM2, at most --queries queries; --no-llm skips it and
its two columns). Each candidate's score on each yardstick:
    titles, queries         mean nDCG@10 of held-out titles / generated queries finding their own document
                            (title_ndcg_at_10, generated_ndcg_at_10 of the evaluate stage)
    consensus_titles,       tasks/metrics/pool.py's consensus_ndcg: each model's top documents for the same queries
    consensus_queries       over the corpus (from the embeddings cache), judged by the others' fusion; pool = all
    neighbours              the same with each held-out document asking, by its own vector, for its nearest others
                            (no titles, no LLM: the grouping kNN measures, asked without labels; select's kind too)
    clusters                pool.cluster_purity: each held-out document's 10 nearest others (by the model's own
                            vectors) in its group of the others' k-means consensus (20 groups of every document;
                            leave-one-out); clusters_all: every document asks (no titles, no LLM, no labels);
                            clusters_seeds: clusters_all averaged over k-means seeds 0-3, the `clusters` kind
                            of select (tasks/metrics/pool.py's cluster_purity with its defaults)
    neighbours_all          the neighbours with every document asking
    combined                the mean of each model's ranks on titles, neighbours and clusters_all
    information             pool.information of the held-out documents' embeddings (pool = all)
    terms                   pool.term_overlap: every document's mean TF-IDF cosine with its 10 nearest others by the
                            model's vectors (not pool-relative; the words group the documents, not the other models)
    effective_rank          pool.effective_rank of them (a baseline)
Truth: kNN accuracy (knn_accuracy_splits, the mean over 10 splits) on labelled corpora; on SciFact the test claims'
nDCG@10 over the corpus (every judged document relevant), each claim encoded by the model, the corpus from the cache.
Per corpus and yardstick: Kendall's tau-b of the yardstick's scores against the truth over the candidates, and a
one-sided permutation p-value (H1: tau > 0): p = (1 + #{permutations of the yardstick's scores with tau >= observed})
/ (1 + --perms); and the model it ranks first with its regret, the truth's best score minus that model's (what
picking by the yardstick would have lost: the untrained model is among those ranked). A rerun recomputes nothing
but the pool scores and the SciFact claims; --from-store reads the store's last runs of each corpus instead of
running (the figures of a store made earlier, whatever code made it).
Split halves (`halves`): how well the truth and the titles and LLM queries each agree with themselves, the mean tau
between two random halves of their units (kNN's splits, SciFact's claims, the yardstick's queries), and each
yardstick's half against the truth's: where a yardstick's halves agree well and it still disagrees with the truth at
the same size, it is measuring something else, which more queries will not mend.
Usage:
    python benchmarks/yardsticks.py [--corpora demo arxiv medical newsgroups scifact] [--docs 2000] [--data DIR]
        [--recipes crops dropout tsdae] [--lrs 2e-5 1e-4] [--budgets 40 120] [--queries 300] [--no-llm]
        [--held-out auto] [--perms 10000]
        [--store DIR] [--from-store] [--config FILE] [--set FIELD=VALUE ...]
Prints a table per corpus and a summary (median tau over corpora, corpora with p < 0.05), then ONE final line of JSON
with every figure (each candidate's truth and yardstick scores too).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from corpora import LABELLED, corpora_folder, labelled_file
from scipy import stats
from select_recipe import REPO, embforge, evaluated_model, latest, scores

from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks import embed
from tasks.config.splits import HeldOutShare
from tasks.config.yardsticks import NEAREST, SEEDS
from tasks.core.held_out import held_out_queries
from tasks.encoders.encode import encoder_at
from tasks.metrics import pool, retrieval
from tasks.reporting.tables import PER_SPLIT
from tasks.select import yardstick_scores

CORPORA = [*LABELLED, "scifact"]
YARDSTICK_NAMES = ["titles", "queries", "consensus_titles", "consensus_queries", "neighbours", "neighbours_all",
                   "clusters", "clusters_all", "clusters_seeds", "combined", "information", "terms", "effective_rank"]
COMBINED = ("titles", "neighbours", "clusters_all")  # combined: the mean of these three rankings (chosen beforehand)
LLM_NAMES = {"queries", "consensus_queries"}  # the LLM-queries run's (--no-llm leaves them out)
KNN = {"k": 10, "test_size": 0.1, "seed": 42, "repeats": 10}
ROWS_PER_DOC = 0.5  # a lower bound on a view's training rows per document, to give every budget epochs enough


def permutation_tau(truth: np.ndarray, score: np.ndarray, perms: int, seed: int = 0) -> tuple[float, float]:
    """Kendall's tau-b of `score` against `truth` and its one-sided permutation p-value (H1: tau > 0)."""
    i, j = np.triu_indices(len(truth), 1)
    sx = np.sign(truth[i] - truth[j])
    rng = np.random.default_rng(seed)
    ys = np.vstack([score, np.array([rng.permutation(score) for _ in range(perms)])])  # (1 + perms, n)
    sy = np.sign(ys[:, i] - ys[:, j])
    denominator = np.sqrt(np.count_nonzero(sx) * np.count_nonzero(sy, axis=1).astype(float))
    taus = np.divide(sy @ sx, denominator, out=np.zeros(len(ys)), where=denominator > 0)
    return float(taus[0]), float((1 + np.sum(taus[1:] >= taus[0] - 1e-12)) / (1 + perms))


def split_half_tau(a: np.ndarray, b: np.ndarray | None = None, rounds: int = 500, seed: int = 0) -> float:
    """The mean Kendall tau-b, over `rounds` random halvings of the units (columns: a measure's splits or queries;
    rows: the models), between the models' means over half of `a`'s units and over the other half (`b` None: how
    well the measure agrees with itself), or over half of `b`'s (how well two measures agree at that size)."""
    rng = np.random.default_rng(seed)
    taus = []
    for _ in range(rounds):
        first, second = np.array_split(rng.permutation(a.shape[1]), 2)
        other = b[:, np.array_split(rng.permutation(b.shape[1]), 2)[0]] if b is not None else a[:, second]
        taus.append(stats.kendalltau(a[:, first].mean(axis=1), other.mean(axis=1)).statistic)
    return float(np.nanmean(taus))


def corpus_file(name: str, args: argparse.Namespace) -> tuple[Path, pd.DataFrame | None]:
    """The corpus's file (with `data.limit` taking its first --docs) and, for SciFact, the test claims' qrels. SciFact:
    the first --docs documents and every document a test claim needs, written next to the store; a labelled corpus
    with empty texts (20 Newsgroups has posts that are all quote or header) without them, written there too."""
    folder = corpora_folder(args.store)
    if name in LABELLED:
        return labelled_file(name, args.data, folder), None
    corpus = pd.read_parquet(Path(args.data) / "scifact_corpus.parquet")
    qrels = pd.read_parquet(Path(args.data) / "scifact_qrels.parquet")
    qrels = qrels[(qrels["split"] == "test") & (qrels["score"] > 0)].astype({"doc_id": str, "query_id": str})
    corpus["doc_id"] = corpus["doc_id"].astype(str)
    keep = corpus.head(args.docs)["doc_id"].tolist() + qrels["doc_id"].tolist()
    corpus = corpus[corpus["doc_id"].isin(set(keep))].drop(columns=["label"])
    path = folder / f"scifact-{args.docs}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        corpus.to_parquet(path, index=False)
    return path, qrels[qrels["doc_id"].isin(set(corpus["doc_id"]))]


def candidates(args: argparse.Namespace) -> list[dict]:
    """One method per recipe x learning rate x budget, each trained `budget` steps (train.max_steps) over epochs
    enough for any view."""
    per_epoch = max(1, int(ROWS_PER_DOC * (1 - held_out(args).share(args.docs)) * args.docs) // 32)
    return [dict(name=f"{recipe}@{lr:g}x{steps}", recipe=recipe,
                 train=dict(lr=lr, max_steps=steps, epochs=math.ceil(steps / per_epoch), on_unhealthy="warn"))
            for recipe in args.recipes for lr in args.lrs for steps in args.budgets]


def held_out(args: argparse.Namespace) -> HeldOutShare:
    """The yardstick's held-out share (--held-out: a share, or select's `auto`), seed 0 in every run."""
    return HeldOutShare(held_out=args.held_out if args.held_out == "auto" else float(args.held_out), seed=0)


def run(name: str, path: Path, kind: str, args: argparse.Namespace, labelled: bool) -> tuple[str, float]:
    """`embforge run` of every candidate with the `kind` yardstick: (its run id, wall seconds)."""
    if args.from_store:
        return stored_run(Catalog(ArtifactStore(args.store)), name, kind, args.docs), 0.0
    yardstick = dict(kind=kind, **held_out(args).model_dump(), max_queries=args.queries if kind == "queries" else 1000)
    sets = [f"name=yardsticks-{name}", f"data.path={path}", f"data.name={name}-{args.docs}",
            f"methods={json.dumps(candidates(args))}", f"evaluate.yardstick={json.dumps(yardstick)}",
            f"evaluate.knn={json.dumps(KNN if labelled and kind == 'titles' else None)}", *args.sets]
    if name in LABELLED:
        sets.append(f"data.limit={args.docs}")
    seconds = embforge("run", args.config, "--store", args.store, *(a for s in sets for a in ("--set", s)))
    return latest(Catalog(ArtifactStore(args.store)), "pipeline"), seconds


def stored_run(catalog: Catalog, name: str, kind: str, docs: int) -> str:
    """The store's last completed run of corpus `name` at `docs` documents with the `kind` yardstick (--from-store)."""
    for r in catalog.query("SELECT run_id, config FROM runs WHERE name = ? AND flow = 'pipeline' AND "
                           "status = 'completed' ORDER BY started_at DESC", [f"yardsticks-{name}"]):
        config = json.loads(r["config"])
        if config["evaluate"]["yardstick"]["kind"] == kind and config["data"]["name"] == f"{name}-{docs}":
            return r["run_id"]
    raise SystemExit(f"--from-store: no completed run of {name} at {docs} documents with the {kind} yardstick")


def pooled(store: ArtifactStore, catalog: Catalog, run_id: str) -> dict[str, dict]:
    """Each model of a run (by label): its evaluate manifest's roles and config, its held-out queries and vectors."""
    out = {}
    for r in catalog.query("SELECT label, key FROM run_stages WHERE run_id = ? AND stage = 'evaluate'", [run_id]):
        manifest = store.manifest(ArtifactRef("evaluate", r["key"]))
        roles, pooling = manifest["input_roles"], manifest["config"]["pooling"]
        held = held_out_queries(store, ArtifactRef("yardstick", roles["yardstick"])).to_pandas()
        out[r["label"]] = dict(
            manifest=manifest, held=held, pooling=pooling,
            docs=embed.read_embeddings(store, ArtifactRef("embed", roles["embeddings"]), pooling),
            queries=embed.read_embeddings(store, ArtifactRef("embed", roles["yardstick_embeddings"]), pooling))
    return out


def consensus(models: dict[str, dict], labels: list[str], doc_ids: list[str]) -> np.ndarray:
    """Each model's mean consensus nDCG@10 over the held-out queries (the same in every model's artifact)."""
    held = models[labels[0]]["held"]
    own = pd.Series(np.arange(len(doc_ids)), index=doc_ids)[held["doc_id"]].to_numpy()
    rankings = np.stack([pool.top_documents(models[m]["queries"], models[m]["docs"]) for m in labels])
    return pool.consensus_ndcg(rankings, len(doc_ids), own=own).mean(axis=1)


def neighbours(models: dict[str, dict], labels: list[str], held: np.ndarray) -> np.ndarray:
    """Each model's mean consensus nDCG@10 with the held-out documents (`held`: their rows) asking for their nearest
    other documents, judged by the others' fusion."""
    rankings = np.stack([pool.neighbour_rankings(models[m]["docs"], held) for m in labels])
    return pool.consensus_ndcg(rankings, len(models[labels[0]]["docs"])).mean(axis=1)


def claims_ndcg(store: ArtifactStore, model: dict, qrels: pd.DataFrame, doc_ids: list[str]) -> np.ndarray:
    """Each SciFact test claim's nDCG@10 over the corpus: each claim encoded by the model, the corpus cached."""
    source = evaluated_model(store, ArtifactRef("evaluate", model["manifest"]["key"]))
    claims = qrels.drop_duplicates("query_id").reset_index(drop=True)
    vectors = encoder_at(source, device="cpu", pooling=model["pooling"]).encode(claims["query"].tolist())
    query_row = pd.Series(np.arange(len(claims)), index=claims["query_id"])
    doc_row = pd.Series(np.arange(len(doc_ids)), index=doc_ids)
    _, ndcg = retrieval.qrels_ranks(vectors, model["docs"], query_row[qrels["query_id"]].to_numpy(),
                                    doc_row[qrels["doc_id"]].to_numpy())
    return np.asarray(ndcg, dtype=float)


def one_corpus(name: str, args: argparse.Namespace) -> dict:
    path, qrels = corpus_file(name, args)
    labelled = qrels is None
    titled, titles_s = run(name, path, "titles", args, labelled)
    print(f"{name}: titles run {titles_s / 60:.1f} min", flush=True)
    store = ArtifactStore(args.store)
    catalog = Catalog(store)
    by_titles = pooled(store, catalog, titled)
    by_queries, queries_s = by_titles, 0.0  # --no-llm: the LLM's columns are left out below
    if args.llm:
        asked, queries_s = run(name, path, "queries", args, labelled)
        print(f"{name}: queries run {queries_s / 60:.1f} min", flush=True)
        by_queries = pooled(store, catalog, asked)
    labels = sorted(by_titles)
    assert sorted(by_queries) == labels, (labels, sorted(by_queries))
    corpus = store.read_table(ArtifactRef("ingest", by_titles[labels[0]]["manifest"]["input_roles"]["documents"]),
                              "documents", columns=["doc_id", "text"])
    documents = corpus["doc_id"].to_pylist()
    apart = [m for m in labels if by_titles[m]["manifest"]["input_roles"]["embeddings"] !=
             by_queries[m]["manifest"]["input_roles"]["embeddings"]]
    # the same documents' vectors in both runs, one cache; stored runs that other code made may differ (each run's
    # scores are then its own vectors')
    assert args.from_store or not apart, apart
    if apart:
        print(f"{name}: the two stored runs embedded the documents apart for {len(apart)} of {len(labels)} models")
    held = pd.Series(np.arange(len(documents)), index=documents)[by_titles[labels[0]]["held"]["doc_id"].unique()]
    start = time.perf_counter()
    vectors = [by_titles[m]["docs"] for m in labels]
    # (models, documents): every document's cluster purity, one grouping per model (k-means seed 0); the held-out ones
    # are a subset; and the clusters kind's (select's `kind: clusters`: k-means seeds averaged)
    nearest = [pool.neighbour_rankings(x, np.arange(len(documents)), NEAREST) for x in vectors]
    per_seed = [pool.cluster_purity(vectors, np.arange(len(documents)), seeds=[seed], nearest=nearest)
                for seed in range(SEEDS)]  # each k-means once: seed 0's is the single-seed columns' too
    purity, seeded = per_seed[0], np.mean(per_seed, axis=0).mean(axis=1)
    words = pool.term_vectors(corpus["text"].to_pylist())
    # (models, queries): each held-out query's nDCG@10; their means are the evaluate stage's title_/generated_ndcg_at_10
    per_query = {kind: np.array([yardstick_scores(store, ArtifactRef("evaluate", models[m]["manifest"]["key"]))
                                 .to_numpy() for m in labels])
                 for kind, models in [("titles", by_titles), ("queries", by_queries)][:1 + args.llm]}
    table = dict(titles=per_query["titles"].mean(axis=1).tolist(),
                 consensus_titles=consensus(by_titles, labels, documents).tolist(),
                 neighbours=neighbours(by_titles, labels, held.to_numpy()).tolist(),
                 neighbours_all=neighbours(by_titles, labels, np.arange(len(documents))).tolist(),
                 clusters=purity[:, held].mean(axis=1).tolist(), clusters_all=purity.mean(axis=1).tolist(),
                 clusters_seeds=seeded.tolist(),
                 information=pool.information([x[held] for x in vectors]).tolist(),
                 terms=[pool.term_overlap(n, words, np.arange(len(documents))).mean() for n in nearest],
                 effective_rank=[pool.effective_rank(x[held]) for x in vectors])
    table["combined"] = np.mean([stats.rankdata(table[y]) for y in COMBINED], axis=0).tolist()
    if args.llm:
        table.update(queries=per_query["queries"].mean(axis=1).tolist(),
                     consensus_queries=consensus(by_queries, labels, documents).tolist())
    if labelled:  # (models, kNN's splits)
        units = np.array([scores(catalog, titled, PER_SPLIT)[m] for m in labels])
    else:  # (models, SciFact's test claims)
        units = np.array([claims_ndcg(store, by_titles[m], qrels, documents) for m in labels])
    truth = units.mean(axis=1).tolist()
    halves = dict(truth=split_half_tau(units), **{kind: split_half_tau(q) for kind, q in per_query.items()},
                  **{f"{kind}_truth": split_half_tau(q, units) for kind, q in per_query.items()})
    pool_s = time.perf_counter() - start
    results = {y: dict(zip(("tau", "p"), permutation_tau(np.array(truth), np.array(table[y]), args.perms)),
                       # the model the yardstick ranks first, and what it loses on the truth to the truth's best
                       first=labels[int(np.argmax(table[y]))], regret=max(truth) - truth[int(np.argmax(table[y]))])
               for y in YARDSTICK_NAMES if y in table}
    print(f"\n{name}: {len(labels)} models, {len(documents)} documents, {len(held)} held out, "
          f"{len(by_titles[labels[0]]['held'])} titles, {len(by_queries[labels[0]]['held']) if args.llm else 'no'} "
          "generated queries; "
          f"truth {'kNN accuracy' if labelled else 'SciFact test claims nDCG@10'}")
    print(f"  {'yardstick':<18} {'tau':>6} {'p':>7}  {'first':<22} {'regret':>6}  (truth's best: "
          f"{labels[int(np.argmax(truth))]})")
    for y, r in results.items():
        print(f"  {y:<18} {r['tau']:>+6.2f} {r['p']:>7.4f}  {r['first']:<22} {r['regret']:>6.3f}")
    print(f"  split halves: the truth's agree at {halves['truth']:+.2f}; " + "; ".join(
        f"the {kind}' at {halves[kind]:+.2f}, with the truth's at {halves[kind + '_truth']:+.2f}"
        for kind in per_query))
    print(f"  {'model':<22} {'truth':>6} " + " ".join(f"{y[:10]:>10}" for y in results))
    for i, m in enumerate(labels):
        print(f"  {m:<22} {truth[i]:>6.3f} " + " ".join(f"{table[y][i]:>10.4f}" for y in results))
    print(flush=True)
    return dict(corpus=name, documents=len(documents), held_out=len(held),
                titles_asked=len(by_titles[labels[0]]["held"]),
                queries_asked=len(by_queries[labels[0]]["held"]) if args.llm else None,
                truth_kind="knn_accuracy_splits" if labelled else "scifact_test_ndcg_at_10",
                models=labels, truth=dict(zip(labels, truth)), scores={y: dict(zip(labels, table[y])) for y in table},
                tau={y: r["tau"] for y, r in results.items()}, p={y: r["p"] for y, r in results.items()},
                first={y: r["first"] for y, r in results.items()}, regret={y: r["regret"] for y, r in results.items()},
                halves=halves,
                titles_run_s=round(titles_s, 1), queries_run_s=round(queries_s, 1), pool_s=round(pool_s, 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpora", nargs="+", default=CORPORA, choices=CORPORA)
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--docs", type=int, default=2000, help="the first N documents of each corpus")
    p.add_argument("--recipes", nargs="+", default=["crops", "dropout", "tsdae"])
    p.add_argument("--lrs", nargs="+", type=float, default=[2e-5, 1e-4])
    p.add_argument("--budgets", nargs="+", type=int, default=[40, 120], help="training steps (train.max_steps)")
    p.add_argument("--queries", type=int, default=300, help="at most this many generated held-out queries ask")
    p.add_argument("--no-llm", dest="llm", action="store_false", help="only the titles run: no LLM queries (their "
                   "two columns left out)")
    p.add_argument("--held-out", default="auto", help="the yardstick's held-out share, or auto (select's: 500 "
                   "documents, 10-25%% of the corpus)")
    p.add_argument("--perms", type=int, default=10_000)
    p.add_argument("--config", default=str(REPO / "configs" / "select.yaml"))
    p.add_argument("--store", default=str(REPO.parent / "embforge-store"))
    p.add_argument("--from-store", action="store_true", help="read the store's last completed runs of each corpus "
                   "(named yardsticks-CORPUS) instead of running them")
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args()
    start = time.perf_counter()
    rows = [one_corpus(name, args) for name in args.corpora]
    summary = {y: dict(median_tau=float(np.median([r["tau"][y] for r in rows])),
                       significant=sum(r["p"][y] < 0.05 for r in rows), corpora=len(rows),
                       mean_regret=float(np.mean([r["regret"][y] for r in rows]))) for y in rows[0]["tau"]}
    print(f"summary over {len(rows)} corpora: yardstick, median tau, corpora with p < 0.05, mean regret of its first")
    for y, s in summary.items():
        print(f"  {y:<18} {s['median_tau']:>+6.2f} {s['significant']:>3}/{s['corpora']} {s['mean_regret']:>7.3f}")
    print(json.dumps(dict(corpora=rows, summary=summary, docs=args.docs, recipes=args.recipes, lrs=args.lrs,
                          budgets=args.budgets, held_out=args.held_out, llm=args.llm, perms=args.perms,
                          config=args.config, sets=args.sets,
                          wall_s=round(time.perf_counter() - start, 1))))


if __name__ == "__main__":
    main()
