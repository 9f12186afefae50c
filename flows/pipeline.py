"""The `pipeline` flow: ingest → sentences → [summaries] → [stage 1] → views → train → evaluate → report.

It only composes: each stage is a cached Prefect task (tasks/), artifacts are passed as small
references, and a run record in the store says which artifact every stage used and whether
Prefect found it cached, so the catalog can answer "what ran, on what, with what result".
"""

from __future__ import annotations

import os
import posixpath
import re
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from storage import ArtifactRef, ArtifactStore
from tasks.config import MethodConfig, PipelineConfig, TrainConfig, load_config
from tasks.embed import EMBED, EmbedJob
from tasks.evaluate import CURVES, EVALUATE, EvalJob
from tasks.ingest import INGEST
from tasks.llm import LLM, LlmJob, needs_conversion
from tasks.methods.recipes import pooling_for
from tasks.models import INIT, InitConfig
from tasks.mteb_stage import MTEB, MtebJob
from tasks.report import REPORT, ReportEntry, ReportJob
from tasks.semantic import SEMANTIC, SemanticJob
from tasks.sentences import SENTENCES
from tasks.stage import Stage
from tasks.summaries import SUMMARIZE, SummarizeJob
from tasks.train import TRAIN, TrainJob
from tasks.views import PAIRS, PairsConfig


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunRecord:
    """The run's entry in `runs/`: rewritten after every stage, so a killed run shows how far it got."""

    def __init__(self, store: ArtifactStore, cfg: PipelineConfig, config_path: str):
        self.store = store
        self.run_id = str(flow_run.id or f"local-{os.getpid()}")
        self.record = dict(run_id=self.run_id, name=cfg.name, status="running", config_path=config_path,
                           config=cfg.model_dump(mode="json"), started_at=_now(), finished_at=None,
                           error=None, stages=[])
        self._save()

    def _save(self) -> None:
        self.store.write_run(self.run_id, self.record)

    def stage(self, stage: Stage, config: BaseModel, inputs: list[ArtifactRef], label: str = "",
              method: str = "") -> ArtifactRef:
        runner = stage.as_task(self.store).with_options(task_run_name=f"{stage.name}[{label}]" if label else stage.name)
        state = runner(str(self.store.root), config, inputs, return_state=True)
        entry = dict(stage=stage.name, label=label, method=method, key=stage.key(config, inputs),
                     state=state.name)
        self.record["stages"].append(entry)
        self._save()
        return state.result()  # raises the stage's own error if it failed

    def finish(self, status: str, error: str | None = None) -> None:
        self.record.update(status=status, finished_at=_now(), error=error)
        self._save()


@task(name="publish-report")
def publish_report(store_root: str, report: ArtifactRef) -> None:
    """Show the report in the Prefect UI (cheap, so never cached: every run gets its artifacts)."""
    store = ArtifactStore(store_root)
    rows = store.read_table(report, "report").to_pandas()
    rows = rows[~rows["metric"].isin(CURVES)]  # the curves are pictures in the report
    table = rows[["model", "method", "dataset", "metric", "value", "std", "n", "layer", "pooling", "status"]]
    create_table_artifact(table=table.astype(object).where(table.notna(), None).to_dict("records"),
                          key="embforge-metrics", description="Metrics of this run's models")
    # The UI cannot open files relative to the report's folder: name pictures by their place in the store.
    folder = f"artifacts/{report.stage}/{report.key}"
    markdown = re.sub(r"\]\((?!https?:)([^)]+\.png)\)",
                      lambda m: f"]({posixpath.normpath(posixpath.join(folder, m.group(1)))})",
                      (store.path(report) / "report.md").read_text())
    create_markdown_artifact(markdown=markdown + f"\nPictures and Parquet files are in the artifact store under `{folder}`.\n",
                             key="embforge-report", description="Task × model report")


@dataclass(frozen=True)
class ReportedModel:
    label: str  # the name shown in the report
    method: str  # the recipe it was trained with, "none" for the base, "reference" for yardsticks
    inputs: list[ArtifactRef]  # the train or init artifact holding it, if any
    external: str | None = None  # else: its Hub name, folder or package:<name>
    pooling: str = "mean"  # the recipe's sentence vector; untrained models are read with mean pooling
    knn_holdout: bool = False  # trained without kNN's test documents


def train_method(run: RunRecord, cfg: PipelineConfig, method: MethodConfig, train: TrainConfig,
                 docs: ArtifactRef, sentences: ArtifactRef, base_model: str | None,
                 start: list[ArtifactRef], summaries: ArtifactRef | None = None) -> ReportedModel:
    """Views, then training, for one method; `start` holds the encoder artifact to start from."""
    views = PairsConfig.for_method(method, train.epochs, cfg.evaluate.knn)
    inputs = [sentences] + ([docs] if views.needs_documents else []) + ([summaries] if views.view == "summaries" else [])
    pairs = run.stage(PAIRS, views, inputs, method.name)
    job = TrainJob.for_method(base_model, method, train, cfg.evaluate.knn)
    trained = run.stage(TRAIN, job, [pairs] + start + ([docs] if job.knn else []), method.name, method.recipe)
    return ReportedModel(method.name, method.recipe, [trained], pooling=pooling_for(method.recipe, train),
                         knn_holdout=method.knn_holdout)


def evaluate_model(run: RunRecord, cfg: PipelineConfig, model: ReportedModel, docs: ArtifactRef,
                   summaries: ArtifactRef | None = None) -> list[ArtifactRef]:
    """Embed (cached per model and text set), then score: the evaluate artifact, the semantic
    benchmark's, then one per MTEB task."""
    ev = cfg.evaluate
    embed = dict(model=model.external, max_length=ev.max_length, batch_size=ev.batch_size, device=ev.device)
    docs_emb = run.stage(EMBED, EmbedJob(layers="all" if ev.layerwise else "last", **embed),
                         [docs] + model.inputs, model.label, model.method)
    sts_emb = [run.stage(EMBED, EmbedJob(pairs_path=ev.sts.path, split=ev.sts.split, **embed), model.inputs,
                         model.label, model.method)] if ev.sts else []
    job = EvalJob(label=model.label, model=model.external, dataset=cfg.data.display_name, pooling=model.pooling,
                  knn_holdout=model.knn_holdout, **ev.model_dump(include={"knn", "sts", "layerwise", "geometry", "tsne"}))
    scores = [run.stage(EVALUATE, job, [docs, docs_emb, *sts_emb, *model.inputs], model.label, model.method)]
    if ev.semantic:
        job = SemanticJob(label=model.label, dataset=cfg.data.display_name, pooling=model.pooling,
                          semantic=ev.semantic, summaries=summaries is not None, **embed)
        scores.append(run.stage(SEMANTIC, job, [docs, docs_emb, *([summaries] if summaries else []), *model.inputs],
                                model.label, model.method))
    if ev.mteb:
        settings = ev.mteb.model_dump(include={"max_length", "batch_size", "dtype"})
        for task in [*ev.mteb.task_names, *ev.mteb.local]:
            job = MtebJob(model=model.external, pooling=model.pooling, task=task, device=ev.device, **settings)
            scores.append(run.stage(MTEB, job, model.inputs, model.label, model.method))
    return scores


def run_pipeline(cfg: PipelineConfig, store: ArtifactStore, run: RunRecord) -> ArtifactRef:
    docs = run.stage(INGEST, cfg.data, [])
    sentences = run.stage(SENTENCES, cfg.sentences, [docs])
    init = run.stage(INIT, InitConfig.from_model(cfg.model), []) if cfg.model.random_init else None
    summaries = None
    if cfg.summaries:  # LLM summaries: SemCSE's positives and the semantic benchmark's queries
        source = cfg.summaries.llm
        llm = [run.stage(LLM, LlmJob(source=source), [])] if needs_conversion(source) else []
        summaries = run.stage(SUMMARIZE, SummarizeJob.from_config(cfg.summaries), [docs, *llm])

    base, start = (None, [init]) if init else (cfg.model.name_or_path, [])
    models = [ReportedModel("base (random init)", "none", [init]) if init else
              ReportedModel(f"base ({base})", "none", [], base)]
    if cfg.model.pretrain:  # stage 1 on a generic corpus; every method starts from its result
        pre = cfg.model.pretrain
        generic = run.stage(INGEST, pre.data, [], "stage 1")
        generic_sentences = run.stage(SENTENCES, cfg.sentences, [generic], "stage 1")
        stage1 = train_method(run, cfg, pre.method, pre.train_for(), generic, generic_sentences, base, start)
        models.append(replace(stage1, label=f"stage 1 ({pre.method.name})"))
        base, start = None, stage1.inputs
    for method in cfg.methods:
        models.append(train_method(run, cfg, method, cfg.train_for(method), docs, sentences, base, start, summaries))
    models += [ReportedModel(name, "reference", [], name) for name in cfg.evaluate.reference_models]

    scores, entries = [], []
    for model in models:
        model_scores = evaluate_model(run, cfg, model, docs, summaries)
        scores += model_scores
        entries.append(ReportEntry(label=model.label, method=model.method, scores=len(model_scores)))
    report_job = ReportJob(title=f"{cfg.name}: {cfg.data.display_name}", entries=entries)
    report = run.stage(REPORT, report_job, scores)
    publish_report(str(store.root), report)
    return report


@flow(name="pipeline")
def pipeline(config_path: str, store: str | None = None) -> str:
    """Run an experiment config end to end; returns the report artifact's folder."""
    cfg = load_config(config_path)
    artifact_store = ArtifactStore(store or os.environ.get("EMBFORGE_STORE") or cfg.store)
    run = RunRecord(artifact_store, cfg, config_path)
    try:
        report = run_pipeline(cfg, artifact_store, run)
    except BaseException as e:  # KeyboardInterrupt too: the record must not stay "running"
        run.finish("failed", error="".join(traceback.format_exception_only(e)).strip())
        raise
    run.finish("completed")
    return str(artifact_store.path(report))
