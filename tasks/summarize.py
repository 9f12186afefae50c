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
document too long for the LLM's context (generate.CONTEXT tokens with the prompt and continuation)
is cut to fit, and the manifest counts the documents cut (`extra.cut`).

Inputs: `documents`, and `llm` when the LLM was converted from GGUF.
Output `summaries.parquet`: doc_id, prompt_id, sample, text, status, continuation, finish,
tokens, model, backend, sampling, seed; `stats.parquet`: prompt_id, status, count.
"""

from __future__ import annotations

import json
import logging
import re

import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from storage.base import ArtifactRef, stable_hash
from storage.shards import ShardPool
from storage.store import ArtifactStore, ArtifactWriter
from tasks import llm
from tasks.config.summaries import SummaryConfig
from tasks.core.progress import StageProgress
from tasks.core.stage import Inputs, Stage
from tasks.encoders.budget import char_budget
from tasks.encoders.models import load_model
from tasks.generation import generate

STATUSES = ("ok", "empty", "run_on", "repeat")
SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
WORD = re.compile(r"\w+")


class SummarizeInputs(Inputs):
    documents: ArtifactRef
    llm: ArtifactRef | None = None  # the converted GGUF LLM


def source_text(title: str | None, text: str) -> str:
    return f"{title}\n{text}" if title else text


def build_prompt(prefix: str, title: str | None, text: str, prompt: str) -> str:
    return f"{prefix}{source_text(title, text)}\n{prompt}"


def fitted_text(tokenizer, text: str, budget: int) -> tuple[str, bool]:
    """The first `budget` tokens of `text`, as text, and whether it was cut. Characters are cut first
    (`budget.char_budget`), so that a huge document is never tokenized whole."""
    head = text[: char_budget(budget)]
    ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return head, len(head) < len(text)
    return tokenizer.decode(ids[:budget]), True


def fit_documents(tokenizer, docs: list[dict], prefix: str, prompts: list[str], max_tokens: int) -> int:
    """Set each document's `fitted` text: cut so that every prompt built from it and its continuation
    fit the LLM's context (generate.CONTEXT tokens); returns how many were cut."""
    cut = 0
    for d in docs:
        around = max(len(tokenizer(build_prompt(prefix, d["title"], "", p))["input_ids"]) for p in prompts)
        # 8 tokens of slack: tokens can merge differently where the text meets the rest of the prompt
        d["fitted"], was_cut = fitted_text(tokenizer, d["text"], max(generate.CONTEXT - max_tokens - around - 8, 0))
        cut += was_cut
    return cut


def first_sentence(continuation: str) -> tuple[str, bool]:
    """The continuation up to its first end of sentence or line break, and whether one was found."""
    text = continuation.lstrip(" ")
    line, newline, _ = text.partition("\n")
    end = SENTENCE_END.search(line)
    return (line[: end.end()] if end else line).strip(), bool(end or newline)


def _trigrams(text: str) -> list[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]


def summary_status(summary: str, ended: bool, finish: str, source: str, copied: float = 0.8) -> str:
    """`ok`, or why the summary is useless: `empty`, `run_on` or `repeat` (copies the input)."""
    if len(WORD.findall(summary)) < 3:
        return "empty"
    if not ended and finish == "length":
        return "run_on"
    grams, source_grams = _trigrams(summary), set(_trigrams(source))
    if grams and sum(g in source_grams for g in grams) / len(grams) >= copied:
        return "repeat"
    return "ok"


def pool_key(job: SummaryConfig) -> str:
    """Rows are interchangeable between jobs that share the LLM's weights and the sampling settings
    (not the backend: both sample the same distribution)."""
    return stable_hash(llm.identity(job.llm), job.sampling.model_dump(mode="json"))


def _documents(store: ArtifactStore, job: SummaryConfig, docs_ref: ArtifactRef) -> list[dict]:
    docs = store.read_table(docs_ref, "documents").select(["doc_id", "title", "text"]).to_pylist()
    docs = docs[: job.limit] if job.limit else docs
    for d in docs:
        d["digest"] = stable_hash(d["title"], d["text"])
    return docs


def _generate_missing(store: ArtifactStore, job: SummaryConfig, inputs: SummarizeInputs, docs: list[dict],
                      pool: ShardPool, have: pa.Table | None, log: logging.Logger) -> tuple[list[pa.Table], int]:
    """Generate what `have` (the pool as read) lacks; returns the new shards' tables and how many of the
    documents were cut to fit the LLM's context."""
    done = set(zip(have["doc_digest"].to_pylist(), have["prompt_digest"].to_pylist())) if have else set()
    prompts = [(p, stable_hash(p)) for p in job.prompts]
    todo = [(d, [(p, h) for p, h in prompts if (d["digest"], h) not in done]) for d in docs]
    todo = [(d, missing) for d, missing in todo if missing]
    log.info("%d of %d documents need summaries (%d pool shards)", len(todo), len(docs), len(pool.shards()))
    if not todo:
        return [], 0
    model_dir = llm.llm_folder(store, inputs.llm, job.llm)
    prefix, sampling = llm.prompt_prefix(model_dir), json.dumps(job.sampling.model_dump(mode="json"), sort_keys=True)
    cut = fit_documents(load_model(model_dir, AutoTokenizer.from_pretrained), [d for d, _ in todo], prefix,
                        job.prompts, job.sampling.max_tokens)
    if cut:
        log.warning("%d of %d documents cut to fit the LLM's context of %d tokens", cut, len(todo), generate.CONTEXT)
    generator = generate.make_generator(job.backend, model_dir, job.sampling)
    made = []
    try:
        with StageProgress(len(todo), "documents") as progress, \
                tqdm(total=len(todo), desc=progress.label, unit="doc") as bar:
            for start in range(0, len(todo), job.shard_size):
                shard = todo[start : start + job.shard_size]
                asked = [(d, p, h) for d, missing in shard for p, h in missing]
                outputs = generator.generate([build_prompt(prefix, d["title"], d["fitted"], p) for d, p, _ in asked])
                rows = [dict(doc_id=d["doc_id"], doc_digest=d["digest"], prompt=p, prompt_digest=h, sample=i,
                             continuation=c.text, finish=c.finish, tokens=c.tokens, model=job.llm,
                             backend=generator.name, sampling=sampling, seed=job.sampling.seed)
                        for (d, p, h), completions in zip(asked, outputs) for i, c in enumerate(completions)]
                made.append(pa.Table.from_pylist(rows))
                pool.write(made[-1])
                bar.update(len(shard))
                progress.advance(len(shard))
                log.info("shard of %d documents done (%d/%d)", len(shard), start + len(shard), len(todo))
    finally:
        generator.close()
    return made, cut


def build_summaries(store: ArtifactStore, job: SummaryConfig, inputs: SummarizeInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = _documents(store, job, inputs.documents)
    pool = store.pool("summaries", pool_key(job))
    have = pool.read()
    new, cut = _generate_missing(store, job, inputs, docs, pool, have, log)
    pooled = pa.concat_tables(([have] if have is not None else []) + new, promote_options="default")
    made = sum(t.num_rows for t in new)
    by_digest = {d["digest"]: d for d in docs}
    prompt_ids = {stable_hash(p): i for i, p in enumerate(job.prompts, 1)}
    rows, seen = [], set()
    for r in pooled.to_pylist():  # oldest shard first: a row made twice (two runs at once) keeps the first
        doc, prompt_id = by_digest.get(r["doc_digest"]), prompt_ids.get(r["prompt_digest"])
        if doc is None or prompt_id is None or (r["doc_digest"], prompt_id, r["sample"]) in seen:
            continue
        seen.add((r["doc_digest"], prompt_id, r["sample"]))
        text, ended = first_sentence(r["continuation"])
        status = summary_status(text, ended, r["finish"], source_text(doc["title"], doc["text"]))
        rows.append(dict(doc_id=doc["doc_id"], prompt_id=prompt_id, sample=r["sample"], text=text, status=status,
                         **{k: r[k] for k in ("continuation", "finish", "tokens", "model", "backend", "sampling",
                                              "seed")}))
    table = pa.Table.from_pylist(rows).sort_by([("doc_id", "ascending"), ("prompt_id", "ascending"),
                                                ("sample", "ascending")])
    stats = table.group_by(["prompt_id", "status"]).aggregate([("sample", "count")]).rename_columns(
        ["prompt_id", "status", "count"])
    out.write_table("summaries", table)
    out.write_table("stats", stats.sort_by([("prompt_id", "ascending"), ("status", "ascending")]))
    counts = {s: int(pc.sum(pc.equal(table["status"], s)).as_py() or 0) for s in STATUSES}
    out.extra.update(documents=len(docs), generated=made, reused=table.num_rows - made, status=counts, cut=cut)
    log.info("%d rows (%d generated now, %d from the pool): %s", table.num_rows, made,
             table.num_rows - made, ", ".join(f"{s} {n}" for s, n in counts.items()))


SUMMARIZE = Stage("summarize", build_summaries, extra_key=lambda job: llm.identity(job.llm), gpu=True,
                  seeds_global_rng=True)
