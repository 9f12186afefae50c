"""Benchmark a sparse model's query against its index: the codes kept sparse and scored through each dimension's
posting list (`retrieval.postings_index`, what evaluation and the latency stage use) against the same codes as dense
rows (how they were scored before), one query at a time as the latency stage asks.

The codes are drawn at random (seed 0): --docs documents of --active codes each and queries of --query-active,
among --width dimensions (30,522: a SPLADE model's vocabulary; 1,536: a CSR model's). The sides alternate over
--rounds rounds, in reversed order every other round; each round times every query once; the figure is the median
round's mean milliseconds a query. Both sides must give the same scores, or the benchmark stops.
Usage:
    python benchmarks/sparse_search.py [--widths 30522,1536] [--docs 5000] [--active 120] [--query-active 30]
Prints a line per width, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from scipy import sparse
from train_step import alternating

from tasks.metrics.retrieval import scorer


def codes(rng: np.random.Generator, n: int, active: int, width: int) -> sparse.csr_matrix:
    """(n, width) random codes, `active` a row (fewer where a dimension is drawn twice)."""
    rows = np.repeat(np.arange(n), active)
    return sparse.csr_matrix((rng.random(n * active, dtype=np.float32), (rows, rng.integers(0, width, n * active))),
                             shape=(n, width))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="30522,1536")
    p.add_argument("--docs", type=int, default=5000)
    p.add_argument("--active", type=int, default=120)
    p.add_argument("--query-active", type=int, default=30)
    p.add_argument("--queries", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    results = []
    for width in (int(w) for w in args.widths.split(",")):
        docs, queries = codes(rng, args.docs, args.active, width), codes(rng, args.queries, args.query_active, width)
        sides = {"postings": (scorer(docs, "dot"), [queries[i] for i in range(args.queries)]),
                 "dense rows": (scorer(docs.toarray(), "dot"), [queries[i].toarray() for i in range(args.queries)])}
        same = [np.abs(sides["postings"][0](q)(slice(0, 1)) - sides["dense rows"][0](d)(slice(0, 1))).max()
                for q, d in zip(sides["postings"][1], sides["dense rows"][1])]
        if max(same) > 1e-4:
            raise SystemExit(f"width {width}: the two sides' scores differ by {max(same)}")

        def measure(side: str) -> float:
            index, asked = sides[side]
            start = time.perf_counter()
            for q in asked:
                index(q)(slice(0, 1))
            return 1000 * (time.perf_counter() - start) / len(asked)

        rounds = alternating(measure, sides, args.rounds)
        ms = {side: statistics.median(values) for side, values in rounds.items()}
        results.append(dict(width=width, ms_per_query=ms, speedup=ms["dense rows"] / ms["postings"],
                            rounds_ms=rounds, max_score_difference=float(max(same))))
        print(f"width {width:>6}: postings {ms['postings']:.2f} ms, dense rows {ms['dense rows']:.2f} ms a query "
              f"({results[-1]['speedup']:.1f}x)", flush=True)
    print(json.dumps(dict(docs=args.docs, active=args.active, query_active=args.query_active, queries=args.queries,
                          rounds=args.rounds, results=results)))


if __name__ == "__main__":
    main()
