"""Pairs: a recipe's training view, (anchor, positive) rows built from the sentences table (docs/methods.md §1).
The five views, and how each is drawn, are tasks/views/'s (its __init__ says what each holds); this stage reads
their inputs, leaves out the held-out documents and writes the rows.

Inputs: `sentences`; `documents` when documents are held out of training (`held_out`: kNN's test split, so that
kNN accuracy is measured on documents the model never trained on; `yardstick`: tasks/yardstick.py's) or titles are
needed (summaries); `summaries` (the summarize artifact) for the summaries view; `negatives` (the negatives
artifact, which carries the queries) for the queries view.

Output `pairs.parquet`: epoch, doc_id, anchor, positive, in training order (the summaries view adds positive_kind:
summary, title, sentence or same; the queries view with hard negatives adds negative, and with margins
(gpl_margin) the cross-encoder's margin).
"""

from __future__ import annotations

import logging
import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Section
from tasks.config.recipes import RECIPES, View
from tasks.config.splits import HeldOutShare, KnnConfig
from tasks.config.training import MIN_BATCH, MethodConfig, epoch_batches
from tasks.core.held_out import HeldOut, held_out_documents, knn_test_documents
from tasks.core.stage import Inputs, Stage
from tasks.views import PAIRS_SCHEMA
from tasks.views.crops import count_crops, draw_rows, epoch_pairs
from tasks.views.queries import draw_query_pairs
from tasks.views.summaries import Replacement, draw_summary_pairs, ok_summaries, sentences_by_document


class PairsConfig(Section):
    view: View
    n_sentences: int = Field(2, ge=1)
    seed: int = 0
    epochs: int = Field(1, ge=1)
    deletion_ratio: float | None = None
    held_out: HeldOut | None = None
    yardstick: HeldOutShare | None = None  # its held-out documents are left out too (tasks/yardstick.py)
    replacement: Replacement | None = None  # the summaries view's
    round_trip: int | None = None  # the queries view's
    hard_negatives: bool = False  # the queries view's
    margins: bool = False  # the queries view's with hard negatives: each row carries the teacher's margin
    batch_size: int | None = None  # with `steps`; and the queries view's with hard negatives (none of a batch's
    # documents is one)
    steps: int | None = None  # a schedule of this many batches: as many epochs as it takes (`embforge select`'s budget)
    min_rows: int | None = None  # with `steps`: an epoch's trailing batch counts from this many rows (training's rule)

    @property
    def needs_documents(self) -> bool:
        return self.held_out is not None or self.yardstick is not None or self.view in ("summaries", "queries")

    @classmethod
    def for_method(cls, method: MethodConfig, epochs: int, knn: KnnConfig | None = None,
                   batch_size: int | None = None, yardstick: HeldOutShare | None = None,
                   steps: int | None = None, min_rows: int | None = None) -> PairsConfig:
        # Only what shapes the rows is part of the identity: recipes that read the same view (and
        # renamed methods) share one artifact.
        recipe = RECIPES[method.recipe]
        view, hard_negatives = recipe.view, recipe.hard_negatives
        held_out = HeldOut(test_size=knn.test_size, seed=knn.seed) if method.knn_holdout else None
        replacement = Replacement(**method.model_dump(include={"title_rate", "sentence_rate", "same_input"}))
        crops = view != "queries"  # the queries view reads no sentences
        return cls(view=view, n_sentences=method.n_sentences if crops else cls.model_fields["n_sentences"].default,
                   seed=method.seed, epochs=epochs, deletion_ratio=method.deletion_ratio if view == "noise" else None,
                   held_out=held_out, replacement=replacement if view == "summaries" else None,
                   round_trip=method.resolved_round_trip, hard_negatives=hard_negatives, margins=recipe.margins,
                   batch_size=batch_size if hard_negatives or steps else None, steps=steps,
                   min_rows=min_rows if steps else None,
                   yardstick=HeldOutShare(**yardstick.model_dump(include=set(HeldOutShare.model_fields)))
                   if yardstick else None)


ROWS_PER_GROUP = 65_536  # pairs per row group: what training reads at a time


class PairsInputs(Inputs):
    sentences: ArtifactRef | None = None  # every view's but the queries view's
    documents: ArtifactRef | None = None  # with held_out, and for the summaries view's titles
    summaries: ArtifactRef | None = None  # the summaries view's
    negatives: ArtifactRef | None = None  # the queries view's: the queries and their mined negatives

    @classmethod
    def for_view(cls, cfg: PairsConfig, sentences: ArtifactRef, documents: ArtifactRef,
                 summaries: ArtifactRef | None, negatives: ArtifactRef | None = None) -> PairsInputs:
        return cls(sentences=sentences if cfg.view != "queries" else None,
                   documents=documents if cfg.needs_documents else None,
                   summaries=summaries if cfg.view == "summaries" else None,
                   negatives=negatives if cfg.view == "queries" else None)


MIN_ROWS = 2  # a view's rows per epoch that make a training batch


def epochs_for(cfg: PairsConfig, per_epoch: int) -> int:
    """`epochs`, or with `steps` as many as `steps` batches of `batch_size` take (at least `epochs`)."""
    if cfg.steps is None:
        return cfg.epochs
    return max(cfg.epochs, math.ceil(cfg.steps / max(1, epoch_batches(per_epoch, cfg.batch_size,
                                                                          cfg.min_rows or MIN_BATCH))))


def build_pairs(store: ArtifactStore, cfg: PairsConfig, inputs: PairsInputs,
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    columns = ["doc_id", "label"] + {"summaries": ["title"], "queries": ["text"]}.get(cfg.view, [])
    docs = store.read_table(inputs.documents, "documents", columns) if cfg.needs_documents else None
    test = knn_test_documents(docs, cfg.held_out) if cfg.held_out else set()
    if cfg.yardstick:
        test |= held_out_documents(docs["doc_id"].to_pylist(), cfg.yardstick)
    if test:
        log.info("%d documents held out of training (kNN's test split, the yardstick's)", len(test))
    if cfg.view == "summaries":
        summaries = {d: s for d, s in ok_summaries(store, inputs.summaries).items() if d not in test}
        titles = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
        sentences = store.read_table(inputs.sentences, "sentences")
        by_document = sentences_by_document(sentences)
        epochs = epochs_for(cfg, draw_summary_pairs(summaries, titles, by_document, cfg.replacement, 1,
                                                    cfg.seed).num_rows)
        table = draw_summary_pairs(summaries, titles, by_document, cfg.replacement, epochs, cfg.seed)
        if table.num_rows == 0:
            raise InputError("no document has 2 or more usable summaries: see the summarize artifact's stats")
        rows = out.write_batches("pairs", table.schema, table.to_batches(ROWS_PER_GROUP))
    elif cfg.view == "queries":
        passages = dict(zip(docs["doc_id"].to_pylist(), docs["text"].to_pylist()))
        negatives = store.read_table(inputs.negatives, "negatives")
        epochs = epochs_for(cfg, draw_query_pairs(negatives, passages, cfg.model_copy(update={"epochs": 1}),
                                                  test).num_rows)
        table = draw_query_pairs(negatives, passages, cfg.model_copy(update={"epochs": epochs}), test)
        if table.num_rows == 0:
            raise InputError("no training query is left" + (f" whose passage the start model ranks within the top "
                                                            f"{cfg.round_trip} (round_trip)" if cfg.round_trip else "")
                             + ": see the queries and negatives artifacts")
        rows = out.write_batches("pairs", table.schema, table.to_batches(ROWS_PER_GROUP))
    else:
        sentences = store.table_path(inputs.sentences, "sentences")
        counts = count_crops(pq.ParquetFile(sentences), cfg.n_sentences, cfg.view == "noise")
        eligible = (counts.crops >= 2) & ~pc.is_in(counts.doc_ids, pa.array(sorted(test), pa.string())).to_numpy(
            zero_copy_only=False)
        if not eligible.any():
            raise InputError("no document has 2 or more crops: check sentences.min_chars/max_chars and the "
                             "method's n_sentences against your texts")
        epochs = epochs_for(cfg, int(eligible.sum()))  # a row per eligible document an epoch
        draws = draw_rows(counts, eligible, cfg.view, epochs, cfg.seed, cfg.n_sentences, cfg.deletion_ratio)
        per_epoch = (epoch_pairs(sentences, counts, drawn, epoch, cfg.view, cfg.n_sentences, out.work, ROWS_PER_GROUP)
                     for epoch, drawn in enumerate(draws))
        rows = out.write_batches("pairs", PAIRS_SCHEMA, (table for tables in per_epoch for table in tables))
    if rows // epochs < MIN_ROWS:  # refused before a train stage publishes a model trained on nothing
        raise InputError(f"the {cfg.view} view made {rows // epochs} row(s) per epoch from the corpus"
                         f"{f' ({len(test)} documents held out of training)' if test else ''}; training needs at least "
                         f"{MIN_ROWS} (a batch's in-batch negatives): a larger corpus or settings that keep more of it")
    out.extra.update(documents=rows // epochs, epochs=epochs)
    log.info("%s view: %d documents, %d pairs over %d epoch(s)", cfg.view, out.extra["documents"], rows, epochs)


PAIRS = Stage("pairs", build_pairs)
