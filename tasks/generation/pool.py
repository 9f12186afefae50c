"""What the stages that write with an LLM share (summaries, queries): the documents, cut to fit the
LLM's context, the prompt built from each, the copy test of the quality guards, and the generation
of the rows a shard pool (storage/shards.py) lacks, a shard of documents at a time.

Pool rows: doc_id, doc_digest, prompt, prompt_digest, sample, continuation, finish, tokens, model,
backend, sampling, seed. Imports no stage: the caller resolves the LLM's folder and prompt prefix
(tasks/llm.py).
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
from storage.store import ArtifactStore
from tasks.config.summaries import GenerationConfig
from tasks.core.progress import StageProgress
from tasks.encoders.budget import char_budget
from tasks.encoders.models import load_model
from tasks.generation import generate

STATUSES = ("ok", "empty", "run_on", "repeat")  # the quality guard's labels of a generated row (ok: usable)
# The pool row's columns a stage's artifact keeps as they are: how each text was generated.
GENERATION_COLUMNS = ("continuation", "finish", "tokens", "model", "backend", "sampling", "seed")
WORD = re.compile(r"\w+")


def read_documents(store: ArtifactStore, docs_ref: ArtifactRef, limit: int | None,
                   only: set[str] | None = None) -> list[dict]:
    """The first `limit` documents (all without one), of those in `only` where given, each with the `digest` its pool
    rows are found by."""
    docs = store.read_table(docs_ref, "documents").select(["doc_id", "title", "text"]).to_pylist()
    docs = [d for d in docs if d["doc_id"] in only] if only is not None else docs
    docs = docs[:limit] if limit else docs
    for d in docs:
        d["digest"] = stable_hash(d["title"], d["text"])
    return docs


def document_text(title: str | None, text: str) -> str:
    """A document as the LLM reads it: its title, a line break, its text."""
    return f"{title}\n{text}" if title else text


def build_prompt(prefix: str, title: str | None, text: str, prompt: str) -> str:
    return f"{prefix}{document_text(title, text)}\n{prompt}"


def fitted_text(tokenizer, text: str, budget: int) -> tuple[str, bool]:
    """The first `budget` tokens of `text`, as text, and whether it was cut. Characters are cut first
    (`budget.char_budget`), so that a huge document is never tokenized whole."""
    head = text[: char_budget(budget)]
    ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return head, len(head) < len(text)
    return tokenizer.decode(ids[:budget]), True


def fit_documents(tokenizer, docs: list[dict], prefix: str, prompts: list[str], max_tokens: int,
                  most: int | None = None) -> int:
    """Set each document's `fitted` text: cut so that every prompt built from it and its continuation
    fit the LLM's context (generate.CONTEXT tokens), and to `most` tokens where given; returns how many were cut."""
    cut = 0
    for d in docs:
        around = max(len(tokenizer(build_prompt(prefix, d["title"], "", p))["input_ids"]) for p in prompts)
        # 8 tokens of slack: tokens can merge differently where the text meets the rest of the prompt
        budget = max(generate.CONTEXT - max_tokens - around - 8, 0)
        d["fitted"], was_cut = fitted_text(tokenizer, d["text"], min(budget, most or budget))
        cut += was_cut
    return cut


def trigrams(text: str) -> list[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return [tuple(words[i : i + 3]) for i in range(len(words) - 2)]


def copies_source(text: str, source: str, copied: float = 0.8) -> bool:
    """Whether at least a share `copied` of `text`'s word trigrams are in `source` (False without trigrams)."""
    grams, source_grams = trigrams(text), set(trigrams(source))
    return bool(grams) and sum(g in source_grams for g in grams) / len(grams) >= copied


def quality(text: str, ended: bool, finish: str, source: str, min_words: int, copied: float = 0.8) -> str:
    """`ok`, or why a generated text is useless: `empty` (under `min_words` words), `run_on` (cut at
    max_tokens before it ended) or `repeat` (it copies its source: copies_source)."""
    if len(WORD.findall(text)) < min_words:
        return "empty"
    if not ended and finish == "length":
        return "run_on"
    if copies_source(text, source, copied):
        return "repeat"
    return "ok"


def status_counts(table: pa.Table) -> dict[str, int]:
    """Rows per quality status (every status, 0 included), for the manifest and the log."""
    return {s: int(pc.sum(pc.equal(table["status"], s)).as_py() or 0) for s in STATUSES}


def rows_key(llm_identity: str, job: GenerationConfig) -> str:
    """A pool's key: rows are interchangeable between jobs that share the LLM's weights, the sampling settings and
    the cut of a document's text (not the backend: both sample the same distribution). No cut, no part of the key:
    the pools made before `max_input_tokens` keep theirs."""
    cut = [job.max_input_tokens] if job.max_input_tokens is not None else []
    return stable_hash(llm_identity, job.sampling.model_dump(mode="json"), *cut)


def generate_missing(docs: list[dict], pool: ShardPool, have: pa.Table | None, prompts: list[str],
                     job: GenerationConfig, *, model_dir: str, prefix: str, log: logging.Logger,
                     what: str = "rows") -> tuple[list[pa.Table], int]:
    """Generate the (document, prompt) rows that `have` (the pool as read) lacks with the job's LLM (loaded from
    `model_dir`; every prompt starts with `prefix`), `shard_size` documents per pool shard; returns the new
    shards' tables and how many of the documents were cut (to fit the LLM's context or to `max_input_tokens`)."""
    model, sampling, shard_size = job.llm, job.sampling, job.shard_size
    done = set(zip(have["doc_digest"].to_pylist(), have["prompt_digest"].to_pylist())) if have else set()
    hashed = [(p, stable_hash(p)) for p in prompts]
    todo = [(d, [(p, h) for p, h in hashed if (d["digest"], h) not in done]) for d in docs]
    todo = [(d, missing) for d, missing in todo if missing]
    log.info("%d of %d documents need %s (%d pool shards)", len(todo), len(docs), what, len(pool.shards()))
    if not todo:
        return [], 0
    settings = json.dumps(sampling.model_dump(mode="json"), sort_keys=True)
    cut = fit_documents(load_model(model_dir, AutoTokenizer.from_pretrained), [d for d, _ in todo], prefix,
                        prompts, sampling.max_tokens, job.max_input_tokens)
    if cut:
        log.warning("%d of %d documents cut to fit the LLM's context of %d tokens%s", cut, len(todo),
                    generate.CONTEXT, f" or max_input_tokens ({job.max_input_tokens})" if job.max_input_tokens else "")
    generator = generate.make_generator(job.backend, model_dir, sampling)
    made = []
    try:
        with StageProgress(len(todo), "documents") as progress, \
                tqdm(total=len(todo), desc=progress.label, unit="doc") as bar:
            for start in range(0, len(todo), shard_size):
                shard = todo[start : start + shard_size]
                asked = [(d, p, h) for d, missing in shard for p, h in missing]
                outputs = generator.generate([build_prompt(prefix, d["title"], d["fitted"], p) for d, p, _ in asked])
                rows = [dict(doc_id=d["doc_id"], doc_digest=d["digest"], prompt=p, prompt_digest=h, sample=i,
                             continuation=c.text, finish=c.finish, tokens=c.tokens, model=model,
                             backend=generator.name, sampling=settings, seed=sampling.seed)
                        for (d, p, h), completions in zip(asked, outputs) for i, c in enumerate(completions)]
                made.append(pa.Table.from_pylist(rows))
                pool.write(made[-1])
                bar.update(len(shard))
                progress.advance(len(shard))
                log.info("shard of %d documents done (%d/%d)", len(shard), start + len(shard), len(todo))
    finally:
        generator.close()
    return made, cut


def pooled_rows(store: ArtifactStore, job: GenerationConfig, documents: ArtifactRef, pool: ShardPool,
                prompts: list[str], model_dir: str, prefix: str, log: logging.Logger,
                what: str, only: set[str] | None = None) -> tuple[list[dict], list[tuple[dict, dict]], int, int]:
    """Generate what `pool` lacks for the job's documents (those in `only` where given) and `prompts`, then read them
    back: the documents, each (document, pool row) once per (document, prompt, sample), oldest shard first (a row
    made twice, by two runs at once, keeps the first), the rows generated now, and the documents cut."""
    docs = read_documents(store, documents, job.limit, only)
    have = pool.read()
    new, cut = generate_missing(docs, pool, have, prompts, job, model_dir=model_dir, prefix=prefix, log=log,
                                what=what)
    pooled = pa.concat_tables(([have] if have is not None else []) + new, promote_options="default")
    by_digest, wanted = {d["digest"]: d for d in docs}, {stable_hash(p) for p in prompts}
    rows, seen = [], set()
    for r in pooled.to_pylist():
        doc, key = by_digest.get(r["doc_digest"]), (r["doc_digest"], r["prompt_digest"], r["sample"])
        if doc is None or r["prompt_digest"] not in wanted or key in seen:
            continue
        seen.add(key)
        rows.append((doc, r))
    return docs, rows, sum(t.num_rows for t in new), cut
