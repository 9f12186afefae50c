"""The batches of a pairs file, or of its tokens file (tasks/tokens.py), in training order, streamed a row
group at a time.

A batch is `batch_size` consecutive rows of one epoch (in-batch negatives are the other rows the
pairs stage put beside it). With `group_by_length`, for recipes whose loss is per row, each window
of GROUP_WINDOW batches is sorted by its rows' tokens before it is cut, so a batch pads little (by
characters it would not: biomedical words split into many word pieces, so rows of 272-278
characters held 46 to 86 tokens in the demo corpus); the window's batches then come in a seeded
random order. This is the Hugging Face Trainer's `group_by_length` (its windows are "megabatches"),
except that its batches come longest first within a window; the pairs stage has already put the
rows in a fresh random order each epoch, which the Trainer's shuffle before its windows gives.
Either way the plan is a pure function of the file and the config, so a resume finds the same batches.
A tokens file holds each text as its token ids (list<int32>, the text's column name) and for whole-word
masking their words (`<column>_words`); its rows come out as `Tokens`, and its lengths are the ids'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.config.base import InputError
from tasks.config.recipes import Pair
from tasks.config.training import GROUP_WINDOW, MIN_BATCH
from tasks.encoders.inputs import LABEL_COLUMNS, TEXT_COLUMNS, column_values, words_column


class BatchRows(NamedTuple):
    epoch: int
    start: int  # the first row of the file the batch draws from
    size: int  # rows of the file from `start` on that hold the batch's rows
    take: np.ndarray | None = None  # the batch's rows among them, in batch order; None: all `size`, in order


def plan_batches(epoch_rows: list[int], batch_size: int, lengths: np.ndarray | None = None,
                 seed: int = 0, min_rows: int = MIN_BATCH) -> list[BatchRows]:
    """Every batch in training order: `batch_size` rows of one epoch, never across two; an epoch's
    trailing batch of fewer than `min_rows` rows is dropped (one row has no negatives; several processes need a
    full batch: TrainConfig.min_batch_rows). With `lengths` (one per row of the file) batches are cut from windows
    sorted by length; the number and sizes of batches are the same."""
    plan: list[BatchRows] = []
    rng = np.random.default_rng(seed)
    window = batch_size * (GROUP_WINDOW if lengths is not None else 1)
    first = 0
    for epoch, rows in enumerate(epoch_rows):
        for w in range(0, rows, window):
            span = min(window, rows - w)
            if lengths is None:
                if span >= min_rows:
                    plan.append(BatchRows(epoch, first + w, span))
                continue
            # longest first; a stable sort keeps equal lengths in file order
            by_length = np.argsort(-lengths[first + w : first + w + span], kind="stable")
            cut = [by_length[i : i + batch_size] for i in range(0, span, batch_size)]
            plan += [BatchRows(epoch, first + w, span, cut[i]) for i in rng.permutation(len(cut))
                     if len(cut[i]) >= min_rows]
        first += rows
    return plan


def token_lengths(source: pq.ParquetFile, columns: list[str]) -> np.ndarray:
    """(rows,) the summed ids of each row's token columns, a row group at a time."""
    per_group = [sum(pc.list_value_length(group[c]).to_numpy() for c in columns).astype(np.int64)
                 for group in (source.read_row_group(g, columns=columns) for g in range(source.num_row_groups))]
    return np.concatenate(per_group) if per_group else np.zeros(0, np.int64)


class PairBatches:
    """The batches of a pairs or tokens file (columns epoch, anchor, positive[, negative[, margin]]; epoch-major),
    read a row group at a time: the plan comes from the `epoch` column (and with grouping the ids' lengths) alone,
    so the rows held at any moment are those of the row groups the current batch spans, whatever the file's size."""

    def __init__(self, source: pq.ParquetFile, batch_size: int, group_by_length: bool = False, seed: int = 0,
                 max_steps: int | None = None, min_rows: int = MIN_BATCH):
        self.source = source
        names = source.schema_arrow.names
        # (anchor, positive) rows, or (anchor, positive, negative) where the view mined hard negatives, and
        # a cross-encoder's margin after them where the recipe learns it
        self.columns = [c for c in (*TEXT_COLUMNS, *LABEL_COLUMNS) if c in names]
        texts = [c for c in self.columns if c in TEXT_COLUMNS]
        self.read = self.columns + [words_column(c) for c in texts if words_column(c) in names]
        tokenized = all(pa.types.is_list(source.schema_arrow.field(c).type) for c in texts)
        if group_by_length and not tokenized:
            raise ValueError("grouping by length needs the rows' token ids: a tokens file (tasks/tokens.py)")
        epochs = source.read(columns=["epoch"])["epoch"].to_numpy()
        if (np.diff(epochs) < 0).any():  # rows are read in file order, never regrouped
            raise ValueError("pairs are not in training order: the epoch column goes down")
        self.epoch_rows: list[int] = np.bincount(epochs).tolist()
        lengths = token_lengths(source, texts) if group_by_length else None
        self.plan = plan_batches(self.epoch_rows, batch_size, lengths, seed, min_rows)
        if max_steps is not None and max_steps > len(self.plan):
            raise InputError(f"train.max_steps: {max_steps} steps, but the pairs make {len(self.plan)} batches of "
                             f"{batch_size} over {len(self.epoch_rows)} epoch(s); raise train.epochs")
        # the first epoch's batches, before the plan is cut to `max_steps` (the warm-up's share is of them)
        self._epoch_steps = len(self.plan) // len(self.epoch_rows)
        self.plan = self.plan[:max_steps]

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def steps_per_epoch(self) -> int:
        """The batches of one epoch, or all of them when the plan is cut within the first."""
        return min(self._epoch_steps, len(self.plan))

    def from_step(self, step: int) -> Iterator[tuple[int, list[Pair]]]:
        """(epoch, pairs) of every batch from `step` (0-based) on; row groups wholly before it are not read."""
        group_ends = np.cumsum([self.source.metadata.row_group(g).num_rows for g in range(self.source.num_row_groups)])
        held: deque[pa.Table] = deque()  # the row groups read and still needed, in file order
        held_start = held_end = 0  # rows [held_start, held_end) of the file
        for batch in self.plan[step:]:
            while held and held_start + held[0].num_rows <= batch.start:
                held_start += held.popleft().num_rows
            if not held:  # skip to the group holding the batch's first row, by row counts alone
                group = int(np.searchsorted(group_ends, batch.start, side="right"))
                held_start = held_end = int(group_ends[group - 1]) if group else 0
            while held_end < batch.start + batch.size:
                held.append(self.source.read_row_group(group, columns=self.read))
                held_end += held[-1].num_rows
                group += 1
            rows = pa.concat_tables(held).slice(batch.start - held_start, batch.size)
            if batch.take is not None:
                rows = rows.take(pa.array(batch.take))
            yield batch.epoch, list(zip(*(column_values(rows, c) for c in self.columns)))
