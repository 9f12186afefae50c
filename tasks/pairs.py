"""Pairs: a recipe's training view, (anchor, positive) rows built from the sentences table (docs/methods.md §1).
Which view a recipe reads is in the recipe registry (tasks/config/recipes.py). It is over 400 lines: five views are
one stage's, sharing the crop counts, the documents held out of training and the row-group writing.

crops: two distinct crops of the same document, drawn uniformly (crops, retromae_infonce);
same:  one crop used twice (dropout, simcse, ct: the model's dropout makes the views differ;
       mlm and retromae read only the anchor and mask it themselves at each step);
noise: anchor = the crop with words deleted, positive = the crop itself (tsdae's input, target);
summaries: anchor = an LLM summary of the document, positive = another of its summaries, or its
       title (title_rate) or a random sentence of it (sentence_rate) instead (semcse; docs/methods.md §5);
queries: anchor = an LLM-written query of the document (training split only), positive = the document's
       passage, and with `hard_negatives` a passage the start model ranks high for the query, drawn from
       the ones the negatives stage mined; `round_trip` keeps only queries whose passage the start model
       ranked within that top (gpl, inpars; docs/gpl.md).
A crop is n consecutive kept sentences; documents with fewer than 2 crops are dropped for every view, so that all
recipes train on the same documents with the same budget. Each epoch has one row per document in a fresh random
order, so no document appears twice in a batch.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Section
from tasks.config.queries import TRAIN
from tasks.config.recipes import RECIPES, View
from tasks.config.splits import HeldOutShare, KnnConfig
from tasks.config.training import MethodConfig
from tasks.core import duck
from tasks.core.held_out import held_out_documents
from tasks.core.stage import Inputs, Stage
from tasks.methods.tsdae import deletion_mask, keep_words
from tasks.metrics import knn


class HeldOut(Section):
    """kNN's test split (docs/methods.md §1), whose documents are left out of training."""

    test_size: float
    seed: int


class Replacement(Section):
    """How SemCSE picks a positive for an anchor summary."""

    title_rate: float
    sentence_rate: float
    same_input: bool


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
    batch_size: int | None = None  # the queries view's with hard negatives: none of a batch's documents is one

    @property
    def needs_documents(self) -> bool:
        return self.held_out is not None or self.yardstick is not None or self.view in ("summaries", "queries")

    @classmethod
    def for_method(cls, method: MethodConfig, epochs: int, knn: KnnConfig | None = None,
                   batch_size: int | None = None, yardstick: HeldOutShare | None = None) -> PairsConfig:
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
                   batch_size=batch_size if hard_negatives else None,
                   yardstick=HeldOutShare(**yardstick.model_dump(include=set(HeldOutShare.model_fields)))
                   if yardstick else None)


def knn_test_documents(docs: pa.Table, held_out: HeldOut) -> set[str]:
    """The doc ids kNN accuracy is measured on: the test positions among the labelled documents."""
    labelled = docs.filter(pc.is_valid(docs["label"]))["doc_id"].to_pylist()
    _, test = knn.split_indices(len(labelled), held_out.test_size, held_out.seed)
    return {labelled[i] for i in test}


ROWS_PER_GROUP = 65_536  # pairs per row group: what training reads at a time
READ_ROWS = 65_536  # sentences counted at a time
PAIRS_SCHEMA = pa.schema([("epoch", pa.int32()), ("doc_id", pa.string()), ("anchor", pa.string()),
                          ("positive", pa.string())])


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


def draw_summary_pairs(summaries: dict[str, list[str]], titles: dict[str, str | None],
                       sentences: dict[str, list[str]], replacement: Replacement, epochs: int, seed: int) -> pa.Table:
    """One row per document per epoch: a random summary as anchor; as positive another summary,
    or (at the configured rates) the title or a random sentence, or with `same_input` the anchor."""
    rng = np.random.default_rng(seed)
    docs = [d for d, s in summaries.items() if len(s) >= (1 if replacement.same_input else 2)]
    cols: dict[str, list] = {"epoch": [], "doc_id": [], "anchor": [], "positive": [], "positive_kind": []}
    for epoch in range(epochs):
        for i in rng.permutation(len(docs)):
            doc, own = docs[i], summaries[docs[i]]
            a = rng.integers(len(own))
            u = rng.random()
            if replacement.same_input:
                positive, kind = own[a], "same"
            elif u < replacement.title_rate and titles.get(doc):
                positive, kind = titles[doc], "title"
            elif u < replacement.title_rate + replacement.sentence_rate and sentences.get(doc):
                positive, kind = sentences[doc][rng.integers(len(sentences[doc]))], "sentence"
            else:  # another summary of the same document
                b = rng.integers(len(own) - 1)
                positive, kind = own[b + (b >= a)], "summary"
            for name, value in zip(cols, (epoch, doc, own[a], positive, kind)):
                cols[name].append(value)
    return pa.table(cols, schema=pa.schema([("epoch", pa.int32()), ("doc_id", pa.string()), ("anchor", pa.string()),
                                           ("positive", pa.string()), ("positive_kind", pa.string())]))


def draw_query_pairs(mined: pa.Table, passages: dict[str, str], cfg: PairsConfig, test: set[str]) -> pa.Table:
    """One row per document per epoch, in a fresh order: one of its training queries (that pass the
    round trip) as anchor, its passage as positive and, with hard negatives, one of the query's mined
    negatives drawn at random (GPL samples them per step from the retriever's top). A negative is never
    a document of the same batch (`cfg.batch_size` consecutive rows), whose passage is a positive there,
    nor one of kNN's held-out test documents. With `margins`, the row's margin is the teacher's score of
    the query with its passage minus that with the negative."""
    keep = pc.equal(mined["split"], TRAIN)
    if cfg.round_trip:
        keep = pc.and_(keep, pc.less_equal(mined["positive_rank"], cfg.round_trip))
    if cfg.margins and mined.num_rows and mined["positive_teacher"].null_count == mined.num_rows:
        raise InputError("negatives.cross_encoder: the recipe learns a cross-encoder's margins, but the negatives "
                         "were mined without one")
    by_doc: dict[str, list[tuple[str, float, list[tuple[str, float]]]]] = {}
    rows = mined.filter(keep).select(["doc_id", "query", "negatives", "positive_teacher", "negative_teacher"])
    for row in rows.to_pylist():
        teacher = row["negative_teacher"] or [float("nan")] * len(row["negatives"])
        negatives = [(n, t) for n, t in zip(row["negatives"], teacher) if n not in test]
        if row["doc_id"] not in test and (negatives or not cfg.hard_negatives):
            by_doc.setdefault(row["doc_id"], []).append((row["query"], row["positive_teacher"], negatives))
    rng = np.random.default_rng(cfg.seed)
    docs = sorted(by_doc)
    cols: dict[str, list] = {"epoch": [], "doc_id": [], "anchor": [], "positive": [], "negative": [], "margin": []}
    for epoch in range(cfg.epochs):
        order = [docs[i] for i in rng.permutation(len(docs))]
        for start in range(0, len(order), cfg.batch_size or len(order) or 1):
            batch = order[start : start + (cfg.batch_size or len(order))]
            members = set(batch)
            for doc in batch:
                query, positive_teacher, negatives = by_doc[doc][rng.integers(len(by_doc[doc]))]
                negative = margin = None
                if cfg.hard_negatives:  # one outside the batch, where the query has any
                    outside = [n for n in negatives if n[0] not in members] or negatives
                    negative, negative_teacher = outside[rng.integers(len(outside))]
                    margin = positive_teacher - negative_teacher if cfg.margins else None
                    negative = passages[negative]
                for name, value in zip(cols, (epoch, doc, query, passages[doc], negative, margin)):
                    cols[name].append(value)
    extra = [pa.field("negative", pa.string())] if cfg.hard_negatives else []
    extra += [pa.field("margin", pa.float32())] if cfg.margins else []
    schema = pa.schema([*PAIRS_SCHEMA, *extra])
    return pa.table({n: cols[n] for n in schema.names}, schema=schema)


def texts_by_document(rows: pa.Table) -> dict[str, list[str]]:
    """doc_id → its `text` values, in row order."""
    result: dict[str, list[str]] = {}
    for doc, text in zip(rows["doc_id"].to_pylist(), rows["text"].to_pylist()):
        result.setdefault(doc, []).append(text)
    return result


def ok_summaries(store: ArtifactStore, ref: ArtifactRef) -> dict[str, list[str]]:
    """doc_id → the summaries the summarize stage's quality guard passed, in (prompt, sample) order."""
    table = store.read_table(ref, "summaries")
    return texts_by_document(table.filter(pc.equal(table["status"], "ok")))


def sentences_by_document(sentences: pa.Table, min_words: int = 3) -> dict[str, list[str]]:
    """Every sentence of at least `min_words` words (kept by the length filter or not), in order."""
    rows = sentences.sort_by([("doc_id", "ascending"), ("position", "ascending")])
    long_enough = pa.array([len(t.split()) >= min_words for t in rows["text"].to_pylist()], pa.bool_())
    return {doc: [t.strip() for t in texts] for doc, texts in texts_by_document(rows.filter(long_enough)).items()}


TEXTS_QUERY = """
    SELECT w.row, w.part, s.text
    FROM wanted w JOIN read_parquet($sentences, file_row_number = true) s ON s.file_row_number = w.sentence
    ORDER BY w.row, w.part"""


def epoch_pairs(sentences: Path, counts: CropCounts, draws: Draws, epoch: int, cfg: PairsConfig,
                spill: Path) -> Iterator[pa.Table]:
    """One epoch's pairs, ROWS_PER_GROUP rows at a time, in training order. A crop is n consecutive
    kept sentences joined with spaces; DuckDB fetches the sentences of the drawn crops and sorts
    them into training order out of core, so no table of every document's crops is ever held."""
    n = cfg.n_sentences
    parts = counts.sentence_rows(draws.docs, draws.anchor, n)  # (rows, n)
    if cfg.view == "crops":
        parts = np.hstack([parts, counts.sentence_rows(draws.docs, draws.positive, n)])  # (rows, 2n)
    rows, width = parts.shape
    con = duck.connect(spill)
    con.register("wanted", pa.table({"row": np.repeat(np.arange(rows), width), "part": np.tile(np.arange(width), rows),
                                     "sentence": parts.reshape(-1)}))
    texts: list[str] = []
    done = 0
    for batch in con.sql(TEXTS_QUERY, params={"sentences": str(sentences)}).to_arrow_reader(ROWS_PER_GROUP * width):
        texts += batch["text"].to_pylist()
        whole = len(texts) // width
        if whole:
            yield _pairs(texts[: whole * width], width, n, draws, counts, epoch, done, cfg.view)
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
        table = draw_summary_pairs(summaries, titles, sentences_by_document(sentences), cfg.replacement,
                                   cfg.epochs, cfg.seed)
        if table.num_rows == 0:
            raise InputError("no document has 2 or more usable summaries: see the summarize artifact's stats")
        rows = out.write_batches("pairs", table.schema, table.to_batches(ROWS_PER_GROUP))
    elif cfg.view == "queries":
        passages = dict(zip(docs["doc_id"].to_pylist(), docs["text"].to_pylist()))
        table = draw_query_pairs(store.read_table(inputs.negatives, "negatives"), passages, cfg, test)
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
        draws = draw_rows(counts, eligible, cfg.view, cfg.epochs, cfg.seed, cfg.n_sentences, cfg.deletion_ratio)
        rows = out.write_batches("pairs", PAIRS_SCHEMA, (table for epoch, drawn in enumerate(draws) for table in
                                                         epoch_pairs(sentences, counts, drawn, epoch, cfg, out.work)))
    if rows // cfg.epochs < MIN_ROWS:  # refused before a train stage publishes a model trained on nothing
        raise InputError(f"the {cfg.view} view made {rows // cfg.epochs} row(s) per epoch from the corpus"
                         f"{f' ({len(test)} documents held out of training)' if test else ''}; training needs at least "
                         f"{MIN_ROWS} (a batch's in-batch negatives): a larger corpus or settings that keep more of it")
    out.extra.update(documents=rows // cfg.epochs)
    log.info("%s view: %d documents, %d pairs over %d epoch(s)", cfg.view, out.extra["documents"], rows, cfg.epochs)


PAIRS = Stage("pairs", build_pairs)
