"""Sentence splitting: the cropping paper's exact rule, or a real sentence splitter.

Output `sentences.parquet`: doc_id, position, text, length, kept. `length` is the character
count before stripping (what the paper filters on); `text` is the stripped sentence, ending in
its full stop, so a crop is just its sentences joined with spaces; `kept` says whether the
sentence passes the length filter and may be used in crops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import blingfire
import pyarrow as pa
import pyarrow.compute as pc

from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter
from tasks.config import SentenceConfig
from tasks.stage import Inputs, Stage


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


def sentence_table(doc_ids: Iterable[str], texts: Iterable[str], cfg: SentenceConfig) -> pa.Table:
    split = SPLITTERS[cfg.splitter]
    cols: dict[str, list] = {"doc_id": [], "position": [], "text": [], "length": [], "kept": []}
    for doc_id, text in zip(doc_ids, texts):
        for position, raw in enumerate(split(text)):
            cols["doc_id"].append(doc_id)
            cols["position"].append(position)
            cols["text"].append(clean_sentence(raw, cfg.splitter))
            cols["length"].append(len(raw))
            cols["kept"].append(cfg.min_chars <= len(raw) <= cfg.max_chars)
    schema = pa.schema([("doc_id", pa.string()), ("position", pa.int32()), ("text", pa.string()),
                        ("length", pa.int32()), ("kept", pa.bool_())])
    return pa.table(cols, schema=schema)


class SentencesInputs(Inputs):
    documents: ArtifactRef


def build_sentences(store: ArtifactStore, cfg: SentenceConfig, inputs: SentencesInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents")
    table = sentence_table(docs["doc_id"].to_pylist(), docs["text"].to_pylist(), cfg)
    out.write_table("sentences", table)
    kept = pc.sum(table["kept"]).as_py() or 0
    out.extra.update(kept=kept)
    log.info("%s splitter: %d sentences, %d kept (%d-%d chars)", cfg.splitter, table.num_rows,
             kept, cfg.min_chars, cfg.max_chars)


SENTENCES = Stage("sentences", build_sentences)
