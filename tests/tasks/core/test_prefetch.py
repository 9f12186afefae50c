import threading
import time

import pytest

from tasks.core.prefetch import prefetched


def test_items_come_out_in_order_and_are_made_on_another_thread():
    made_on = []

    def items():
        for i in range(10):
            made_on.append(threading.current_thread())
            yield i

    times = []
    assert list(prefetched(items(), depth=3, on_prepared=times.append)) == list(range(10))
    assert made_on and all(t is not threading.current_thread() for t in made_on)
    assert len(times) == 10 and all(t >= 0 for t in times)


def test_the_next_items_are_made_while_the_reader_works():
    made = []

    def items():
        for i in range(5):
            made.append(i)
            yield i

    reader = prefetched(items(), depth=2)
    assert next(reader) == 0
    deadline = time.monotonic() + 5
    while len(made) < 3 and time.monotonic() < deadline:  # item 0 handed out, 1 and 2 queued ahead
        time.sleep(0.01)
    assert made == [0, 1, 2]
    reader.close()


def test_an_error_is_raised_where_its_item_would_have_come_out():
    def items():
        yield 1
        raise ValueError("row 7 of pairs.parquet is not text")

    reader = prefetched(items())
    assert next(reader) == 1
    with pytest.raises(ValueError, match="row 7"):
        next(reader)


def test_leaving_early_stops_the_thread():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    before = threading.active_count()
    for i in prefetched(endless(), depth=2):
        if i == 3:
            break
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
