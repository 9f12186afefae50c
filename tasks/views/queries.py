"""The queries view (GPL, InPars; docs/gpl.md): a generated training query as anchor, its passage as positive and,
with hard negatives, a passage the negatives stage mined for the query."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.config.base import InputError
from tasks.config.queries import TRAIN
from tasks.views import PAIRS_SCHEMA


class QueryDraws(Protocol):
    """The settings the queries view is drawn with: the pairs stage's config has them."""

    seed: int
    epochs: int
    round_trip: int | None
    hard_negatives: bool
    margins: bool
    batch_size: int | None


def draw_query_pairs(mined: pa.Table, passages: dict[str, str], cfg: QueryDraws, test: set[str]) -> pa.Table:
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
