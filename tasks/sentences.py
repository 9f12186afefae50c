"""Sentence splitting: the cropping paper's exact rule, or a real sentence splitter.

Output `sentences.parquet`: doc_id, position, text, length, kept, in document order and
position order within a document (the pairs stage relies on it). `length` is the character
count before stripping (what the paper filters on); `text` is the stripped sentence, ending in
its full stop, so a crop is just its sentences joined with spaces; `kept` says whether the
sentence passes the length filter and may be used in crops.

Documents are read, split and written a batch at a time, the batches spread over `run.workers`
processes, so memory does not grow with the corpus.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from itertools import chain

import blingfire
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.data import SentenceConfig
from tasks.core import parallel
from tasks.core.stage import Inputs, Stage


def split_paper(text: str) -> list[str]:
    """The paper's split: plain `split(".")`. Breaks at decimals and abbreviations, on purpose."""
    return text.split(".")


def split_blingfire(text: str) -> list[str]:
    """blingfire's rule-based splitter: fast, and keeps "e.g." and "0.05" inside sentences."""
    return [s for s in blingfire.text_to_sentences(text).split("\n") if s]


SPLITTERS: dict[str, Callable[[str], list[str]]] = {"paper": split_paper, "blingfire": split_blingfire}


def clean_sentence(raw: str, splitter: str) -> str:
    # The paper appends the "." that split() removed; real splitters keep their punctuation.
    return raw.strip() + "." if splitter == "paper" else raw.strip()


SCHEMA = pa.schema([("doc_id", pa.string()), ("position", pa.int32()), ("text", pa.string()),
                    ("length", pa.int32()), ("kept", pa.bool_())])
BATCH_ROWS = 8_192  # documents split per task: ~80k sentences, a few seconds of one core


def sentence_table(doc_ids: pa.Array | list[str], texts: Iterable[str], cfg: SentenceConfig) -> pa.Table:
    """Every sentence of every document, in document order and position order within one."""
    pieces = [SPLITTERS[cfg.splitter](text) for text in texts]
    counts = np.fromiter(map(len, pieces), np.int64, len(pieces))
    raw = list(chain.from_iterable(pieces))
    lengths = np.fromiter(map(len, raw), np.int32, len(raw))
    doc = np.repeat(np.arange(len(pieces)), counts)  # (sentences,) index of its document
    first = np.repeat(np.cumsum(counts) - counts, counts)  # (sentences,) row of its document's first
    return pa.table({"doc_id": pc.take(pa.array(doc_ids, pa.string()), pa.array(doc)),
                     "position": pa.array(np.arange(len(raw), dtype=np.int32) - first.astype(np.int32)),
                     "text": pa.array([clean_sentence(r, cfg.splitter) for r in raw], pa.string()),
                     "length": pa.array(lengths),
                     "kept": pa.array((cfg.min_chars <= lengths) & (lengths <= cfg.max_chars))}, schema=SCHEMA)


def split_batch(batch: pa.RecordBatch, cfg: SentenceConfig) -> pa.Table:
    return sentence_table(batch["doc_id"], batch["text"].to_pylist(), cfg)


class SentencesInputs(Inputs):
    documents: ArtifactRef


def build_sentences(store: ArtifactStore, cfg: SentenceConfig, inputs: SentencesInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    documents = store.open_table(inputs.documents, "documents")
    batches = documents.iter_batches(BATCH_ROWS, columns=["doc_id", "text"])
    # One batch is split here: starting worker processes costs more than it saves.
    workers = 1 if documents.metadata.num_rows <= BATCH_ROWS else cfg.workers or parallel.available_cores()
    kept = 0

    def counted(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        nonlocal kept
        for table in tables:
            kept += pc.sum(table["kept"]).as_py() or 0
            yield table

    rows = out.write_batches("sentences", SCHEMA, counted(parallel.ordered_map(
        functools.partial(split_batch, cfg=cfg), batches, workers)))
    out.extra.update(kept=kept)
    log.info("%s splitter: %d sentences, %d kept (%d-%d chars), %d worker(s)", cfg.splitter, rows,
             kept, cfg.min_chars, cfg.max_chars, workers)


SENTENCES = Stage("sentences", build_sentences)
