"""Yardstick: a held-out share of the corpus made into a retrieval task (`embforge select` ranks recipes by it).

The held-out documents are drawn by a hash of (seed, doc_id) (tasks/core/held_out.py: the same documents whatever
else the corpus holds) and are left out of every training view (tasks/pairs.py, `PairsConfig.yardstick`),
so no candidate trained on them. Two kinds, by what the corpus has (`auto`: labels if they ask at least half as many
queries as titles would, else titles; the log says why):

- `labels`, the user's own labels: each labelled held-out document is a query, by its own vector, whose relevant
  documents are the labelled documents not held out that share its label (nDCG@10; the evaluate stage scores it).
  A held-out document whose label no other document has asks nothing (status `no_relevant`).
- `titles`, no labels needed: each held-out document that has a title gives a query, its title, whose one relevant
  document is its own text, among all the corpus's.

The output has the queries stage's columns, so the evaluate stage's in-domain retrieval (each query's rank and
nDCG@10) and the report's paired intervals read it as they read generated queries. What each kind asks and its
known bias are tasks/select.py's ASKS and BIAS (the select report states them).

Inputs: `documents`. Output `queries.parquet`: query_id, doc_id, split (`held_out`), query (the title, or the
label), status; the manifest gives the kind it is, how many documents were held out and how many ask a query.
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
from tasks.core.held_out import held_out_documents
from tasks.core.stage import Inputs, Stage

SCHEMA = pa.schema([(column, pa.string()) for column in QUERY_COLUMNS])  # what the queries' readers read
MIN_QUERIES = 2  # a ranking of candidates needs more than one query to be paired over
NO_RELEVANT = "no_relevant"  # a held-out document whose label no trained-on document has


def yardstick_kind(manifest: dict) -> str:
    """The kind a yardstick artifact is (`auto` resolved), from its manifest."""
    return manifest["extra"]["kind"]


class YardstickInputs(Inputs):
    documents: ArtifactRef


def label_queries(docs: pa.Table, held: pa.Array) -> tuple[pa.Table, int]:
    """The labels kind's queries: every labelled held-out document (`ok` where a document not held out shares its
    label), and how many labels the documents not held out have."""
    known = pc.unique(docs.filter(pc.and_(pc.invert(held), pc.is_valid(docs["label"])))["label"])
    asked = docs.filter(pc.and_(held, pc.is_valid(docs["label"])))
    status = pc.if_else(pc.is_in(asked["label"], known), "ok", NO_RELEVANT)
    return _queries("label-", asked["doc_id"], asked["label"], status), len(known)


def title_queries(docs: pa.Table, held: pa.Array) -> pa.Table:
    """The titles kind's queries: every held-out document that has a title."""
    asked = docs.filter(held)
    asked = asked.filter(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(asked["title"], ""))), 0))
    return _queries("title-", asked["doc_id"], asked["title"], pa.array(["ok"] * asked.num_rows, pa.string()))


def _queries(prefix: str, doc_ids: pa.Array, query: pa.Array, status: pa.Array) -> pa.Table:
    return pa.table({"query_id": pc.binary_join_element_wise(prefix, doc_ids, ""), "doc_id": doc_ids,
                     "split": pa.array([HELD_OUT] * len(doc_ids), pa.string()), "query": query, "status": status},
                    schema=SCHEMA)


def build_yardstick(store: ArtifactStore, cfg: YardstickConfig, inputs: YardstickInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents", columns=["doc_id", "title", "label"])
    ids = held_out_documents(docs["doc_id"].to_pylist(), cfg)
    held = pc.is_in(docs["doc_id"], pa.array(sorted(ids), pa.string()))
    share = f"of the {len(ids)} held-out documents ({cfg.held_out:.0%} of the corpus)"
    found = {}  # kind → (its queries, how many ask) where it can rank, or why not
    if cfg.kind in ("auto", "labels"):
        queries, labels = label_queries(docs, held)
        asking = pc.sum(pc.equal(queries["status"], "ok")).as_py() or 0
        found["labels"] = (queries, asking) if asking >= MIN_QUERIES and labels >= 2 else (
            f"labels: {asking} {share} have a label that a document not held out shares, among {labels} labels; it "
            f"needs at least {MIN_QUERIES} and 2 labels")
    if cfg.kind in ("auto", "titles"):
        queries = title_queries(docs, held)
        found["titles"] = (queries, queries.num_rows) if queries.num_rows >= MIN_QUERIES else (
            f"titles: {queries.num_rows} {share} have a title; it needs at least {MIN_QUERIES}")
    usable = {k: v for k, v in found.items() if isinstance(v, tuple)}
    if not usable:
        raise InputError(f"yardstick {'; '.join(found.values())}: a larger corpus, a larger held-out share, or "
                         "documents with " + ("labels or titles" if cfg.kind == "auto" else cfg.kind))
    # The user's labels first, unless so few carry them that a paired interval over them would say little.
    asks = {k: asking for k, (_, asking) in usable.items()}
    kind = "labels" if 2 * asks.get("labels", -1) >= asks.get("titles", 0) else "titles"
    if cfg.kind == "auto" and kind == "titles":
        log.info("the titles decide: %s", found["labels"] if "labels" not in usable else
                 f"{asks['labels']} labelled held-out documents ask, against {asks['titles']} titles")
    queries, asking = usable[kind]
    out.write_table("queries", queries)
    out.extra.update(kind=kind, held_out=len(ids), queries=asking)
    log.info("%s yardstick: %d documents held out of training, %d of them ask a query", kind, len(ids), asking)


YARDSTICK = Stage("yardstick", build_yardstick)
