"""Negatives: hard negatives and round-trip ranks of the generated queries, mined with the start model.

GPL (Wang et al. 2022) trains on (query, its passage, hard negative) triples whose negatives a dense
retriever mines: the passages it ranks highest for the query that are not the query's own. InPars and
Promptagator keep a generated query only if the retriever ranks its own passage near the top
(round-trip consistency). One pass gives both: every ok query is scored (cosine, normalised vectors
of the job's pooling) against every passage. Passages whose cosine with the query's own passage is
at least `duplicate_similarity` are near-copies of it (a corpus's duplicates), not negatives.

Inputs: `documents` (passage = its `text`: what the pairs train on and what the embed stage encodes
for evaluation), `queries` (its rows with status "ok"), `model`, the train or init artifact holding the start
model, if any. The passages' vectors are held (float32, passages × dim); queries are encoded CHUNK_TEXTS
at a time and scored a block at a time within BLOCK_BYTES. Output `negatives.parquet`, in the queries'
order: query_id, doc_id, split, query, positive_score, positive_rank (1 = no passage scores higher than
its own), negatives (doc ids, best first, at most k), negative_scores, and with `cross_encoder` the
teacher's raw scores of the query with its passage (positive_teacher) and with each negative
(negative_teacher; null without one): GPL's MarginMSE labels are their differences.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import torch
from pydantic import Field
from sentence_transformers.cross_encoder import CrossEncoder

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Precision, Section
from tasks.config.evaluation import EvaluateConfig
from tasks.config.model import Prompts
from tasks.config.queries import NegativesConfig
from tasks.core.stage import Stage
from tasks.encoders import encode
from tasks.encoders.budget import char_budget, over_budget
from tasks.encoders.inputs import prompted
from tasks.encoders.models import ModelInputs, load_model, model_identity, pick_device
from tasks.metrics import BLOCK_BYTES, block_rows, ranks_of_own, unit_rows

CHUNK_TEXTS = 4096  # texts encoded at once; a chunk of queries is mined before the next is encoded
WRITE_ROWS = 65_536  # output rows per row group

SCHEMA = pa.schema([("query_id", pa.string()), ("doc_id", pa.string()), ("split", pa.string()),
                    ("query", pa.string()), ("positive_score", pa.float32()), ("positive_rank", pa.int32()),
                    ("negatives", pa.list_(pa.string())), ("negative_scores", pa.list_(pa.float32())),
                    ("positive_teacher", pa.float32()), ("negative_teacher", pa.list_(pa.float32()))])


class NegativesJob(Section):
    model: str | None = Field(None, description="External start model (name or path); None when the inputs "
                              "carry a train or init artifact.")
    pooling: Literal["mean", "cls", "sep"] = "mean"
    negatives: NegativesConfig = Field(default_factory=NegativesConfig)
    device: str = "auto"
    dtype: Precision = EvaluateConfig.model_fields["dtype"].default
    prompts: Prompts = Field(default_factory=Prompts, description="The start model reads the queries after the "
                             "query prompt and the passages after the document one (model.prompts).")


class NegativesInputs(ModelInputs):
    """`model` (from ModelInputs): the train or init artifact holding the start model, or None."""

    documents: ArtifactRef
    queries: ArtifactRef


def negatives_per_query(k: int, passages: int) -> int:
    """k' = min(k, p − 1): every passage but the query's own can be a negative."""
    return max(0, min(k, passages - 1))


def mine(query_vecs: np.ndarray, passage_vecs: np.ndarray, positives_idx: np.ndarray, k: int,
         duplicate_similarity: float, block_bytes: int = BLOCK_BYTES,
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hard negatives and the rank of each query's own passage.

    query_vecs (q × dim) and passage_vecs (p × dim): unit-length vectors; positives_idx (q,): the row of
    each query's passage. Returns neg_idx (q × k') int64 and neg_scores (q × k') float32, best first,
    k' = min(k, p − 1), padded with -1 / NaN where near-duplicates leave fewer candidates; positive_rank
    (q,) int32 = its passage's rank (ties against it: metrics.ranks_of_own); positive_score (q,) float32.
    """
    q, p = len(query_vecs), len(passage_vecs)
    kk = negatives_per_query(k, p)
    positives_idx = np.asarray(positives_idx, dtype=np.int64)
    neg_idx = np.full((q, kk), -1, dtype=np.int64)
    neg_scores = np.full((q, kk), np.nan, dtype=np.float32)
    positive_rank = np.empty(q, dtype=np.int32)
    positive_score = np.empty(q, dtype=np.float32)
    # Per score cell at most: float32 scores + float32 duplicate cosines + a bool mask, then
    # float32 scores + argpartition's int64 positions.
    rows = block_rows(p, 16, block_bytes)
    for start in range(0, q, rows):
        stop = min(q, start + rows)
        pos = positives_idx[start:stop]  # (b,)
        b = np.arange(stop - start)  # (b,) row index, paired with pos for one cell per row
        scores = np.asarray(query_vecs[start:stop], np.float32) @ passage_vecs.T  # (b × p)
        own = scores[b, pos]  # (b,)
        positive_score[start:stop] = own
        positive_rank[start:stop] = ranks_of_own(scores, own)
        if kk == 0:
            continue
        duplicates = passage_vecs[pos] @ passage_vecs.T  # (b × p): cosine of each own passage with all
        scores[duplicates >= duplicate_similarity] = -np.inf
        del duplicates
        scores[b, pos] = -np.inf  # its own passage, even where rounding puts its self-cosine under 1
        np.negative(scores, out=scores)  # in place: smallest first for argpartition, no copy
        top = np.argpartition(scores, kk - 1, axis=1)[:, :kk]  # (b × kk), unordered; kk < p always
        top_scores = -np.take_along_axis(scores, top, axis=1)  # (b × kk)
        order = np.argsort(-top_scores, axis=1, kind="stable")  # (b × kk): best first
        top, top_scores = np.take_along_axis(top, order, 1), np.take_along_axis(top_scores, order, 1)
        skipped = np.isneginf(top_scores)  # (b × kk): fewer than kk candidates left
        neg_idx[start:stop] = np.where(skipped, -1, top)
        neg_scores[start:stop] = np.where(skipped, np.nan, top_scores)
    return neg_idx, neg_scores, positive_rank, positive_score


def unit_vectors(encoder: encode.PooledEncoder, texts: list[str], pooling: str, cfg: NegativesConfig,
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(positions in `texts`, their unit-length float32 vectors (positions × dim)), a chunk at a time."""
    j = encode.POOLINGS.index(pooling)
    for positions, emb in encoder.encode_chunks(texts, cfg.max_length, cfg.batch_size, chunk=CHUNK_TEXTS):
        yield positions, unit_rows(emb[0, j], np.float32)  # (1 layer × poolings × n × dim) → (n × dim)


def teacher_scores(cross_encoder, queries: list[str], passages: list[str], positives: np.ndarray,
                   neg_idx: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The cross-encoder's raw scores (logits, as GPL's margins use them) of each query with its own
    passage, (q,), and with each of its negatives, (q × k') with NaN where neg_idx pads; CHUNK_TEXTS
    queries' pairs at a time."""
    positive = np.empty(len(queries), dtype=np.float32)
    negative = np.full(neg_idx.shape, np.nan, dtype=np.float32)
    for start in range(0, len(queries), CHUNK_TEXTS):
        rows = range(start, min(start + CHUNK_TEXTS, len(queries)))
        cells = [(i, j) for i in rows for j in np.flatnonzero(neg_idx[i] >= 0)]
        pairs = [(queries[i], passages[positives[i]]) for i in rows] + [
            (queries[i], passages[neg_idx[i, j]]) for i, j in cells]
        scores = cross_encoder.predict(pairs, batch_size=batch_size, activation_fn=torch.nn.Identity(),
                                       show_progress_bar=False)
        positive[rows.start : rows.stop] = scores[: len(rows)]
        if cells:
            i, j = np.array(cells).T
            negative[i, j] = scores[len(rows) :]
    return positive, negative


def negatives_tables(queries: pa.Table, doc_ids: pa.Array, neg_idx: np.ndarray, neg_scores: np.ndarray,
                     positive_rank: np.ndarray, positive_score: np.ndarray,
                     teacher: tuple[np.ndarray, np.ndarray] | None) -> Iterator[pa.Table]:
    for start in range(0, queries.num_rows, WRITE_ROWS):
        part = slice(start, start + WRITE_ROWS)
        valid = neg_idx[part] >= 0  # (n × k'): padding dropped; rows stay best first
        offsets = pa.array(np.concatenate([[0], np.cumsum(valid.sum(1))]).astype(np.int32))  # (n + 1,)
        lists = {"negatives": pa.ListArray.from_arrays(offsets, doc_ids.take(pa.array(neg_idx[part][valid]))),
                 "negative_scores": pa.ListArray.from_arrays(offsets, pa.array(neg_scores[part][valid]))}
        rows = queries.slice(start, WRITE_ROWS)
        if teacher:  # in the negatives' order, like their scores
            lists |= {"positive_teacher": teacher[0][part],
                      "negative_teacher": pa.ListArray.from_arrays(offsets, pa.array(teacher[1][part][valid]))}
        else:
            lists |= {c: pa.nulls(rows.num_rows, SCHEMA.field(c).type)
                      for c in ("positive_teacher", "negative_teacher")}
        yield pa.table({**{c: rows[c] for c in ("query_id", "doc_id", "split", "query")},
                        "positive_score": positive_score[part], "positive_rank": positive_rank[part], **lists},
                       schema=SCHEMA)


def build_negatives(store: ArtifactStore, job: NegativesJob, inputs: NegativesInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    cfg = job.negatives
    docs = store.read_table(inputs.documents, "documents", columns=["doc_id", "text"])
    queries = store.read_table(inputs.queries, "queries", columns=["query_id", "doc_id", "query", "split"],
                               filters=[("status", "=", "ok")])
    doc_ids = docs["doc_id"].combine_chunks()
    row_of = {doc: i for i, doc in enumerate(doc_ids.to_pylist())}
    if missing := sorted({d for d in queries["doc_id"].to_pylist() if d not in row_of}):
        raise InputError(f"{len(missing)} query passage(s) not among the documents, e.g. doc_id {missing[0]!r}: "
                         "the queries were written for another corpus")
    positives = np.array([row_of[d] for d in queries["doc_id"].to_pylist()], dtype=np.int64)  # (q,)
    passages = docs["text"].to_pylist()
    texts = queries["query"].to_pylist()
    del docs
    log.info("%d ok queries against %d passages, k %d, max length %d", len(texts), len(passages), cfg.k,
             cfg.max_length)
    if cut := over_budget(passages, cfg.max_length):
        log.info("%d passage(s) over %s characters cut to that before tokenizing", cut,
                 f"{char_budget(cfg.max_length):,}")

    encoder = encode.PooledEncoder(inputs.model_location(store, job.model), job.device, dtype=job.dtype)
    passage_vecs = np.empty((len(passages), encoder.dim), dtype=np.float32)  # (p × dim), held
    for positions, vecs in unit_vectors(encoder, prompted(passages, job.prompts.document), job.pooling, cfg):
        passage_vecs[positions] = vecs
    if not cfg.cross_encoder:  # the teacher reads them again
        del passages
    kk = negatives_per_query(cfg.k, len(passage_vecs))
    neg_idx = np.full((len(texts), kk), -1, dtype=np.int64)  # (q × k'): k' ints per query, not dim floats
    neg_scores = np.full((len(texts), kk), np.nan, dtype=np.float32)
    positive_rank = np.empty(len(texts), dtype=np.int32)
    positive_score = np.empty(len(texts), dtype=np.float32)
    # Each chunk is mined as soon as it is encoded (the encoder's progress counts both), so only
    # one chunk's query vectors are held; results land at the queries' own positions.
    for positions, vecs in unit_vectors(encoder, prompted(texts, job.prompts.query), job.pooling, cfg):
        found = mine(vecs, passage_vecs, positives[positions], cfg.k, cfg.duplicate_similarity)
        neg_idx[positions], neg_scores[positions], positive_rank[positions], positive_score[positions] = found

    teacher = None
    if cfg.cross_encoder:
        del encoder  # its memory, before the cross-encoder's
        log.info("scoring %d queries with their passage and %d negatives with the cross-encoder %s", len(texts),
                 int((neg_idx >= 0).sum()), cfg.cross_encoder)
        cross_encoder = load_model(cfg.cross_encoder, lambda p: CrossEncoder(p, max_length=cfg.max_length,
                                                                            device=pick_device(job.device)))
        teacher = teacher_scores(cross_encoder, texts, passages, positives, neg_idx, cfg.batch_size)
    out.write_batches("negatives", SCHEMA, negatives_tables(queries, doc_ids, neg_idx, neg_scores,
                                                            positive_rank, positive_score, teacher))
    median = float(np.median(positive_rank)) if len(texts) else None
    first = float((positive_rank == 1).mean()) if len(texts) else None
    out.extra.update(queries=len(texts), passages=len(passage_vecs), median_positive_rank=median,
                     rank1_share=first, negatives=int((neg_idx >= 0).sum()))
    log.info("%d queries mined: own passage ranked first for %s, median rank %s, %.1f negatives a query",
             len(texts), f"{first:.1%}" if first is not None else "-", median,
             (neg_idx >= 0).sum() / max(1, len(texts)))


def _key_material(job: NegativesJob) -> list[str | None]:
    return [model_identity(m) if m else None for m in (job.model, job.negatives.cross_encoder)]


NEGATIVES = Stage("negatives", build_negatives, extra_key=_key_material, gpu=True)
