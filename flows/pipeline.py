"""The `pipeline` flow: ingest → sentences → [summaries] → [stage 1] → views → train → evaluate → report,
and its parts as flows of their own: `train` (no evaluation) and `summarize` (flows/evaluate.py
scores registered models).

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
from typing import Callable, TypeVar

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from storage import ArtifactRef, ArtifactStore
from flows.params import RunParams, TrainParams
from tasks.config import ConfigError, MethodConfig, PipelineConfig, TrainConfig, load_config
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


T = TypeVar("T")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ReportedModel:
    label: str  # the name shown in the report
    method: str  # the recipe it was trained with, "none" for the base, "reference" for yardsticks
    inputs: list[ArtifactRef]  # the train or init artifact holding it, if any
    external: str | None = None  # else: its Hub name, folder or package:<name>
    pooling: str = "mean"  # the recipe's sentence vector; untrained models are read with mean pooling
    knn_holdout: bool = False  # trained without kNN's test documents

    def registration(self) -> dict:
        """The model's entry in the run record: the catalog's `models` view reads these."""
        artifact = f"{self.inputs[0].stage}/{self.inputs[0].key}" if self.inputs else None
        return dict(label=self.label, method=self.method, artifact=artifact, external=self.external,
                    pooling=self.pooling, knn_holdout=self.knn_holdout)


class RunRecord:
    """The run's entry in `runs/`: rewritten after every stage, so a killed run shows how far it got.
    A retried flow run (same id) starts its record again; its stages show what was cached."""

    def __init__(self, store: ArtifactStore, cfg: PipelineConfig, params: RunParams, flow_name: str):
        self.store, self.retry = store, cfg.retries
        self.run_id = str(flow_run.id or f"local-{os.getpid()}")
        self.record = dict(run_id=self.run_id, name=cfg.name, flow=flow_name, status="running",
                           config_path=params.config, overrides=params.overrides,
                           config=cfg.model_dump(mode="json"), started_at=_now(), finished_at=None,
                           error=None, stages=[], models=[])
        self._save()

    def _save(self) -> None:
        self.store.write_run(self.run_id, self.record)

    def stage(self, stage: Stage, config: BaseModel, inputs: list[ArtifactRef], label: str = "",
              method: str = "", force: bool = False) -> ArtifactRef:
        ref = stage.ref(config, inputs)
        if force and self.store.exists(ref):
            self.store.discard(ref)  # Prefect's cache record goes with it (Stage.as_task)
        runner = stage.as_task(self.store, self.retry).with_options(
            task_run_name=f"{stage.name}[{label}]" if label else stage.name)
        state = runner(str(self.store.root), config, inputs, return_state=True)
        self.record["stages"].append(dict(stage=stage.name, label=label, method=method, key=ref.key,
                                          state=state.name))
        self._save()
        return state.result()  # raises the stage's own error if it failed

    def register(self, models: list[ReportedModel]) -> None:
        self.record["models"] += [m.registration() for m in models]
        self._save()

    def finish(self, status: str, error: str | None = None) -> None:
        self.record.update(status=status, finished_at=_now(), error=error)
        self._save()


def open_run(params: RunParams, flow_name: str) -> tuple[PipelineConfig, ArtifactStore, RunRecord]:
    """Load the config with the run's overrides (a bad one fails here, before any task) and start the record."""
    cfg = load_config(params.config, params.overrides)
    store = ArtifactStore(params.store or os.environ.get("EMBFORGE_STORE") or cfg.store)
    return cfg, store, RunRecord(store, cfg, params, flow_name)


def recorded(run: RunRecord, body: Callable[[], T]) -> T:
    """Run a flow's body and mark the record completed or failed."""
    try:
        result = body()
    except BaseException as e:  # KeyboardInterrupt too: the record must not stay "running"
        run.finish("failed", error="".join(traceback.format_exception_only(e)).strip())
        raise
    run.finish("completed")
    return result


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
                   summaries: ArtifactRef | None = None, force: bool = False) -> list[ArtifactRef]:
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
    scores = [run.stage(EVALUATE, job, [docs, docs_emb, *sts_emb, *model.inputs], model.label, model.method, force)]
    if ev.semantic:
        job = SemanticJob(label=model.label, dataset=cfg.data.display_name, pooling=model.pooling,
                          semantic=ev.semantic, summaries=summaries is not None, **embed)
        scores.append(run.stage(SEMANTIC, job, [docs, docs_emb, *([summaries] if summaries else []), *model.inputs],
                                model.label, model.method, force))
    if ev.mteb:
        settings = ev.mteb.model_dump(include={"max_length", "batch_size", "dtype"})
        for task in [*ev.mteb.task_names, *ev.mteb.local]:
            job = MtebJob(model=model.external, pooling=model.pooling, task=task, device=ev.device, **settings)
            scores.append(run.stage(MTEB, job, model.inputs, model.label, model.method, force))
    return scores


@dataclass(frozen=True)
class Corpus:
    docs: ArtifactRef  # the config's documents: kNN's labels, the semantic benchmark's papers
    summaries: ArtifactRef | None


def summarize_corpus(run: RunRecord, cfg: PipelineConfig, docs: ArtifactRef) -> ArtifactRef | None:
    """LLM summaries (SemCSE's positives, the semantic benchmark's queries), if the config asks."""
    if not cfg.summaries:
        return None
    source = cfg.summaries.llm
    llm = [run.stage(LLM, LlmJob(source=source), [])] if needs_conversion(source) else []
    return run.stage(SUMMARIZE, SummarizeJob.from_config(cfg.summaries), [docs, *llm])


def train_models(run: RunRecord, cfg: PipelineConfig, methods: list[MethodConfig]) -> tuple[list[ReportedModel], Corpus]:
    """The base encoder, stage 1 (if any) and every method's model; registered in the run record."""
    docs = run.stage(INGEST, cfg.data, [])
    sentences = run.stage(SENTENCES, cfg.sentences, [docs])
    init = run.stage(INIT, InitConfig.from_model(cfg.model), []) if cfg.model.random_init else None
    summaries = summarize_corpus(run, cfg, docs)

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
    for method in methods:
        models.append(train_method(run, cfg, method, cfg.train_for(method), docs, sentences, base, start, summaries))
    run.register(models)
    return models, Corpus(docs, summaries)


def report_models(run: RunRecord, cfg: PipelineConfig, models: list[ReportedModel], corpus: Corpus,
                  store: ArtifactStore, force: bool = False) -> ArtifactRef:
    """Score every model (cached per model and task), then the report, shown in the Prefect UI."""
    scores, entries = [], []
    for model in models:
        model_scores = evaluate_model(run, cfg, model, corpus.docs, corpus.summaries, force)
        scores += model_scores
        entries.append(ReportEntry(label=model.label, method=model.method, scores=len(model_scores)))
    report = run.stage(REPORT, ReportJob(title=f"{cfg.name}: {cfg.data.display_name}", entries=entries), scores)
    publish_report(str(store.root), report)
    return report


def selected_methods(cfg: PipelineConfig, names: list[str]) -> list[MethodConfig]:
    unknown = sorted(set(names) - {m.name for m in cfg.methods})
    if unknown:
        raise ConfigError(f"methods {unknown} are not in the config; it has {[m.name for m in cfg.methods]}")
    return [m for m in cfg.methods if not names or m.name in names]


@flow(name="pipeline")
def pipeline(params: RunParams) -> str:
    """Train and evaluate an experiment config end to end; returns the report artifact's folder."""
    cfg, store, run = open_run(params, "pipeline")

    def body() -> str:
        models, corpus = train_models(run, cfg, cfg.methods)
        references = [ReportedModel(name, "reference", [], name) for name in cfg.evaluate.reference_models]
        run.register(references)
        return str(store.path(report_models(run, cfg, models + references, corpus, store)))

    return recorded(run, body)


@flow(name="train")
def train(params: TrainParams) -> list[dict]:
    """Train the config's methods (or some of them) without evaluating; the models are registered
    for the `evaluate` and `nightly` deployments. Returns the trained artifacts."""
    cfg, store, run = open_run(params, "train")
    return recorded(run, lambda: [m.registration() for m in train_models(run, cfg, selected_methods(cfg, params.methods))[0]])


@flow(name="summarize")
def summarize(params: RunParams) -> str:
    """Generate the config's LLM summaries (only the missing ones); returns the summaries artifact's folder."""
    cfg, store, run = open_run(params, "summarize")

    def body() -> str:
        if not cfg.summaries:
            raise ConfigError(f"{params.config}: summaries: the config has no `summaries` section")
        return str(store.path(summarize_corpus(run, cfg, run.stage(INGEST, cfg.data, []))))

    return recorded(run, body)
