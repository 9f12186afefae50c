"""Yardstick: a score that needs no labels, from a held-out share of the corpus (`embforge select` ranks recipes by it).

`titles`: each held-out document that has a title gives a query, its title, whose one relevant document is its own
text, among all the corpus's. The held-out documents are drawn by a hash of (seed, doc_id) (the queries stage's
split_of: the same documents whatever else the corpus holds) and are left out of every training view (tasks/pairs.py,
`PairsConfig.yardstick`), so no candidate trained on them. The output has the queries stage's columns, so the
held-out query text set, the evaluate stage's in-domain retrieval (each query's rank and nDCG@10) and the report's
paired intervals read it as they read generated queries. Its known bias is BIAS (the select report states it).

Inputs: `documents`. Output `queries.parquet`: query_id, doc_id, split (`held_out`), query (the title), status
(`ok`); the manifest gives how many documents were held out and how many had a title.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError
from tasks.config.evaluation import YardstickConfig
from tasks.config.queries import HELD_OUT, QUERY_COLUMNS
from tasks.core.stage import Inputs, Stage
from tasks.queries import split_of

SCHEMA = pa.schema([(column, pa.string()) for column in QUERY_COLUMNS])  # what the queries' readers read
# What a reader of a decision made on the yardstick must know, by kind.
BIAS = {"titles": "a title names its document's topic in a few words, so the yardstick favours models that match "
                  "short texts to long ones by topic (the query-trained recipes, SemCSE with titles as positives)"}
MIN_QUERIES = 2  # a ranking of candidates needs more than one query to be paired over


class YardstickInputs(Inputs):
    documents: ArtifactRef


def held_out_documents(doc_ids: list[str], cfg: YardstickConfig) -> set[str]:
    """The documents the yardstick holds out of training."""
    return {d for d in doc_ids if split_of(d, cfg.seed, cfg.held_out) == HELD_OUT}


def build_yardstick(store: ArtifactStore, cfg: YardstickConfig, inputs: YardstickInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents", columns=["doc_id", "title"])
    held = held_out_documents(docs["doc_id"].to_pylist(), cfg)
    docs = docs.filter(pc.is_in(docs["doc_id"], pa.array(sorted(held), pa.string())))
    titled = docs.filter(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(docs["title"], ""))), 0))
    if titled.num_rows < MIN_QUERIES:
        raise InputError(f"yardstick titles: {titled.num_rows} of the {len(held)} held-out documents "
                         f"({cfg.held_out:.0%} of the corpus) have a title; it needs at least {MIN_QUERIES}: a larger "
                         "corpus, a larger held-out share, or documents with titles")
    n = titled.num_rows
    out.write_table("queries", pa.table({"query_id": pc.binary_join_element_wise("title-", titled["doc_id"], ""),
                                         "doc_id": titled["doc_id"], "split": pa.array([HELD_OUT] * n),
                                         "query": titled["title"], "status": pa.array(["ok"] * n)}, schema=SCHEMA))
    out.extra.update(kind=cfg.kind, held_out=len(held), queries=n)
    log.info("%s yardstick: %d documents held out of training, %d with a title (the queries)", cfg.kind, len(held), n)


YARDSTICK = Stage("yardstick", build_yardstick)
