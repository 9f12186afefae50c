"""The crops, same and noise views (tasks/views/__init__.py): one pass over the sentences artifact counts each
document's crops, each epoch draws its rows from the counts, and DuckDB looks up the drawn crops' texts, so no
table of every document's crops is ever held."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core import duck
from tasks.views import PAIRS_SCHEMA
from tasks.views.noise import deletion_mask, keep_words

READ_ROWS = 65_536  # sentences counted at a time


@dataclass
class CropCounts:
    """Per document with a kept sentence, in doc_id order: its id, how many crops of n kept
    sentences it has and where its kept sentences start in `kept_rows`; for the noise view also
    the words of every kept sentence (as running totals)."""

    doc_ids: pa.Array
    crops: np.ndarray  # (documents,)
    first_kept: np.ndarray  # (documents,) index of its first kept sentence in kept_rows
    kept_rows: np.ndarray  # (kept sentences,) row of the sentences file, in file order
    words_before: np.ndarray | None = None  # (kept sentences + 1,) words in all kept sentences before this one

    def crop_words(self, doc: int, crop: int, n: int) -> int:
        """Words in the crop: a crop joins its sentences with spaces, so their word counts add up."""
        start = self.first_kept[doc] + crop
        return int(self.words_before[start + n] - self.words_before[start])

    def sentence_rows(self, docs: np.ndarray, crops: np.ndarray, n: int) -> np.ndarray:
        """(rows, n) rows of the sentences file that make up crop `crops[i]` of document `docs[i]`."""
        return self.kept_rows[(self.first_kept[docs] + crops)[:, None] + np.arange(n)]


def count_crops(sentences: pq.ParquetFile, n: int, words: bool) -> CropCounts:
    """One pass over the sentences artifact (grouped by document, positions in order) that keeps
    counts and row numbers only: the texts of the crops drawn are looked up later, by DuckDB."""
    ids, kept, rows, word_counts = [], [], [], []
    offset = 0
    for batch in sentences.iter_batches(READ_ROWS, columns=["doc_id", "text", "kept"] if words else ["doc_id", "kept"]):
        rows.append(np.flatnonzero(batch["kept"].to_numpy(zero_copy_only=False)) + offset)
        offset += batch.num_rows
        batch = batch.filter(batch["kept"])
        if batch.num_rows:
            runs = pc.run_end_encode(batch["doc_id"])  # a document's sentences are consecutive
            ids.append(runs.values)
            kept.append(np.diff(runs.run_ends.to_numpy(), prepend=0))
            if words:
                word_counts.append(np.fromiter((len(t.split()) for t in batch["text"].to_pylist()), np.int64))
    if not ids:
        return CropCounts(pa.array([], pa.string()), *(np.zeros(0, np.int64) for _ in range(3)))
    doc_ids = pa.concat_arrays(ids)
    # A document cut by a batch boundary is two runs: add them up.
    starts = np.flatnonzero(np.concatenate([[True], pc.not_equal(doc_ids[1:], doc_ids[:-1]).to_numpy(
        zero_copy_only=False)]))
    doc_ids, kept_per_doc = doc_ids.take(pa.array(starts)), np.add.reduceat(np.concatenate(kept), starts)
    order = pc.sort_indices(doc_ids).to_numpy()  # UTF-8 byte order = code point order, as sorted() has it
    return CropCounts(doc_ids.take(pa.array(order)), np.maximum(kept_per_doc[order] - n + 1, 0),
                      (np.cumsum(kept_per_doc) - kept_per_doc)[order], np.concatenate(rows),
                      np.concatenate([[0], np.cumsum(np.concatenate(word_counts))]) if words else None)


@dataclass
class Draws:
    """The rows of one epoch before their texts are looked up: which document, which crops, and
    for the noise view which words of the anchor crop survive."""

    docs: np.ndarray  # (rows,) index into CropCounts, in training order
    anchor: np.ndarray  # (rows,) crop index
    positive: np.ndarray  # (rows,) crop index
    kept_words: np.ndarray | None  # (words of all anchors,) bool, row after row
    kept_start: np.ndarray | None  # (rows + 1,) where each row's words start in kept_words


def draw_rows(counts: CropCounts, eligible: np.ndarray, view: str, epochs: int, seed: int, n: int,
              deletion_ratio: float | None = None) -> Iterator[Draws]:
    """Each epoch: every eligible document once, in a fresh random order; two distinct crops (crops
    view) or one crop twice (same, noise). The random draws are made in the order the in-memory
    rule made them (docs/methods.md §1), so the rows are the same whether or not they fit in memory."""
    rng = np.random.default_rng(seed)
    docs = np.flatnonzero(eligible)
    for _ in range(epochs):
        order = docs[rng.permutation(len(docs))]
        anchor, positive = np.empty(len(order), np.int32), np.empty(len(order), np.int32)
        masks, mask_start = bytearray(), np.zeros(len(order) + 1, np.int64)
        for row, doc in enumerate(order):
            crops = int(counts.crops[doc])
            if view == "crops":
                anchor[row], positive[row] = rng.choice(crops, size=2, replace=False)
            else:
                anchor[row] = positive[row] = rng.integers(crops)
            if view == "noise":
                masks += deletion_mask(counts.crop_words(doc, int(anchor[row]), n), deletion_ratio, rng).tobytes()
                mask_start[row + 1] = len(masks)
        noise = view == "noise"
        yield Draws(order, anchor, positive, np.frombuffer(masks, bool) if noise else None,
                    mask_start if noise else None)


TEXTS_QUERY = """
    SELECT w.row, w.part, s.text
    FROM wanted w JOIN read_parquet($sentences, file_row_number = true) s ON s.file_row_number = w.sentence
    ORDER BY w.row, w.part"""


def epoch_pairs(sentences: Path, counts: CropCounts, draws: Draws, epoch: int, view: str, n: int, spill: Path,
                rows_per_group: int) -> Iterator[pa.Table]:
    """One epoch's pairs, `rows_per_group` rows at a time, in training order. A crop is n consecutive
    kept sentences joined with spaces; DuckDB fetches the sentences of the drawn crops and sorts
    them into training order out of core, so no table of every document's crops is ever held."""
    parts = counts.sentence_rows(draws.docs, draws.anchor, n)  # (rows, n)
    if view == "crops":
        parts = np.hstack([parts, counts.sentence_rows(draws.docs, draws.positive, n)])  # (rows, 2n)
    rows, width = parts.shape
    con = duck.connect(spill)
    con.register("wanted", pa.table({"row": np.repeat(np.arange(rows), width), "part": np.tile(np.arange(width), rows),
                                     "sentence": parts.reshape(-1)}))
    texts: list[str] = []
    done = 0
    for batch in con.sql(TEXTS_QUERY, params={"sentences": str(sentences)}).to_arrow_reader(rows_per_group * width):
        texts += batch["text"].to_pylist()
        whole = len(texts) // width
        if whole:
            yield _pairs(texts[: whole * width], width, n, draws, counts, epoch, done, view)
            texts, done = texts[whole * width :], done + whole


def _pairs(texts: list[str], width: int, n: int, draws: Draws, counts: CropCounts, epoch: int, first: int,
           view: str) -> pa.Table:
    """Rows first.. of an epoch from their sentences' texts, `width` per row in part order."""
    crops = [" ".join(texts[i : i + n]) for i in range(0, len(texts), n)]
    anchor, positive = (crops[0::2], crops[1::2]) if width == 2 * n else (crops, crops)
    rows = range(first, first + len(texts) // width)
    if view == "noise":  # the anchor is the crop with the words its mask drops deleted
        anchor = [keep_words(text, draws.kept_words[draws.kept_start[i] : draws.kept_start[i + 1]])
                  for text, i in zip(anchor, rows)]
    return pa.table({"epoch": pa.array(np.full(len(rows), epoch, np.int32)),
                     "doc_id": counts.doc_ids.take(pa.array(draws.docs[first : first + len(rows)])),
                     "anchor": pa.array(anchor, pa.string()), "positive": pa.array(positive, pa.string())},
                    schema=PAIRS_SCHEMA)
