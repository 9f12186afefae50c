"""Speed: how many documents a second a static model (tasks/static.py) and its teacher encode on the CPU,
measured side by side in one process (tasks/metrics/speed.py), so that the report can set the two beside
each other. Both encode the corpus's first `documents` texts with the encoders the embed stage uses, at the
evaluation's max length and batch size, on the CPU whatever device the run trains on.

Output `metrics`: the static model's score rows `cpu_docs_per_s` and `teacher_cpu_docs_per_s` (medians
of `rounds` rounds, `n` = the documents). Timings are not reproducible to the digit: the stage is cached
like any other, and a new measurement needs a new key (another `static.speed_documents`) or `--force`.
"""

from __future__ import annotations

import logging

from storage.base import ArtifactRef
from storage.catalog import metrics_table
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.core import progress
from tasks.core.stage import Stage
from tasks.encoders import encode
from tasks.encoders.models import ModelInputs, model_identity, model_path
from tasks.encoders.text_sets import first_texts
from tasks.metrics import speed


class SpeedJob(Section):
    teacher: str | None = None  # the teacher's Hub name or folder when no artifact holds it
    pooling: str = "mean"  # the teacher's sentence vector
    dataset: str
    documents: int
    max_length: int
    batch_size: int
    rounds: int = 3


class SpeedInputs(ModelInputs):
    """`model`: the teacher's train or init artifact (if embforge made it)."""

    static: ArtifactRef
    documents: ArtifactRef


def build_speed(store: ArtifactStore, job: SpeedJob, inputs: SpeedInputs,
                out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    texts = first_texts(store, inputs.documents, "documents", job.documents)
    static = encode.StaticEncoder(model_path(store, inputs.static))
    teacher = encode.PooledEncoder(inputs.model_location(store, job.teacher), "cpu", job.pooling)
    log.info("timing %d documents on the CPU, static model and teacher in turn, %d rounds", len(texts), job.rounds)
    with progress.silenced():  # no progress bar or API call inside the timed calls
        rates = speed.documents_per_second(
            {name: lambda part, e=encoder: e.encode(part, job.max_length, job.batch_size)
             for name, encoder in zip(speed.SPEED_METRICS, (static, teacher))}, texts, job.rounds)
    rows = [dict(metric=name, value=value, n=len(texts), max_length=job.max_length, batch_size=job.batch_size,
                 repeats=job.rounds) for name, value in speed.medians(rates).items()]
    out.write_table("metrics", metrics_table(rows, key=ref.key, model=f"static/{inputs.static.key}",
                                             dataset=job.dataset, status="ok"))
    out.extra.update(rounds={name: [round(r, 1) for r in values] for name, values in rates.items()})
    log.info("CPU documents/s: static %.1f, teacher %.1f (%.1fx)", rows[0]["value"], rows[1]["value"],
             rows[0]["value"] / rows[1]["value"])


SPEED = Stage("speed", build_speed, extra_key=lambda job: model_identity(job.teacher) if job.teacher else None)
