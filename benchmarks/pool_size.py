"""How small a pool can judge itself? The clusters kind's agreement with the truth as select's pool shrinks.

A pooled yardstick judges each candidate by the others (tasks/metrics/pool.py), so its decision rests on how many
others there are: select's pool is the untrained model and every candidate (from a decoder LLM with one learning rate,
two of them). From the stored runs of benchmarks/yardsticks.py (its 13 models: the untrained one and 12 candidates),
every pool of the untrained model and s - 1 candidates (all such pools where they are few, else --draws of them at
random) is judged alone, each model's clusters purity against the k-means grouping of the *others of that pool*, and
compared with the truth (kNN accuracy over the same models):

    tau      Kendall's tau-b of the pool's clusters scores against the truth, over the pool's models (mean over pools)
    first    the share of pools whose first-ranked model is the truth's best of that pool
    regret   what picking the first-ranked model loses on the truth against that pool's best (mean over pools)

Usage: python benchmarks/pool_size.py --store DIR --corpora medical [--sizes 3 4 5 7 13] [--draws 40] [--seeds 1]

--seeds: k-means seeds averaged (the kind averages four; one keeps the run short). Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np
from scipy import stats
from select_recipe import scores
from yardsticks import pooled, stored_run

from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.yardsticks import NEAREST
from tasks.metrics import pool
from tasks.reporting.tables import PER_SPLIT


def pools_of(candidates: int, size: int, draws: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Pools of the untrained model (row 0) and size - 1 of the candidates (rows 1..candidates): every one where they
    are at most `draws`, else `draws` distinct ones at random."""
    every = list(itertools.combinations(range(1, candidates + 1), size - 1))
    if len(every) > draws:
        rng = np.random.default_rng(seed)
        every = [every[i] for i in sorted(rng.choice(len(every), draws, replace=False))]
    return [(0, *members) for members in every]


def judged(vectors: list[np.ndarray], nearest: list[np.ndarray], truth: np.ndarray, members: tuple[int, ...],
           seeds: int) -> tuple[float, bool, float]:
    """(tau, whether its first is the pool's best on the truth, regret) of one pool judged alone."""
    rows = np.arange(len(vectors[0]))
    purity = pool.cluster_purity([vectors[m] for m in members], rows, seeds=range(seeds),
                                 nearest=[nearest[m] for m in members]).mean(axis=1)  # (pool,)
    own = truth[list(members)]  # (pool,)
    first = int(np.argmax(purity))
    return float(stats.kendalltau(own, purity).statistic), first == int(np.argmax(own)), float(own.max() - own[first])


def one_corpus(name: str, args: argparse.Namespace) -> dict:
    store = ArtifactStore(args.store)
    catalog = Catalog(store)
    run_id = stored_run(catalog, name, "titles", args.docs)
    models = pooled(store, catalog, run_id)
    truths = scores(catalog, run_id, PER_SPLIT)
    base = next(m for m in models if m.startswith("base"))
    labels = [base] + sorted(m for m in models if m != base)  # row 0: the untrained model, in every pool
    vectors = [models[m]["docs"] for m in labels]
    truth = np.array([np.mean(truths[m]) for m in labels])
    nearest = [pool.neighbour_rankings(x, np.arange(len(x)), NEAREST) for x in vectors]
    sizes = {}
    for size in args.sizes:
        pools = pools_of(len(labels) - 1, size, args.draws)
        got = [judged(vectors, nearest, truth, members, args.seeds) for members in pools]
        taus, firsts, regrets = (np.array(column, dtype=float) for column in zip(*got))
        sizes[size] = dict(pools=len(pools), tau=float(np.nanmean(taus)), first=float(firsts.mean()),
                           regret=float(regrets.mean()), tau_q25=float(np.nanquantile(taus, 0.25)))
        print(f"{name} pool of {size:>2} ({len(pools):>2} pools): tau {sizes[size]['tau']:+.2f} (lower quartile "
              f"{sizes[size]['tau_q25']:+.2f}), first is the best in {sizes[size]['first']:.0%}, regret "
              f"{sizes[size]['regret']:.4f}", flush=True)
    return dict(corpus=name, run_id=run_id, models=labels, truth=truth.tolist(), sizes=sizes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True, help="a store benchmarks/yardsticks.py ran in")
    p.add_argument("--corpora", nargs="+", required=True)
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--sizes", nargs="+", type=int, default=[3, 4, 5, 7, 13])
    p.add_argument("--draws", type=int, default=40, help="at most this many pools of each size")
    p.add_argument("--seeds", type=int, default=1, help="k-means seeds averaged in each pool")
    args = p.parse_args()
    start = time.perf_counter()
    rows = [one_corpus(name, args) for name in args.corpora]
    print(json.dumps(dict(corpora=rows, sizes=args.sizes, draws=args.draws, seeds=args.seeds, docs=args.docs,
                          wall_s=round(time.perf_counter() - start, 1))))


if __name__ == "__main__":
    main()
