"""Summarize: SemCSE's positives (docs/methods.md §5), written by an LLM, cached per document and prompt.

Each document's "title + abstract" is followed by each continuation prompt and the LLM samples
`n` continuations, trimmed to their first sentence. Generation is the most expensive stage of
the DAG, so its rows live in a shard pool per (LLM, sampling settings) in the store: a run makes
only the (document, prompt) combinations the pool lacks, a shard of documents at a time (a
killed run loses at most the shard in flight), and then publishes this job's rows as its
artifact. More documents, another prompt or another LLM therefore make only the new rows.

A quality guard labels every summary: `empty` (under 3 words), `run_on` (no end of sentence
within `max_tokens`), `repeat` (it merely copies the input: most of its word trigrams are in the
title and abstract) or `ok`; SemCSE trains on `ok` ones, and the counts are in the artifact. A
document too long for the LLM's context (generate.CONTEXT tokens with the prompt and continuation),
or than `max_input_tokens`, is cut to fit, and the manifest counts the documents cut (`extra.cut`).

Inputs: `documents`, and `llm` when the LLM was converted from GGUF.
Output `summaries.parquet`: doc_id, prompt_id, sample, text, status, continuation, finish,
tokens, model, backend, sampling, seed; `stats.parquet`: prompt_id, status, count.
"""

from __future__ import annotations

import logging
import re

import pyarrow as pa

from storage.base import ArtifactRef, stable_hash
from storage.store import ArtifactStore, ArtifactWriter
from tasks import llm
from tasks.config.summaries import SummaryConfig
from tasks.core.stage import Inputs, Stage
from tasks.generation.pool import GENERATION_COLUMNS, document_text, pooled_rows, quality, rows_key, status_counts

SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


class SummarizeInputs(Inputs):
    documents: ArtifactRef
    llm: ArtifactRef | None = None  # the converted GGUF LLM


def first_sentence(continuation: str) -> tuple[str, bool]:
    """The continuation up to its first end of sentence or line break, and whether one was found."""
    text = continuation.lstrip(" ")
    line, newline, _ = text.partition("\n")
    end = SENTENCE_END.search(line)
    return (line[: end.end()] if end else line).strip(), bool(end or newline)


def summary_status(summary: str, ended: bool, finish: str, source: str, copied: float = 0.8) -> str:
    """`ok`, or why the summary is useless: `empty` (under 3 words), `run_on` or `repeat` (copies the input)."""
    return quality(summary, ended, finish, source, min_words=3, copied=copied)


def pool_key(job: SummaryConfig) -> str:
    """The summaries' pool: one per LLM, sampling settings and cut (pool.rows_key)."""
    return rows_key(llm.identity(job.llm), job)


def build_summaries(store: ArtifactStore, job: SummaryConfig, inputs: SummarizeInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    model_dir = llm.llm_folder(store, inputs.llm, job.llm)
    docs, pooled, made, cut = pooled_rows(store, job, inputs.documents, store.pool("summaries", pool_key(job)),
                                          job.prompts, model_dir, llm.prompt_prefix(model_dir), log, "summaries")
    prompt_ids = {stable_hash(p): i for i, p in enumerate(job.prompts, 1)}
    rows = []
    for doc, r in pooled:
        text, ended = first_sentence(r["continuation"])
        status = summary_status(text, ended, r["finish"], document_text(doc["title"], doc["text"]))
        rows.append(dict(doc_id=doc["doc_id"], prompt_id=prompt_ids[r["prompt_digest"]], sample=r["sample"],
                         text=text, status=status, **{k: r[k] for k in GENERATION_COLUMNS}))
    table = pa.Table.from_pylist(rows).sort_by([("doc_id", "ascending"), ("prompt_id", "ascending"),
                                                ("sample", "ascending")])
    stats = table.group_by(["prompt_id", "status"]).aggregate([("sample", "count")]).rename_columns(
        ["prompt_id", "status", "count"])
    out.write_table("summaries", table)
    out.write_table("stats", stats.sort_by([("prompt_id", "ascending"), ("status", "ascending")]))
    counts = status_counts(table)
    out.extra.update(documents=len(docs), generated=made, reused=table.num_rows - made, status=counts, cut=cut)
    log.info("%d rows (%d generated now, %d from the pool): %s", table.num_rows, made,
             table.num_rows - made, ", ".join(f"{s} {n}" for s, n in counts.items()))


SUMMARIZE = Stage("summarize", build_summaries, extra_key=lambda job: llm.identity(job.llm), gpu=True,
                  seeds_global_rng=True)
