"""Train: fine-tune an encoder on a pairs artifact with InfoNCE; save it in sentence-transformers format.

Inputs: the pairs artifact, plus the init artifact when the encoder starts from random weights.
Checkpoints go to the store's scratch area, so a killed run resumes mid-training.
Output: `model/` (loads with `SentenceTransformer(path)`) and `training.parquet` (the per-step loss
and learning rate: the learning curve).
"""

from __future__ import annotations

import logging
import sys

import pyarrow as pa
from pydantic import Field

from storage import ArtifactRef, ArtifactStore
from storage.store import ArtifactWriter
from tasks.config import Section, TrainConfig
from tasks import models
from tasks.methods import contrastive, infonce
from tasks.models import model_identity, sentence_model
from tasks.stage import Stage


class TrainJob(Section):
    base_model: str | None = Field(description="Pre-trained start (name or path); None when the "
                                   "inputs carry a randomly initialised encoder.")
    train: TrainConfig


def model_path(store: ArtifactStore, ref: ArtifactRef) -> str:
    """Folder of the encoder held by a train or init artifact."""
    return str(store.path(ref) / "model")


def build_model(store: ArtifactStore, job: TrainJob, inputs: list[ArtifactRef],
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    pairs_ref, *init = inputs
    cfg = job.train
    model = sentence_model(model_path(store, init[0]) if init else job.base_model, cfg.max_length,
                           cfg.device, cfg.pooling)
    models.freeze(model, cfg.freeze_embeddings, cfg.freeze_layers)
    pairs = store.read_table(pairs_ref, "pairs").to_pydict()
    epochs = max(pairs["epoch"]) + 1
    per_epoch: list[list[contrastive.Pair]] = [[] for _ in range(epochs)]
    for epoch, anchor, positive in zip(pairs["epoch"], pairs["anchor"], pairs["positive"]):
        per_epoch[epoch].append((anchor, positive))
    log.info("train: %d pairs x %d epoch(s), batch %d, lr %g, on %s", len(per_epoch[0]), epochs,
             cfg.batch_size, cfg.lr, model.device)
    history = contrastive.train_contrastive(model, per_epoch, cfg, contrastive.Checkpoints(store.scratch(ref)), log)
    model.save(str(out.folder / "model"))
    out.write_table("training", pa.Table.from_pylist([vars(h) for h in history]))
    out.extra.update(steps=len(history), final_loss=history[-1].loss if history else None)


TRAIN = Stage("train", build_model, code=(sys.modules[__name__], models, contrastive, infonce),
              extra_key=lambda job: model_identity(job.base_model) if job.base_model else None, retries=1)
