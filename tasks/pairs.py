"""Pairs: a recipe's training view, (anchor, positive) rows built from the sentences table
(docs/methods.md §1). Which view a recipe reads is in the recipe registry (tasks/methods/recipes.py).

crops: two distinct crops of the same document, drawn uniformly (crops, retromae_infonce);
same:  one crop used twice (dropout, simcse, ct: the model's dropout makes the views differ;
       mlm and retromae read only the anchor and mask it themselves at each step);
noise: anchor = the crop with words deleted, positive = the crop itself (tsdae's input, target);
summaries: anchor = an LLM summary of the document, positive = another of its summaries, or its
       title (title_rate) or a random sentence of it (sentence_rate) instead (semcse; docs/methods.md §5).
A crop is n consecutive kept sentences; documents with fewer than 2 crops are dropped for every
view, so that all recipes train on the same documents with the same budget. Each epoch has one
row per document in a fresh random order, so no document appears twice in a batch.

Inputs: `sentences`; `documents` when kNN's test split is held out (`held_out`: kNN accuracy is
then measured on documents the model never trained on) or titles are needed (summaries);
`summaries` (the summarize artifact) for the summaries view.

Output `pairs.parquet`: epoch, doc_id, anchor, positive, in training order (the summaries view
adds positive_kind: summary, title, sentence or same).
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter
from tasks.config import InputError, KnnConfig, MethodConfig, Section
from tasks.methods.recipes import RECIPES, View
from tasks.methods.tsdae import delete_words
from tasks.metrics import knn
from tasks.stage import Inputs, Stage


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
    replacement: Replacement | None = None  # the summaries view's

    @property
    def needs_documents(self) -> bool:
        return self.held_out is not None or self.view == "summaries"

    @classmethod
    def for_method(cls, method: MethodConfig, epochs: int, knn: KnnConfig | None = None) -> PairsConfig:
        # Only what shapes the rows is part of the identity: recipes that read the same view (and
        # renamed methods) share one artifact.
        view = RECIPES[method.recipe].view
        held_out = HeldOut(test_size=knn.test_size, seed=knn.seed) if method.knn_holdout else None
        replacement = Replacement(**method.model_dump(include={"title_rate", "sentence_rate", "same_input"}))
        return cls(view=view, n_sentences=method.n_sentences, seed=method.seed, epochs=epochs,
                   deletion_ratio=method.deletion_ratio if view == "noise" else None, held_out=held_out,
                   replacement=replacement if view == "summaries" else None)


def knn_test_documents(docs: pa.Table, held_out: HeldOut) -> set[str]:
    """The doc ids kNN accuracy is measured on: the test positions among the labelled documents."""
    labelled = docs.filter(pc.is_valid(docs["label"]))["doc_id"].to_pylist()
    _, test = knn.split_indices(len(labelled), held_out.test_size, held_out.seed)
    return {labelled[i] for i in test}


def build_crops(kept_sentences: list[str], n: int) -> list[str]:
    """Every run of n consecutive kept sentences, one starting at each kept sentence."""
    return [" ".join(kept_sentences[i : i + n]) for i in range(len(kept_sentences) - n + 1)]


def draw_pairs(doc_crops: dict[str, list[str]], view: str, epochs: int, seed: int,
               deletion_ratio: float = 0.6) -> pa.Table:
    rng = np.random.default_rng(seed)
    docs = [d for d, crops in doc_crops.items() if len(crops) >= 2]
    cols: dict[str, list] = {"epoch": [], "doc_id": [], "anchor": [], "positive": []}
    for epoch in range(epochs):
        for i in rng.permutation(len(docs)):
            crops = doc_crops[docs[i]]
            if view == "crops":
                a, b = rng.choice(len(crops), size=2, replace=False)
            else:
                a = b = rng.integers(len(crops))
            cols["epoch"].append(epoch)
            cols["doc_id"].append(docs[i])
            cols["anchor"].append(delete_words(crops[a], deletion_ratio, rng) if view == "noise" else crops[a])
            cols["positive"].append(crops[b])
    return pa.table(cols, schema=pa.schema([("epoch", pa.int32()), ("doc_id", pa.string()),
                                           ("anchor", pa.string()), ("positive", pa.string())]))


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


def crops_by_document(sentences: pa.Table, n: int) -> dict[str, list[str]]:
    rows = sentences.filter(sentences["kept"]).sort_by([("doc_id", "ascending"), ("position", "ascending")])
    return {doc: build_crops(texts, n) for doc, texts in texts_by_document(rows).items()}


class PairsInputs(Inputs):
    sentences: ArtifactRef
    documents: ArtifactRef | None = None  # with held_out, and for the summaries view's titles
    summaries: ArtifactRef | None = None  # the summaries view's

    @classmethod
    def for_view(cls, cfg: PairsConfig, sentences: ArtifactRef, documents: ArtifactRef,
                 summaries: ArtifactRef | None) -> PairsInputs:
        return cls(sentences=sentences, documents=documents if cfg.needs_documents else None,
                   summaries=summaries if cfg.view == "summaries" else None)


def build_pairs(store: ArtifactStore, cfg: PairsConfig, inputs: PairsInputs,
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    sentences = store.read_table(inputs.sentences, "sentences")
    docs = store.read_table(inputs.documents, "documents") if cfg.needs_documents else None
    test = knn_test_documents(docs, cfg.held_out) if cfg.held_out else set()
    if test:
        log.info("%d kNN test documents held out of training", len(test))
    if cfg.view == "summaries":
        summaries = {d: s for d, s in ok_summaries(store, inputs.summaries).items() if d not in test}
        titles = dict(zip(docs["doc_id"].to_pylist(), docs["title"].to_pylist()))
        table = draw_summary_pairs(summaries, titles, sentences_by_document(sentences), cfg.replacement,
                                   cfg.epochs, cfg.seed)
        problem = "no document has 2 or more usable summaries: see the summarize artifact's stats"
    else:
        doc_crops = {doc: c for doc, c in crops_by_document(sentences, cfg.n_sentences).items() if doc not in test}
        table = draw_pairs(doc_crops, cfg.view, cfg.epochs, cfg.seed, cfg.deletion_ratio)
        problem = ("no document has 2 or more crops: check sentences.min_chars/max_chars and the "
                   "method's n_sentences against your texts")
    if table.num_rows == 0:
        raise InputError(problem)
    out.write_table("pairs", table)
    out.extra.update(documents=table.num_rows // cfg.epochs)
    log.info("%s view: %d documents, %d pairs over %d epoch(s)", cfg.view, out.extra["documents"],
             table.num_rows, cfg.epochs)


PAIRS = Stage("pairs", build_pairs)
