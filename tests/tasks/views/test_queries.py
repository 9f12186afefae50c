"""tasks/views/queries.py: GPL's and InPars' rows from the mined queries."""

import pyarrow as pa
import pytest

from tasks.config.base import InputError
from tasks.pairs import PairsConfig
from tasks.views.queries import draw_query_pairs


def mined_queries(teacher: bool = False) -> pa.Table:
    """A negatives artifact's table: d0 has two training queries, d1 one that its passage fails the
    round trip for, d2 only held-out queries, d3 one without negatives; with `teacher`, a cross-encoder's
    scores of each query with its passage and with each negative."""
    rows = [("q0", "d0", "train", "what is d0", 1, ["d1", "d2"], 9.0, [4.0, 7.5]),
            ("q1", "d0", "train", "d0 again", 2, ["d3"], 8.0, [2.0]),
            ("q2", "d1", "train", "about d1", 5, ["d0"], 1.0, [3.0]),
            ("q3", "d2", "held_out", "held d2", 1, ["d0"], 5.0, [5.0]), ("q4", "d3", "train", "of d3", 1, [], 2.0, [])]
    names = ["query_id", "doc_id", "split", "query", "positive_rank", "negatives", "positive_teacher",
             "negative_teacher"]
    table = pa.table({name: list(col) for name, col in zip(names, zip(*rows))})
    if not teacher:
        for name in ("positive_teacher", "negative_teacher"):
            table = table.set_column(names.index(name), name, pa.nulls(len(rows), table[name].type))
    return table


PASSAGES = {f"d{i}": f"passage of d{i}" for i in range(4)}


def test_query_pairs_train_on_training_queries_against_their_passage_and_a_mined_negative():
    cfg = PairsConfig(view="queries", epochs=40, seed=0, hard_negatives=True)
    table = draw_query_pairs(mined_queries(), PASSAGES, cfg, test=set()).to_pylist()
    assert len(table) == 40 * 2  # d0 and d1: d2's queries are held out, d3 has no negative to train with
    for epoch in range(40):
        assert sorted(r["doc_id"] for r in table if r["epoch"] == epoch) == ["d0", "d1"]  # once each per epoch
    for r in table:
        assert r["positive"] == PASSAGES[r["doc_id"]] and r["negative"] != r["positive"]
    d0 = [r for r in table if r["doc_id"] == "d0"]
    assert {r["anchor"] for r in d0} == {"what is d0", "d0 again"}  # a query drawn per epoch
    # Each query's own negatives, never d1: it is in the batch (the whole epoch here), its passage a positive.
    assert {r["negative"] for r in d0} == {PASSAGES["d2"], PASSAGES["d3"]}
    assert all(r["negative"] == PASSAGES["d3"] for r in d0 if r["anchor"] == "d0 again")
    # Batches of one row: d1 is then never in d0's batch.
    alone = draw_query_pairs(mined_queries(), PASSAGES, cfg.model_copy(update={"batch_size": 1}), test=set())
    assert PASSAGES["d1"] in {r["negative"] for r in alone.to_pylist() if r["doc_id"] == "d0"}
    # kNN's held-out test documents are never drawn as negatives either.
    held = draw_query_pairs(mined_queries(), PASSAGES, cfg.model_copy(update={"batch_size": 1}), test={"d2"})
    assert {r["negative"] for r in held.to_pylist() if r["doc_id"] == "d0"} == {PASSAGES["d1"], PASSAGES["d3"]}


def test_query_pairs_with_margins_carry_the_teachers_margin_for_the_drawn_negative():
    cfg = PairsConfig(view="queries", epochs=20, seed=0, hard_negatives=True, margins=True, batch_size=1)
    table = draw_query_pairs(mined_queries(teacher=True), PASSAGES, cfg, test=set()).to_pylist()
    margins = {("what is d0", "d1"): 9.0 - 4.0, ("what is d0", "d2"): 9.0 - 7.5, ("d0 again", "d3"): 8.0 - 2.0,
               ("about d1", "d0"): 1.0 - 3.0}
    drawn = {(r["anchor"], r["negative"].removeprefix("passage of ")): r["margin"] for r in table}
    assert drawn == margins  # every (query, negative) drawn at least once over 20 epochs, each its own margin
    assert draw_query_pairs(mined_queries(teacher=True), PASSAGES, cfg.model_copy(update={"margins": False}),
                            test=set()).column_names == ["epoch", "doc_id", "anchor", "positive", "negative"]
    with pytest.raises(InputError, match="negatives.cross_encoder"):  # margins need the teacher's scores
        draw_query_pairs(mined_queries(), PASSAGES, cfg, test=set())


def test_query_pairs_round_trip_keeps_queries_whose_passage_ranked_within_the_top_and_the_knn_test_set_out():
    cfg = PairsConfig(view="queries", epochs=3, seed=1, round_trip=1)
    table = draw_query_pairs(mined_queries(), PASSAGES, cfg, test={"d3"})
    assert "negative" not in table.column_names
    assert set(table["anchor"].to_pylist()) == {"what is d0"} and table.num_rows == 3
