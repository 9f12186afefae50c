"""Training views: (anchor, positive) rows built from the sentences table (methods.md §1).

crops: two distinct crops of the same document, drawn uniformly (crops, retromae_infonce);
same:  one crop used twice (dropout, simcse, ct: the model's dropout makes the views differ;
       mlm and retromae read only the anchor and mask it themselves at each step);
noise: anchor = the crop with words deleted, positive = the crop itself (tsdae's input, target).
A crop is n consecutive kept sentences; documents with fewer than 2 crops are dropped for every
view, so that all recipes train on the same documents with the same budget. Each epoch has one
row per document in a fresh random order, so no document appears twice in a batch.

With `held_out`, the documents of kNN's test split are left out (the documents artifact is then
the second input), so kNN accuracy is measured on documents the model never trained on.

Output `pairs.parquet`: epoch, doc_id, anchor, positive, in training order.
"""

from __future__ import annotations

import logging
import sys
from itertools import groupby
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from storage import ArtifactRef, ArtifactStore
from storage.store import ArtifactWriter
from tasks.config import InputError, KnnConfig, MethodConfig, Section
from tasks.methods import tsdae
from tasks.methods.tsdae import delete_words
from tasks.metrics import knn
from tasks.stage import Stage


VIEW_OF_RECIPE = {"crops": "crops", "retromae_infonce": "crops", "tsdae": "noise"}  # others: same


class HeldOut(Section):
    """kNN's test split (methods.md §1), whose documents are left out of training."""

    test_size: float
    seed: int


class PairsConfig(Section):
    view: Literal["crops", "same", "noise"]
    n_sentences: int = Field(2, ge=1)
    seed: int = 0
    epochs: int = Field(1, ge=1)
    deletion_ratio: float | None = None
    held_out: HeldOut | None = None  # then the documents artifact is the second input

    @classmethod
    def for_method(cls, method: MethodConfig, epochs: int, knn: KnnConfig | None = None) -> "PairsConfig":
        # Only what shapes the rows is part of the identity: recipes that read the same view (and
        # renamed methods) share one artifact.
        view = VIEW_OF_RECIPE.get(method.recipe, "same")
        held_out = HeldOut(test_size=knn.test_size, seed=knn.seed) if method.knn_holdout else None
        return cls(view=view, n_sentences=method.n_sentences, seed=method.seed, epochs=epochs,
                   deletion_ratio=method.deletion_ratio if view == "noise" else None, held_out=held_out)


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


def crops_by_document(sentences: pa.Table, n: int) -> dict[str, list[str]]:
    rows = sentences.filter(sentences["kept"]).sort_by([("doc_id", "ascending"), ("position", "ascending")])
    pairs = zip(rows["doc_id"].to_pylist(), rows["text"].to_pylist())
    return {doc: build_crops([text for _, text in group], n) for doc, group in groupby(pairs, key=lambda r: r[0])}


def build_pairs(store: ArtifactStore, cfg: PairsConfig, inputs: list[ArtifactRef],
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    doc_crops = crops_by_document(store.read_table(inputs[0], "sentences"), cfg.n_sentences)
    if cfg.held_out:
        test = knn_test_documents(store.read_table(inputs[1], "documents"), cfg.held_out)
        doc_crops = {doc: crops for doc, crops in doc_crops.items() if doc not in test}
        log.info("pairs: %d kNN test documents held out of training", len(test))
    table = draw_pairs(doc_crops, cfg.view, cfg.epochs, cfg.seed, cfg.deletion_ratio)
    if table.num_rows == 0:
        raise InputError("no document has 2 or more crops: check sentences.min_chars/max_chars "
                         "and the method's n_sentences against your texts")
    out.write_table("pairs", table)
    out.extra.update(documents=table.num_rows // cfg.epochs)
    log.info("pairs (%s, n=%d): %d documents with >= 2 crops, %d pairs over %d epoch(s)", cfg.view,
             cfg.n_sentences, out.extra["documents"], table.num_rows, cfg.epochs)


PAIRS = Stage("pairs", build_pairs, code=(sys.modules[__name__], tsdae, knn))
