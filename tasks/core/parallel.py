"""Work spread over the cores: a function mapped over a stream in worker processes, results in
input order, with a bounded number of items in flight so memory stays flat however long the stream."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
AHEAD = 2  # items queued per worker: enough to keep it busy while the caller writes a result

# Held by what seeds and draws from the process-wide random generators (tasks/core/rng.py): stages run
# side by side in threads of one process would otherwise draw from each other's streams. Here, not
# in tasks/core/rng.py, so that a stage's code identity does not take in torch with it.
GLOBAL_RNG = threading.RLock()


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`map(fn, items)` on `workers` processes (in this process with one). `fn` must be picklable."""
    if workers <= 1:
        yield from map(fn, items)
        return
    # spawn, not fork: Prefect runs stages in threads, and a forked child may inherit a held lock.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque[Future] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= workers * AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
