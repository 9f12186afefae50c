"""Work prepared ahead on a background thread: the next batches are read and padded or tokenized (and
copied to the GPU) while the current one runs, so a step never waits for its inputs unless preparing
them is slower than the step itself.

Tokenizers and Arrow release the GIL for their heavy parts, so the thread runs beside the model's
own work. The items come out in order, as the plain iterator gives them; an error in the thread
is raised where its item would have come out; leaving the loop early stops the thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()
POLL_S = 0.1  # how often a full queue looks whether its reader has gone


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def prefetched(items: Iterator[T], depth: int = 2, on_prepared: Callable[[float], None] | None = None,
               ) -> Iterator[T]:
    """`items`, computed up to `depth` ahead on a background thread; `on_prepared(seconds)` gets the
    time each item took to make (the profile's "prepared ahead")."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    gone = threading.Event()

    def put(value) -> bool:
        while not gone.is_set():
            try:
                ready.put(value, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            while not gone.is_set():
                start = time.perf_counter()
                item = next(items, _DONE)
                if item is not _DONE and on_prepared:
                    on_prepared(time.perf_counter() - start)
                if not put(item) or item is _DONE:
                    return
        except BaseException as e:  # handed to the reader, raised there
            put(_Raised(e))

    thread = threading.Thread(target=produce, name="embforge-prefetch", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        gone.set()
        thread.join()
