import numpy as np
import pyarrow as pa
import pytest

from tasks.config.base import InputError
from tasks.encoders.inputs import Tokens
from tasks.methods import batches as batching
from tasks.methods.batches import PairBatches, plan_batches
from tests.helpers import pairs_file, parquet_file, tokens_file


def test_a_lone_trailing_pair_is_not_a_batch():
    assert [b.size for b in plan_batches([9, 10], batch_size=4)] == [4, 4, 4, 4, 2]


def test_several_processes_train_on_full_batches_only():
    # 2 rows over 3 processes would leave one without a row: TrainConfig.min_batch_rows is a full batch there
    assert [b.size for b in plan_batches([9, 10], batch_size=4, min_rows=4)] == [4, 4, 4, 4]
    lengths = np.arange(19)
    assert sorted(len(b.take) for b in plan_batches([9, 10], batch_size=4, lengths=lengths, min_rows=4)) == [4] * 4


def batches_in_memory(pairs_per_epoch, batch_size):
    """The batching rules on lists (what training did before it streamed): the reference."""
    return [(epoch, pairs[i : i + batch_size]) for epoch, pairs in enumerate(pairs_per_epoch)
            for i in range(0, len(pairs), batch_size) if len(pairs[i : i + batch_size]) >= 2]


@pytest.mark.parametrize("batch_size", [4, 5, 13])
@pytest.mark.parametrize("row_group_size", [1, 3, 7, 100])
def test_streamed_batches_are_the_in_memory_ones_from_every_step(batch_size, row_group_size):
    per_epoch = [[(f"a{e}.{i}", f"p{e}.{i}") for i in range(13)] for e in range(3)]  # 13 = 3 x 4 + 1 = 2 x 5 + 3
    expected = batches_in_memory(per_epoch, batch_size)
    batches = PairBatches(pairs_file(per_epoch, row_group_size), batch_size)
    assert len(batches) == len(expected) and batches.steps_per_epoch == len(expected) // 3
    assert list(batches.from_step(0)) == expected
    for step in range(len(expected)):
        assert list(batches.from_step(step)) == expected[step:]


def test_steps_come_from_the_epoch_column_and_a_resume_skips_the_row_groups_before_it():
    per_epoch = [[(f"a{e}.{i}", f"p{e}.{i}") for i in range(20)] for e in range(2)]
    source = pairs_file(per_epoch, row_group_size=3)
    batches = PairBatches(source, batch_size=4)
    assert len(batches) == 10 and source.columns_read == [["epoch"]] and source.groups_read == []
    assert next(batches.from_step(7))[1] == per_epoch[1][8:12]  # rows 28-31 of the file
    assert source.groups_read == [9, 10]  # rows 27-29 and 30-32


def test_max_steps_cuts_the_schedule_and_keeps_the_warm_up_share_of_its_first_epoch():
    per_epoch = [[(f"a{e}.{i}", f"p{e}.{i}") for i in range(13)] for e in range(3)]  # 4 batches of 3 an epoch
    source = pairs_file(per_epoch, 100)
    whole = list(PairBatches(source, 3).from_step(0))
    cut = PairBatches(source, 3, max_steps=6)
    assert len(cut) == 6 and list(cut.from_step(0)) == whole[:6] and cut.steps_per_epoch == 4
    assert PairBatches(source, 3, max_steps=2).steps_per_epoch == 2  # cut within the first epoch
    with pytest.raises(InputError, match="train.max_steps: 13 steps, but the pairs make 12 batches of 3 over 3 epoch"):
        PairBatches(source, 3, max_steps=13)


def test_pairs_out_of_training_order_are_refused():
    source = parquet_file({"epoch": pa.array([0, 1, 0, 1], pa.int32()), "anchor": list("abcd"),
                           "positive": list("efgh")}, row_group_size=3)
    with pytest.raises(ValueError, match="not in training order"):
        PairBatches(source, batch_size=2)




def varied_pairs(epochs: int, rows: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """Rows of 1 to 40 words at random, the positive about as long as its anchor (tsdae's, mlm's)."""
    rng = np.random.default_rng(seed)
    words = rng.integers(1, 40, size=(epochs, rows))
    return [[(f"a{e}.{i} " + "w " * int(n), f"p{e}.{i} " + "w " * int(n + rng.integers(3)))
             for i, n in enumerate(words[e])] for e in range(epochs)]


def grouped(per_epoch, row_group_size: int, seed: int = 0, read=None) -> list[tuple[int, list]]:
    """The batches of the pairs' tokens file grouped by length, from `read`'s step (all by default), as texts."""
    source, texts = tokens_file(per_epoch, row_group_size)
    batches = PairBatches(source, 4, group_by_length=True, seed=seed)
    return [(epoch, [tuple(texts[t.ids[0]] for t in row) for row in rows])
            for epoch, rows in batches.from_step(read or 0)]


def padding(batches: list[tuple[int, list]]) -> int:
    """Padding slots (words) of the batches, each column padded to its batch's longest text."""
    return sum(len(rows) * max(map(len, words)) - sum(map(len, words))
               for _, rows in batches for words in ([text.split() for text in column] for column in zip(*rows)))


@pytest.mark.parametrize("row_group_size", [3, 100])
def test_grouped_batches_hold_the_same_rows_in_the_same_sizes_and_pad_less(monkeypatch, row_group_size):
    monkeypatch.setattr(batching, "GROUP_WINDOW", 3)  # windows of 3 batches: several per epoch
    per_epoch = varied_pairs(epochs=2, rows=29)  # 29 = 7 x 4 + 1: the lone trailing row is dropped either way
    plain = list(PairBatches(pairs_file(per_epoch, row_group_size), 4).from_step(0))
    by_length = PairBatches(tokens_file(per_epoch, row_group_size)[0], 4, group_by_length=True)
    batches = grouped(per_epoch, row_group_size)
    assert len(batches) == len(plain) == len(by_length) and by_length.steps_per_epoch == 7
    assert [(e, len(rows)) for e, rows in batches] == [(e, len(rows)) for e, rows in plain]
    for epoch in range(2):
        rows = [row for e, rows in batches if e == epoch for row in rows]
        assert len(rows) == len(set(rows)) == 28 and set(rows) <= set(per_epoch[epoch])
    # an epoch's windows are its rows 0-11, 12-23 and 24-28: batches 0-2, 3-5 and 6, never mixed
    for i, (epoch, rows) in enumerate(batches):
        assert {per_epoch[epoch].index(row) // 12 for row in rows} == {(i % 7) // 3}
    assert padding(batches) < 0.5 * padding(plain)


def test_grouped_batches_are_the_same_from_every_step_and_follow_the_seed():
    per_epoch = varied_pairs(epochs=2, rows=40)
    expected = grouped(per_epoch, 3, seed=1)
    for step in range(len(expected)):
        assert grouped(per_epoch, 3, seed=1, read=step) == expected[step:]
    assert grouped(per_epoch, 7, seed=1) == expected
    source, texts = tokens_file(per_epoch, 3)
    resumed = PairBatches(source, 4, group_by_length=True, seed=1)
    source.groups_read.clear()  # the plan read every group's ids once, for their lengths
    rows = next(resumed.from_step(10))[1]  # epoch 1's first: a window of file rows 40-79
    assert [tuple(texts[t.ids[0]] for t in row) for row in rows] == expected[10][1]
    assert min(source.groups_read) == 13  # rows 39-41: none of the groups wholly before the window is read
    assert grouped(per_epoch, 3, seed=2) != expected


def test_a_tokens_file_gives_its_rows_as_ids_with_their_words_and_a_pairs_file_cannot_be_grouped():
    per_epoch = varied_pairs(epochs=1, rows=6)
    source, texts = tokens_file(per_epoch, 4)
    epoch, rows = next(PairBatches(source, 5).from_step(0))
    assert epoch == 0 and len(rows) == 5 and all(isinstance(t, Tokens) for row in rows for t in row)
    for (anchor, positive), (a, p) in zip(per_epoch[0], rows):
        assert texts[a.ids[0]] == anchor and texts[p.ids[0]] == positive  # across the row groups' boundary too
        assert a.ids.dtype == np.int32 and a.words.tolist() == list(range(len(anchor.split())))
    with pytest.raises(ValueError, match="token ids"):
        PairBatches(pairs_file(per_epoch), 5, group_by_length=True)


def test_a_window_is_cut_longest_first_into_batches_of_neighbouring_lengths():
    lengths = np.array([5, 1, 9, 3, 7, 2, 8, 4, 6, 0])
    plan = plan_batches([10], batch_size=3, lengths=lengths, seed=0)
    assert all(b.start == 0 and b.size == 10 for b in plan)
    # the shortest row is the lone trailing one, dropped as a plain plan drops row 9
    assert sorted(sorted(lengths[b.take], reverse=True) for b in plan) == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]
