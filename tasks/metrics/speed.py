"""Encoding speed measured side by side: every side encodes the same texts in turn, the order flipping each
round so that the machine's drift (turbo, a neighbour's load) falls on all sides alike; a side's figure is
the median of its rounds (docs/results.md: compare ratios from one run, never seconds across runs)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sized

# The speed stage's score rows of a static model (tasks/speed.py): its documents/s, its teacher's.
SPEED_METRICS = ("cpu_docs_per_s", "teacher_cpu_docs_per_s")
LATENCY_METRIC = "cpu_query_ms"  # the latency stage's score row of each model (tasks/latency.py)


def documents_per_second(sides: dict[str, Callable[[list[str]], Sized]], texts: list[str], rounds: int = 3,
                         warm_up: int = 32, min_seconds: float = 1.0) -> dict[str, list[float]]:
    """Each side's documents/s in each round (side → one figure a round), after one call on the first `warm_up`
    texts each (the first call pays for lazy set-up: threads, allocations). In a round a side encodes the texts
    again until `min_seconds` have passed: a fast side's figure is not one timer's tick. A side must give one
    vector a text."""
    for encode in sides.values():
        encode(texts[:warm_up])
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            start, done = time.perf_counter(), 0
            while not done or time.perf_counter() - start < min_seconds:
                vectors = sides[name](texts)
                if len(vectors) != len(texts):
                    raise ValueError(f"{name}: {len(vectors)} vectors for {len(texts)} texts")
                done += len(texts)
            rates[name].append(done / (time.perf_counter() - start))
    return rates


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in rates.items()}


def query_seconds(sides: dict[str, Callable[[str], object]], queries: list[str], warm_up: int = 2
                  ) -> dict[str, list[float]]:
    """Each side's seconds for each query asked alone (side → one figure a query), after `warm_up` queries each
    untimed. The sides take each query in turn, the order rotating query by query, so that the machine's drift falls
    on all sides alike."""
    for ask in sides.values():
        for query in queries[:warm_up]:
            ask(query)
    names, seconds = list(sides), {name: [] for name in sides}
    for i, query in enumerate(queries):
        for name in names[i % len(names):] + names[: i % len(names)]:
            start = time.perf_counter()
            sides[name](query)
            seconds[name].append(time.perf_counter() - start)
    return seconds
