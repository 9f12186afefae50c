"""Benchmark the evaluate stage's one-vector metrics on a sparse model's codes: kept sparse (what the stage does since
the codes are read once, `embed.read_vectors`) against the same codes as dense rows (what it did before: the codes
read back with their zeros), on kNN accuracy and the geometry rows.

The codes are drawn at random (seed 0, as benchmarks/sparse_search.py draws them): --docs documents of --active codes
each among --width dimensions (30,522: a SPLADE model's vocabulary), with labels of --classes classes. Each side's
peak memory is traced (tracemalloc: NumPy's and SciPy's arrays, the dense copy included) and its seconds timed; the
sides alternate over --rounds rounds, in reversed order every other round, and the figure is each side's median round.
Both sides must give the same scores, or the benchmark stops.
Usage:
    python benchmarks/sparse_evaluate.py [--docs 4000] [--width 30522] [--active 120] [--classes 10] [--rounds 2]
Prints a line per side, then ONE final line of JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

import numpy as np
from sparse_search import codes
from train_step import alternating

from tasks.metrics import geometry, knn


def scores(x, labels: np.ndarray) -> list[float]:
    """What the evaluate stage computes from the documents' vectors alone: kNN accuracy and the geometry rows."""
    return [knn.knn_accuracy(x, labels, 10, 0.1, 42)[0], *(r["value"] for r in geometry.geometry_rows(x))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=4000)
    p.add_argument("--width", type=int, default=30522)
    p.add_argument("--active", type=int, default=120)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    stored = codes(rng, args.docs, args.active, args.width)
    labels = rng.integers(0, args.classes, args.docs)
    sides = {"sparse": lambda: stored, "dense rows": stored.toarray}
    got, peaks = {}, {side: [] for side in sides}

    def measure(side: str) -> float:
        tracemalloc.start()
        start = time.perf_counter()
        got[side] = scores(sides[side](), labels)
        seconds = time.perf_counter() - start
        peaks[side].append(tracemalloc.get_traced_memory()[1] / 2**20)  # MiB
        tracemalloc.stop()
        return seconds

    rounds = alternating(measure, sides, args.rounds)
    difference = float(np.max(np.abs(np.array(got["sparse"]) - np.array(got["dense rows"]))))
    if difference > 1e-6:
        raise SystemExit(f"the two sides' scores differ by {difference}: {got}")
    seconds = {side: statistics.median(values) for side, values in rounds.items()}
    peak_mib = {side: statistics.median(values) for side, values in peaks.items()}
    for side in sides:
        print(f"{side:>10}: {seconds[side]:.1f} s, peak {peak_mib[side]:,.0f} MiB", flush=True)
    print(json.dumps(dict(docs=args.docs, width=args.width, active=args.active, classes=args.classes,
                          rounds=args.rounds, seconds=seconds, peak_mib=peak_mib, rounds_s=rounds, peaks_mib=peaks,
                          speedup=seconds["dense rows"] / seconds["sparse"],
                          memory_ratio=peak_mib["dense rows"] / peak_mib["sparse"], max_score_difference=difference,
                          scores=got["sparse"])))


if __name__ == "__main__":
    main()
