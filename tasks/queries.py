"""Queries: GPL's and InPars' training queries, written by an LLM for each passage, cached per passage and prompt.

Each document's "title + passage" is followed by the query prompt and the LLM samples `n`
continuations; the first line of each is a query. Generation is summarize's (tasks/generation/pool.py):
the rows live in a shard pool of their own per (LLM, sampling settings), a run makes only the
documents the pool lacks, a shard at a time (a killed run loses at most the shard in flight), and
then publishes this job's rows. More documents or another prompt therefore make only the new rows.

A quality guard labels every query: `empty` (under 2 words), `run_on` (no line end within
`max_tokens`), `repeat` (most of its word trigrams are in the title and passage: a copied sentence,
not a question) or `ok`. A share `held_out` of the documents, drawn by a hash of (seed, doc_id), is
`held_out`: their queries are the in-domain retrieval evaluation's and never trained on; the rest are
`train`. The draw depends on the document alone, so its split is the same in every run and
whatever else the corpus holds. A document too long for the LLM's context (or `max_input_tokens`) is cut to fit
(`extra.cut`).

Inputs: `documents`, and `llm` when the LLM was converted from GGUF.
Output `queries.parquet`: query_id, doc_id, sample, query, status, split, continuation, finish,
tokens, model, backend, sampling, seed (the sampler's); `stats.parquet`: status, split, count.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from storage.base import ArtifactRef, stable_hash
from storage.store import ArtifactStore, ArtifactWriter
from tasks import llm
from tasks.config.queries import HELD_OUT, AskedQueries, AskingDocuments, QueriesConfig
from tasks.core.held_out import held_out_documents, split_of
from tasks.core.stage import Inputs, Stage
from tasks.generation.pool import GENERATION_COLUMNS, document_text, pooled_rows, quality, rows_key, status_counts


class QueriesInputs(Inputs):
    documents: ArtifactRef
    llm: ArtifactRef | None = None  # the converted GGUF LLM


def first_line(continuation: str) -> tuple[str, bool]:
    """The continuation's first line, stripped, and whether the line ended (a line break was generated)."""
    line, newline, _ = continuation.partition("\n")
    return line.strip(), bool(newline)


def query_status(query: str, ended: bool, finish: str, source: str, copied: float = 0.8) -> str:
    """`ok`, or why the query is useless: `empty` (under 2 words), `run_on` or `repeat` (copies the passage)."""
    return quality(query, ended, finish, source, min_words=2, copied=copied)


def pool_key(job: QueriesConfig) -> str:
    """The queries' pool: one per LLM, sampling settings and cut (pool.rows_key), apart from the summaries'."""
    return rows_key(llm.identity(job.llm), job)


def asking_documents(doc_ids: list[str], asking: AskingDocuments) -> set[str]:
    """The held-out documents the yardstick's LLM queries are written for: at most `most`, by a hash of each id."""
    held = sorted(held_out_documents(doc_ids, asking), key=lambda d: stable_hash(asking.seed, d))
    return set(held[: asking.most] if asking.most else held)


def build_queries(store: ArtifactStore, job: QueriesConfig, inputs: QueriesInputs,
                  out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    model_dir = llm.llm_folder(store, inputs.llm, job.llm)
    only = (asking_documents(store.read_table(inputs.documents, "documents", ["doc_id"])["doc_id"].to_pylist(),
                             job.asking) if isinstance(job, AskedQueries) else None)
    docs, pooled, made, cut = pooled_rows(store, job, inputs.documents, store.pool("queries", pool_key(job)),
                                          [job.prompt], model_dir, llm.prompt_prefix(model_dir), log, "queries", only)
    split = (lambda doc_id: HELD_OUT) if only is not None else lambda doc_id: split_of(doc_id, job.seed, job.held_out)
    rows = []
    for doc, r in pooled:
        query, ended = first_line(r["continuation"])
        rows.append(dict(query_id=stable_hash(r["doc_digest"], r["prompt_digest"], r["sample"]), doc_id=doc["doc_id"],
                         sample=r["sample"], query=query,
                         status=query_status(query, ended, r["finish"], document_text(doc["title"], doc["text"])),
                         split=split(doc["doc_id"]),
                         **{k: r[k] for k in GENERATION_COLUMNS}))
    table = pa.Table.from_pylist(rows).sort_by([("doc_id", "ascending"), ("sample", "ascending")])
    stats = table.group_by(["status", "split"]).aggregate([("sample", "count")]).rename_columns(
        ["status", "split", "count"])
    out.write_table("queries", table)
    out.write_table("stats", stats.sort_by([("status", "ascending"), ("split", "ascending")]))
    counts = status_counts(table)
    held = sum(split(d["doc_id"]) == HELD_OUT for d in docs)
    out.extra.update(documents=len(docs), generated=made, reused=table.num_rows - made, status=counts, cut=cut,
                     held_out=held)
    log.info("%d queries (%d generated now, %d from the pool), %d of %d documents held out: %s", table.num_rows,
             made, table.num_rows - made, held, len(docs), ", ".join(f"{s} {n}" for s, n in counts.items()))


QUERIES = Stage("queries", build_queries, extra_key=lambda job: llm.identity(job.llm), gpu=True,
                seeds_global_rng=True)
