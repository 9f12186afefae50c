"""Merge: a LoRA adapter (a train artifact of `train.lora`) added into the model it trained on, so that every later
stage (embedding, evaluation, a chained recipe's next stage, export) reads a plain model folder.

Inputs: `adapter` (the train artifact), and `start` (the init, converted-LLM or earlier train artifact the adapter
trained on) or the job's `base_model`. Output: `model/`, the merged model in sentence-transformers format, in the
train config's `save_dtype`. How it trained (its health, its learning curve) stays with the adapter's artifact:
`trained_ref` (tasks/encoders/models.py) finds it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from pydantic import Field

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.core.stage import Inputs, Stage
from tasks.encoders.lora import merge_adapter
from tasks.encoders.models import MERGED, base_model_identity, model_path


class MergeJob(Section):
    base_model: str | None = Field(description="The start model's name or path; None when `start` holds it.")
    save_dtype: str = "float32"


class MergeInputs(Inputs):
    adapter: ArtifactRef
    start: ArtifactRef | None = None


def build_merged(store: ArtifactStore, job: MergeJob, inputs: MergeInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    base = model_path(store, inputs.start) if inputs.start else job.base_model
    merge_adapter(base, Path(model_path(store, inputs.adapter)), out.folder / "model", getattr(torch, job.save_dtype))
    log.info("adapter %s added into %s", inputs.adapter.address, inputs.start.address if inputs.start else base)


MERGE = Stage(MERGED, build_merged, extra_key=base_model_identity)
