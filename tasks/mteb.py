"""MTEB: one artifact per (model, task), so adding a task or a model scores only what is new.

Inputs: `model`, the train or init artifact holding the model, if any. Output `metrics.parquet` in
storage.METRICS_SCHEMA with the task's main score and what is needed to reproduce it (task
revision, mteb version, split, dtype, batch size, max length); a task whose data is not reachable
gets a `skipped` row that says why instead of failing the run. A local retrieval task also writes
`query_scores.parquet`, each query's nDCG@10 from mteb's own scoring (rank null: a query may have
several relevant documents), which the report pairs across models. mteb's own result files, in the
layout of its ResultCache (`mteb/results/<model>/<revision>/<task>.json` and `model_meta.json`),
go into the artifact too: a model embforge made is named `embforge/<recipe>-<pooling>` with its
artifact's key as the revision, so `embforge mteb-results` hands mteb every score to compare.
"""

from __future__ import annotations

import logging
import shutil
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
from pydantic import Field

from storage.base import ArtifactRef, file_digest
from storage.catalog import QUERY_SCORES, metrics_table
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import Section
from tasks.config.evaluation import LocalTaskConfig, MtebSettings
from tasks.config.model import Prompts
from tasks.core.stage import Stage
from tasks.encoders.models import ModelInputs, model_identity, resolve_model


class MtebJob(Section):
    model: str | None = Field(None, description="External model; None when the inputs carry it.")
    pooling: str = "mean"
    task: str | LocalTaskConfig
    settings: MtebSettings
    device: str = "auto"
    prompts: Prompts = Field(default_factory=Prompts, description="model.prompts: queries after the query one, "
                             "every other text after the document one.")


def build_scores(store: ArtifactStore, job: MtebJob, inputs: ModelInputs,
                 out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    from tasks.metrics import mteb_tasks  # mteb takes ~1.3 s to import: only where a task is scored

    scored = mteb_tasks.evaluate_mteb(inputs.model_location(store, job.model), job.pooling, job.settings,
                                      job.task, job.device, out.folder / RESULTS, results_meta(store, job, inputs), log,
                                      job.prompts)
    out.write_table("metrics", metrics_table(scored.rows, key=ref.key, model=inputs.model_name(job.model),
                                             dataset="mteb", pooling=job.pooling))
    if scored.per_query is not None:  # a local retrieval task: paired over its queries in the report
        queries = sorted(scored.per_query)
        out.write_table(QUERY_SCORES, pa.table({"query_id": queries, "rank": pa.nulls(len(queries), pa.int64()),
                                                "ndcg": [scored.per_query[q] for q in queries]}))
    out.extra.update(cut=scored.cut)


RESULTS = "mteb"  # the ResultCache folder inside the artifact


def results_meta(store: ArtifactStore, job: MtebJob, inputs: ModelInputs) -> tuple[str, str | None]:
    """(name, revision) of the model in mteb's result files."""
    from tasks.metrics import mteb_tasks

    if inputs.model is None:  # a folder's revision is a digest of its files; a Hub model's is the Hub's
        local = Path(resolve_model(job.model)).is_dir()
        return mteb_tasks.results_name(job.model, job.pooling), model_identity(job.model) if local else None
    recipe = store.manifest(inputs.model)["config"].get("recipe", inputs.model.stage)  # init: "init"
    return mteb_tasks.results_name(inputs.model.address, job.pooling, recipe), inputs.model.key


def collect_results(store: ArtifactStore, to: Path) -> int:
    """Copy the mteb result files of every mteb artifact into the ResultCache folder `to`
    (`mteb.ResultCache(to).load_results()` reads them); returns the task results copied."""
    copied = 0
    for ref in store.artifacts("mteb"):
        store.check(ref)
        source = store.path(ref) / RESULTS
        for file in sorted(source.rglob("*.json")):
            target = to / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)
            copied += file.name != "model_meta.json"
    return copied


def scored(store: ArtifactStore, ref: ArtifactRef) -> bool:
    """A task skipped for want of data is tried again on the next run."""
    return "skipped" not in store.read_table(ref, "metrics")["status"].to_pylist()


def _key_material(job: MtebJob) -> list:
    files = [] if isinstance(job.task, str) else [file_digest(p) for p in (job.task.path, job.task.queries) if p]
    # version("mteb") is mteb.__version__, read without importing mteb
    return [model_identity(job.model) if job.model else None, files, version("mteb")]


MTEB = Stage("mteb", build_scores, extra_key=_key_material, complete=scored, gpu=True)
