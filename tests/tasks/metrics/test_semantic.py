"""SemCSE's semantic benchmark: ranks and neighbour shares on hand-made points."""

import math

import numpy as np
import pytest

from tasks.metrics.semantic import average_rank, same_label_proportion, split_halves


def polar(degrees: float, radius: float = 1.0) -> list[float]:
    return [radius * math.cos(math.radians(degrees)), radius * math.sin(math.radians(degrees))]


# Candidates at 0°, 45° (length √2) and 90°.
CANDIDATES = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
# q0 (0°) is nearest its c0: rank 1. q1 (20°) is 20° from c0 but 25° from its c1: rank 2 (by raw
# dot product c1 would win, 1.28 against 0.94: the ranks must use cosine). q2 (≈ −6°, length 5)
# is nearer c0 and c1 than its c2: rank 3.
QUERIES = np.array([polar(0), polar(20), [5.0, -0.5]])


def test_average_rank_by_hand():
    assert average_rank(QUERIES, CANDIDATES) == 2.0


def test_average_rank_with_match():
    reversed_candidates = CANDIDATES[::-1]
    assert average_rank(QUERIES, reversed_candidates, match=np.array([2, 1, 0])) == 2.0
    # Several queries sharing one candidate (summaries of one paper): c0 is every query's top hit.
    assert average_rank(QUERIES, CANDIDATES, match=np.array([0, 0, 0])) == 1.0


def test_average_rank_ties_favour_the_query():
    candidates = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])  # c0 and c1 share a direction
    queries = np.array([[3.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    assert average_rank(queries, candidates, match=np.array([0, 1, 2])) == (1 + 1 + 3) / 3


def test_average_rank_refuses_a_bad_match():
    with pytest.raises(ValueError, match="match"):
        average_rank(QUERIES, CANDIDATES, match=np.array([0, 1]))
    with pytest.raises(ValueError, match="match"):
        average_rank(QUERIES, CANDIDATES, match=np.array([0, 1, 3]))


def test_blocks_give_the_same_answers_as_one_block():
    rng = np.random.default_rng(0)
    q, c = rng.normal(size=(57, 8)), rng.normal(size=(40, 8))
    match = rng.integers(0, 40, size=57)
    labels = list(rng.integers(0, 3, size=57))
    # 1 byte: one query per block; 7 rows × 40 or 57 columns of 9 or 16 bytes: blocks of 7 queries
    assert (average_rank(q, c, match, block_bytes=1) == average_rank(q, c, match, block_bytes=7 * 40 * 9)
            == average_rank(q, c, match))
    assert (same_label_proportion(q, labels, block_bytes=1) == same_label_proportion(q, labels, block_bytes=7 * 57 * 16)
            == same_label_proportion(q, labels))


@pytest.mark.parametrize("text, halves", [
    ("one two three four", ("one two", "three four")),
    ("one two three", ("one two", "three")),  # odd: the middle word goes first
    ("  one \n two ", ("one", "two")),
])
def test_split_halves(text, halves):
    assert split_halves(text) == halves


@pytest.mark.parametrize("text", ["alone", "   "])
def test_split_halves_refuses_fewer_than_two_words(text):
    with pytest.raises(ValueError, match="two halves"):
        split_halves(text)


def test_same_label_proportion_by_hand():
    # Two clusters of six, at 0–10° and 80–90°, with lengths 1..6 that cosine must ignore (by
    # Euclidean distance the short points of both clusters would be each other's neighbours).
    # One point of the first cluster is labelled "b": its 5 neighbours are all "a" (share 0), the
    # other five "a" points each see it among their 5 (share 4/5), the "b" cluster is clean (1).
    points = [polar(2 * i, radius=i + 1) for i in range(6)] + [polar(80 + 2 * i, radius=i + 1) for i in range(6)]
    labels = ["a", "a", "b", "a", "a", "a"] + ["b"] * 6
    expected = (5 * 4 / 5 + 0 + 6 * 1) / 12
    assert same_label_proportion(np.array(points), labels, k=5) == pytest.approx(expected)


def test_an_item_is_never_its_own_neighbour():
    # Each point's nearest other point carries the other label; counting itself would give 1.
    points = np.array([polar(0), polar(5), polar(85), polar(90)])
    assert same_label_proportion(points, ["a", "b", "a", "b"], k=1) == 0.0


def test_same_label_proportion_refuses_too_few_items():
    with pytest.raises(ValueError, match="more than 5 items"):
        same_label_proportion(np.eye(5), list("abcde"), k=5)
