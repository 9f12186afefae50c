"""Evaluate one model: kNN accuracy on the labelled documents and STS Spearman.

Inputs: the documents artifact, plus the train or init artifact holding the model (or
`EvalJob.model` names an external model). Output `metrics.parquet`, one row per metric:
key, model, dataset, metric, value, std, n, repeats, split.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field

from storage import ArtifactRef, ArtifactStore, file_digest
from storage.store import ArtifactWriter
from tasks import encode
from tasks.config import KnnConfig, Section, StsConfig
from tasks.metrics import knn, sts
from tasks.models import model_identity
from tasks.stage import Stage
from tasks.train import model_path


class EvalJob(Section):
    model: str | None = Field(None, description="External model (name or path); None when the "
                              "inputs carry a train or init artifact.")
    dataset: str = Field(description="Dataset name recorded with each score.")
    max_length: int
    batch_size: int
    knn: KnnConfig | None
    sts: StsConfig | None
    pooling: str = Field("mean", description="mean, cls or sep: the pooling the model was trained with.")
    device: str = "auto"


def knn_rows(emb: np.ndarray, labels: list[str], cfg: KnnConfig) -> list[dict]:
    acc, n_test = knn.knn_accuracy(emb, labels, cfg.k, cfg.test_size, cfg.seed)
    rows = [dict(metric="knn_accuracy", value=acc, std=None, n=n_test, repeats=1, split=f"seed {cfg.seed}")]
    if cfg.repeats > 1:
        # A 10% test split of a small corpus is noisy: report the spread over other splits too.
        mean, std = knn.knn_accuracy_spread(emb, labels, cfg.k, cfg.test_size, range(cfg.repeats))
        rows.append(dict(metric="knn_accuracy_splits", value=mean, std=std, n=n_test,
                         repeats=cfg.repeats, split=f"seeds 0-{cfg.repeats - 1}"))
    return rows


def sts_rows(encoder: encode.PooledEncoder, job: EvalJob) -> list[dict]:
    pairs = pd.read_parquet(job.sts.path)
    if job.sts.split:
        pairs = pairs[pairs["split"] == job.sts.split]
    emb = encoder.encode(pairs["sentence1"].tolist() + pairs["sentence2"].tolist(), job.max_length, job.batch_size)
    rho = sts.sts_spearman(emb[: len(pairs)], emb[len(pairs) :], pairs["score"].to_numpy())
    return [dict(metric="sts_spearman", value=rho, std=None, n=len(pairs), repeats=1, split=job.sts.split)]


def build_metrics(store: ArtifactStore, job: EvalJob, inputs: list[ArtifactRef],
                  out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs_ref, *trained = inputs
    encoder = encode.PooledEncoder(model_path(store, trained[0]) if trained else job.model, job.device, job.pooling)
    rows = []
    if job.knn:
        docs = store.read_table(docs_ref, "documents").to_pandas()
        docs = docs[docs["label"].notna()]
        if len(docs) < 2 * job.knn.k:
            log.warning("evaluate: only %d labelled documents, kNN accuracy skipped", len(docs))
        else:
            emb = encoder.encode(docs["text"].tolist(), job.max_length, job.batch_size)
            rows += knn_rows(emb, docs["label"].tolist(), job.knn)
    if job.sts:
        rows += sts_rows(encoder, job)
    source = f"{trained[0].stage}/{trained[0].key}" if trained else job.model
    table = pd.DataFrame(rows).assign(key=ref.key, model=source, dataset=job.dataset)
    table = table[["key", "model", "dataset", "metric", "value", "std", "n", "repeats", "split"]]
    out.write_table("metrics", pa.Table.from_pandas(table, preserve_index=False))
    for r in rows:
        log.info("evaluate %s: %s = %.4f%s", source, r["metric"], r["value"],
                 f" ± {r['std']:.4f}" if r["std"] is not None else "")


def _key_material(job: EvalJob) -> list:
    return [model_identity(job.model) if job.model else None,
            file_digest(job.sts.path) if job.sts else None]


EVALUATE = Stage("evaluate", build_metrics, code=(sys.modules[__name__], encode, knn, sts),
                 extra_key=_key_material)
