"""Latency: how long one query takes on the CPU, from its text to its ten best documents, for the models of a run side
by side in one process (tasks/metrics/speed.py's query_seconds), what a deployer weighs between the model families
beside the index's bytes. Each query is encoded alone (batch 1) with the model's encoder and scored against the
model's index of the corpus as evaluation scores it: the cosine of one vector a text, a sparse model's dot product of
its codes through their posting lists, a multi-vector model's MaxSim over the token vectors its embed artifact kept
(exact, all documents; the index made once, before the clock starts). The queries are the run's held-out ones (the
yardstick's titles or an LLM's queries, else the queries stage's), their first `queries`.

Output `metrics`: each model's `cpu_query_ms`, the median over the queries (`model` is its label; `n` the queries).
Timings are not reproducible to the digit: the stage is cached like any other, and a new measurement needs a new key
or `--force`.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

import numpy as np

from storage.base import ArtifactRef
from storage.catalog import metrics_table
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.config.evaluation import MaxSimSearch
from tasks.core import progress
from tasks.core.held_out import held_out_queries
from tasks.core.stage import Inputs, Stage
from tasks.encoders.encode import SparseCodeEncoder, TokenMeanEncoder, encoder_at
from tasks.encoders.models import model_identity, model_path
from tasks.metrics import retrieval, speed
from tasks.search import searcher

TOP = 10  # the documents a query is answered with


class LatencyModel(Section):
    external: str | None = None  # its Hub name or folder when no artifact holds it
    pooling: str = "mean"


class LatencyJob(Section):
    models: dict[str, LatencyModel]  # label → how to load it
    dataset: str
    queries: int = 64
    max_length: int
    prompt: str = ""  # model.prompts.query, put before every query as the embed stage puts it
    maxsim: MaxSimSearch | None = None  # how a multi-vector model's queries search (None: no such model, or defaults)


class LatencyInputs(Inputs):
    models: dict[str, ArtifactRef | None]  # label → its train (or init) artifact, None for an external model
    embeddings: dict[str, ArtifactRef]  # label → its documents' embed artifact (the index)
    queries: ArtifactRef  # the held-out queries: a yardstick's or the queries stage's


def answer(store: ArtifactStore, job: LatencyJob, label: str, inputs: LatencyInputs
           ) -> Callable[[str], np.ndarray] | None:
    """A model's query path: its text encoded alone on the CPU, scored against the index made here, the best TOP
    documents' rows out; None for a multi-vector model whose token vectors were not kept (nothing to search)."""
    model = job.models[label]
    docs = inputs.embeddings[label]
    token_mean = bool(store.manifest(docs)["extra"].get("token_mean"))
    search = searcher(store, docs, model.pooling, token_mean, maxsim=job.maxsim)
    if search is None:
        return None
    ref = inputs.models[label]
    encoder = encoder_at(model_path(store, ref) if ref else model.external, "cpu", model.pooling)
    index = retrieval.scorer(search.docs, search.similarity, job.max_length)

    def encoded(query: str) -> retrieval.Texts:
        if isinstance(encoder, TokenMeanEncoder):  # its query's token vectors, every token scoring
            return next(encoder.token_chunks([query], job.max_length, 1, task="query"))[2]
        if isinstance(encoder, SparseCodeEncoder):  # its active codes, as the index visits them
            return next(encoder.sparse_chunks([query], job.max_length, 1))[1]
        return encoder.encode([query], job.max_length, 1)

    def top(query: str) -> np.ndarray:
        scores = index(encoded(job.prompt + query))(slice(0, 1))[0]  # (documents,)
        return np.argpartition(-scores, min(TOP, len(scores)) - 1)[:TOP]

    return top


def build_latency(store: ArtifactStore, job: LatencyJob, inputs: LatencyInputs,
                  out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    queries = held_out_queries(store, inputs.queries)["query"].to_pylist()[: job.queries]
    sides = {label: ask for label in job.models if (ask := answer(store, job, label, inputs))}
    if not queries or not sides:
        raise ValueError(f"latency needs held-out queries and a searchable model: {len(queries)} queries, "
                         f"models {sorted(sides)} of {sorted(job.models)}")
    log.info("timing %d queries, one at a time on the CPU, %d models in turn", len(queries), len(sides))
    with progress.silenced():  # no progress bar or API call inside the timed calls
        seconds = speed.query_seconds(sides, queries)
    rows = [dict(metric=speed.LATENCY_METRIC, model=label, value=1000 * statistics.median(values), n=len(values),
                 max_length=job.max_length, batch_size=1) for label, values in seconds.items()]
    out.write_table("metrics", metrics_table(rows, key=ref.key, dataset=job.dataset, status="ok"))
    log.info("CPU query latency (median ms): %s", ", ".join(f"{r['model']} {r['value']:.1f}" for r in rows))


LATENCY = Stage("latency", build_latency,
                extra_key=lambda job: sorted(model_identity(m.external) for m in job.models.values() if m.external))
