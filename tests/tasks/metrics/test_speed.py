"""tasks/metrics/speed.py: sides timed in turn, the order flipping every round (a query latency's: rotating every
query), after a warm-up each."""

import time

import pytest

from tasks.metrics.speed import documents_per_second, medians, query_seconds

TEXTS = [f"text {i}" for i in range(10)]


@pytest.mark.alone  # timed: the fast side's rate against the slow one's
def test_sides_take_turns_and_the_slower_side_measures_slower():
    calls = []

    def side(name: str, seconds_per_text: float):
        def encode(texts):
            calls.append((name, len(texts)))
            time.sleep(seconds_per_text * len(texts))
            return texts
        return encode

    rates = documents_per_second({"fast": side("fast", 0.0002), "slow": side("slow", 0.002)}, TEXTS, rounds=3,
                                 warm_up=2, min_seconds=0)
    assert calls == [("fast", 2), ("slow", 2),  # warm-up on the first texts, then rounds in turn, the order flipped
                     ("fast", 10), ("slow", 10), ("slow", 10), ("fast", 10), ("fast", 10), ("slow", 10)]
    assert [len(r) for r in rates.values()] == [3, 3]
    fast, slow = medians(rates).values()
    assert fast > 3 * slow and slow < 10 / (10 * 0.002) * 1.01  # no faster than its sleeps allow


def test_a_fast_side_encodes_again_until_the_round_has_lasted_min_seconds():
    calls = []
    rates = documents_per_second({"fast": lambda texts: calls.append(len(texts)) or texts}, TEXTS, rounds=2,
                                 warm_up=2, min_seconds=0.05)
    assert calls[0] == 2 and len(calls) > 10 and set(calls[1:]) == {10}
    assert len(rates["fast"]) == 2


def test_a_side_that_drops_texts_is_an_error_naming_it():
    with pytest.raises(ValueError, match="short: 9 vectors for 10 texts"):
        documents_per_second({"whole": lambda texts: texts, "short": lambda texts: texts[1:]}, TEXTS, rounds=1)


def test_each_query_is_asked_of_every_side_alone_the_order_rotating_and_the_warm_up_untimed():
    calls = []

    def side(name: str, seconds: float):
        def ask(query):
            calls.append((name, query))
            time.sleep(seconds)
        return ask

    sides = {"a": side("a", 0.0), "b": side("b", 0.0), "slow": side("slow", 0.004)}
    seconds = query_seconds(sides, TEXTS[:4], warm_up=1)
    assert calls[:3] == [("a", "text 0"), ("b", "text 0"), ("slow", "text 0")]  # the warm-up, untimed
    assert [name for name, _ in calls[3:]] == ["a", "b", "slow", "b", "slow", "a", "slow", "a", "b", "a", "b", "slow"]
    assert [query for _, query in calls[3:]] == [t for t in TEXTS[:4] for _ in range(3)]  # one query at a time
    assert {name: len(s) for name, s in seconds.items()} == {"a": 4, "b": 4, "slow": 4}
    assert min(seconds["slow"]) >= 0.004 > max(seconds["a"])
