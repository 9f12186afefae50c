"""MTEB: one artifact per (model, task), so adding a task or a model scores only what is new.

Inputs: the train or init artifact holding the model, if any. Output `metrics.parquet` in
storage.METRICS_SCHEMA with the task's main score and what is needed to reproduce it (task
revision, mteb version, split, dtype, batch size, max length); a task whose data is not reachable
gets a `skipped` row that says why instead of failing the run.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

from pydantic import Field

from storage import ArtifactRef, ArtifactStore, file_digest, metrics_table
from storage.store import ArtifactWriter
from tasks import ingest, mteb_eval
from tasks.config import LocalTaskConfig, MtebConfig, Section
from tasks.models import model_identity
from tasks.stage import Stage
from tasks.train import model_path


class MtebJob(Section):
    model: str | None = Field(None, description="External model; None when the inputs carry it.")
    pooling: str = "mean"
    task: str | LocalTaskConfig
    max_length: int
    batch_size: int
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    device: str = "auto"

    @property
    def task_name(self) -> str:
        return self.task if isinstance(self.task, str) else self.task.name


def build_scores(store: ArtifactStore, job: MtebJob, inputs: list[ArtifactRef],
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    model = model_path(store, inputs[0]) if inputs else job.model
    settings = MtebConfig(max_length=job.max_length, batch_size=job.batch_size, dtype=job.dtype)
    rows = mteb_eval.evaluate_mteb(model, job.pooling, settings, job.task, job.device,
                                   store.scratch(ref) / "mteb-cache", log)
    source = f"{inputs[0].stage}/{inputs[0].key}" if inputs else job.model
    out.write_table("metrics", metrics_table(rows, key=ref.key, model=source, dataset="mteb",
                                             pooling=job.pooling))


def scored(store: ArtifactStore, ref: ArtifactRef) -> bool:
    """A task skipped for want of data is tried again on the next run."""
    return "skipped" not in store.read_table(ref, "metrics")["status"].to_pylist()


def _key_material(job: MtebJob) -> list:
    files = [] if isinstance(job.task, str) else [file_digest(p) for p in (job.task.path, job.task.queries) if p]
    return [model_identity(job.model) if job.model else None, files, mteb_eval.mteb.__version__]


MTEB = Stage("mteb", build_scores, code=(sys.modules[__name__], mteb_eval, ingest), extra_key=_key_material,
             complete=scored)
