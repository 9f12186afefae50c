"""The `pipeline` flow: ingest → sentences → [summarize] → [stage 1] → pairs → tokens → train → evaluate
→ report, and its parts as flows of their own: `train` (no evaluation) and `summarize`
(flows/evaluate_registered.py scores registered models).

It only composes: each stage is a cached Prefect task (tasks/), artifacts are passed as small
references, and a run record in the store says which artifact every stage used and whether
Prefect found it cached, so the catalog can answer "what ran, on what, with what result".
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from prefect import flow, get_client, get_run_logger
from prefect.client.schemas.objects import StateType
from prefect.exceptions import TerminationSignal
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run

from flows.params import RunParams, TrainParams
from flows.runners import outcome, task_runner
from storage.base import ArtifactRef
from storage.runs import RunRecord
from storage.store import ArtifactStore
from storage.stores import open_store
from tasks.config.base import ConfigError
from tasks.config.loading import load_config
from tasks.config.pipeline import PipelineConfig
from tasks.config.training import MethodConfig, TrainConfig, pooling_for
from tasks.core.stage import Inputs, NoInputs, Stage
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.encoders.models import ModelInputs
from tasks.evaluate import EVALUATE, EvalJob, EvaluateInputs
from tasks.ingest import INGEST
from tasks.init import INIT, InitConfig
from tasks.llm import LLM, LlmJob, needs_conversion
from tasks.methods.recipes import RECIPES
from tasks.mteb import MTEB, MtebJob
from tasks.negatives import NEGATIVES, NegativesInputs, NegativesJob
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.queries import QUERIES, QueriesInputs
from tasks.report import REPORT, ReportEntry, ReportInputs, ReportJob, publish_report
from tasks.semantic import SEMANTIC, SemanticInputs, SemanticJob
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.summarize import SUMMARIZE, SummarizeInputs
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import TRAIN, TrainInputs, TrainJob

T = TypeVar("T")


@dataclass(frozen=True)
class ReportedModel:
    label: str  # the name shown in the report
    method: str  # the recipe it was trained with, "none" for the base, "reference" for yardsticks
    artifact: ArtifactRef | None  # the train or init artifact holding it, if any
    external: str | None = None  # else: its Hub name, folder or package:<name>
    pooling: str = "mean"  # the recipe's sentence vector; untrained models are read with mean pooling
    knn_holdout: bool = False  # trained without kNN's test documents
    swept: dict = field(default_factory=dict)  # {field: value} of a method made by a sweep

    def registration(self) -> dict:
        """The model's entry in the run record: the catalog's `models` view reads these."""
        return dict(label=self.label, method=self.method, artifact=self.artifact.address if self.artifact else None,
                    external=self.external, pooling=self.pooling, knn_holdout=self.knn_holdout)


@dataclass
class Submitted:
    """A stage handed to the task runner, and what its record entry says."""

    ref: ArtifactRef
    future: PrefectFuture
    label: str
    method: str
    changes: dict
    recorded: bool = False


class Run:
    """A flow run: its config, store and record, and how it runs a stage as a cached Prefect task.

    With a task runner (`run.task_runner`), `stage` submits the task and returns its artifact's ref
    at once (keys are derived from configs and input keys, not from results): the task waits for the
    tasks that build its inputs, so independent stages run side by side. `wait` collects them all."""

    def __init__(self, cfg: PipelineConfig, store: ArtifactStore, params: RunParams, flow_name: str):
        self.cfg, self.store = cfg, store
        self.rebuild_stale = params.rebuild_stale_versions
        self.runner = task_runner(cfg.run)
        self.submitted: dict[str, Submitted] = {}  # key → the task that builds it
        self._recording = threading.Lock()
        self.forced: set[str] = set()  # keys built again on request this run
        self.record = RunRecord(store, str(flow_run.id or f"local-{os.getpid()}"), name=cfg.name, flow=flow_name,
                                config_path=params.config, overrides=params.overrides,
                                config=cfg.model_dump(mode="json"))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The task runner's lifetime (a Dask cluster, a process pool), if there is one."""
        with self.runner or contextlib.nullcontext():
            yield

    def stage(self, stage: Stage, config, inputs: Inputs, label: str = "", method: str = "",
              force: bool = False) -> ArtifactRef:
        """Run `stage` as a cached task; `force` builds it again even if the store has it."""
        ref = stage.ref(config, inputs)  # once per call: the task is handed it
        if ref.key in self.submitted:  # already submitted by this run: built once
            return ref
        changes = stage.version_changes(self.store, ref)
        # What reads an artifact built again on request is built again too (same keys, new build).
        force = force or bool(changes and self.rebuild_stale) or any(i.key in self.forced for i in inputs.refs())
        if changes and not force:
            get_run_logger().warning(
                "%s: cached artifact %s was built with other library versions (%s); rerun with "
                "--rebuild-stale-versions (rebuild_stale_versions in the UI) to rebuild it", stage.display(label),
                ref.address, ", ".join(f"{lib} {was} → {now_}" for lib, (was, now_) in changes.items()))
        if force:
            self.forced.add(ref.key)
            self.store.discard(ref)
        runner = stage.as_task(self.cfg.retries).with_options(task_run_name=stage.display(label))
        args = dict(store_url=self.store.url, config=config, inputs=inputs, ref=ref, label=label)
        if self.runner is None:
            state = runner(**args, return_state=True)
            self.record.add_stage(ref, state.name, label, method, changes)
            return outcome(state, ref)  # a stage's task returns the ref it was handed
        future = self.runner.submit(runner, args, wait_for=[self.submitted[i.key].future for i in inputs.refs()
                                                            if i.key in self.submitted])
        submitted = self.submitted[ref.key] = Submitted(ref, future, label, method, changes)
        future.add_done_callback(lambda _: self._finished(submitted))
        return ref

    def _finished(self, submitted: Submitted) -> None:
        """Record a submitted stage's end once: its callback and `wait` both get here, in either order."""
        with self._recording:
            if submitted.recorded:
                return
            submitted.recorded = True
            submitted.future.wait()  # done already; this keeps its final state (`state` would ask the API)
            self.record.add_stage(submitted.ref, submitted.future.state.name, submitted.label, submitted.method,
                                  submitted.changes)

    def wait(self) -> None:
        """Wait for every submitted stage, record them, and raise the first failure (in the order submitted)."""
        for submitted in self.submitted.values():
            submitted.future.wait()
            self._finished(submitted)
        for submitted in self.submitted.values():
            if submitted.future.state.is_failed() or submitted.future.state.is_crashed():
                submitted.future.state.result()

    def register(self, models: list[ReportedModel]) -> None:
        self.record.register([m.registration() for m in models])


def open_run(params: RunParams, flow_name: str) -> Run:
    """Load the config with the run's overrides (a bad one fails here, before any task) and start the record."""
    cfg = load_config(params.config, params.overrides)
    store = open_store(params.store, cfg.store)
    store.check_writable()  # a served run too: one line naming the store, before any stage
    folders, freed = store.clear_leftovers()
    if folders:
        get_run_logger().info("removed %d temp folder(s) left in %s by killed runs: %.1f MB freed", folders,
                              store.root / ".tmp", freed / 1e6)
    return Run(cfg, store, params, flow_name)


def recorded(run: Run, body: Callable[[], T]) -> T:
    """Run a flow's body with the run's task runner, wait for its stages, and mark the record completed or failed."""
    try:
        with run.running():
            result = body()
            run.wait()
    except BaseException as e:  # KeyboardInterrupt and SIGTERM too: the record must not stay "running"
        if isinstance(e, KeyboardInterrupt | TerminationSignal):
            signum = signal.Signals(getattr(e, "signal", signal.SIGINT))
            run.record.finish(stopped_as(), error=f"stopped by {signum.name}")
        else:
            run.record.finish("failed", error="".join(traceback.format_exception_only(e)).strip())
        track(run)
        raise
    run.record.finish("completed")
    track(run)
    return result


def stopped_as() -> str:
    """`cancelled` when the signal was Prefect's runner carrying out a cancellation from the UI or the
    API (it sets the flow run Cancelling first), else `interrupted`."""
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.get_id()).state
    except Exception:  # noqa: BLE001 (no API: a CLI run stopping; its server is still up, but be sure)
        return "interrupted"
    cancelling = state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED)
    return "cancelled" if cancelling else "interrupted"


def track(run: Run) -> None:
    """Log the finished run to the config's MLflow server, if any. A tracker that cannot be reached
    costs the run nothing: its results are in the store, and the error is in the run's log."""
    if run.cfg.tracking is None:
        return
    from tasks.reporting.tracking import log_run

    try:
        mlflow_id = log_run(run.store, run.record.run_id, run.cfg.tracking.mlflow)
        get_run_logger().info("logged to MLflow at %s: run %s", run.cfg.tracking.mlflow, mlflow_id)
    except Exception as e:  # noqa: BLE001 (any client or server error)
        get_run_logger().error("not logged to MLflow at %s: %s: %s", run.cfg.tracking.mlflow, type(e).__name__, e)


def train_method(run: Run, method: MethodConfig, train: TrainConfig, docs: ArtifactRef, sentences: ArtifactRef,
                 base_model: str | None, start: ArtifactRef | None,
                 summaries: ArtifactRef | None = None, negatives: ArtifactRef | None = None) -> ReportedModel:
    """Pairs, their tokens, then training, for one method; `start` is the encoder artifact to start from, if any."""
    knn = run.cfg.evaluate.knn
    views = PairsConfig.for_method(method, train.epochs, knn, train.batch_size)
    pairs = run.stage(PAIRS, views, PairsInputs.for_view(views, sentences, docs, summaries, negatives), method.name)
    tokens = run.stage(TOKENS, TokensJob.for_method(base_model, method, train), TokensInputs(pairs=pairs, start=start),
                       method.name)
    job = TrainJob.for_method(base_model, method, train, knn)
    trained = run.stage(TRAIN, job, TrainInputs(pairs=pairs, tokens=tokens, start=start,
                                                documents=docs if job.knn else None), method.name, method.recipe)
    return ReportedModel(method.name, method.recipe, trained, pooling=pooling_for(method.recipe, train),
                         knn_holdout=method.knn_holdout, swept=method.swept)


def evaluate_model(run: Run, model: ReportedModel, docs: ArtifactRef, summaries: ArtifactRef | None = None,
                   force: bool = False, queries: ArtifactRef | None = None) -> list[ArtifactRef]:
    """Embed (cached per model and text set), then score: the evaluate artifact, the semantic
    benchmark's, then one per MTEB task."""
    ev, dataset = run.cfg.evaluate, run.cfg.data.display_name
    embed = dict(model=model.external, max_length=ev.max_length, batch_size=ev.batch_size, device=ev.device,
                 dtype=ev.dtype, backend=ev.backend)

    def stage(kind: Stage, job, inputs: Inputs, again: bool = False) -> ArtifactRef:
        return run.stage(kind, job, inputs, model.label, model.method, again)

    docs_emb = stage(EMBED, EmbedJob(layers="all" if ev.layerwise else "last", store_dtype=ev.store_dtype, **embed),
                     EmbedInputs(documents=docs, model=model.artifact))
    sts_emb = stage(EMBED, EmbedJob(pairs_path=ev.sts.path, split=ev.sts.split, store_dtype=ev.store_dtype, **embed),
                    EmbedInputs(model=model.artifact)) if ev.sts else None
    held_out = queries if queries and run.cfg.queries.held_out else None  # the generated queries never trained on
    query_emb = stage(EMBED, EmbedJob(store_dtype=ev.store_dtype, **embed),
                      EmbedInputs(held_out_queries=held_out, model=model.artifact)) if held_out else None
    job = EvalJob(label=model.label, model=model.external, dataset=dataset, pooling=model.pooling,
                  knn_holdout=model.knn_holdout,
                  **ev.model_dump(include={"knn", "sts", "layerwise", "geometry", "tsne", "tsne_max"}))
    scores = [stage(EVALUATE, job, EvaluateInputs(documents=docs, embeddings=docs_emb, sts_embeddings=sts_emb,
                                                  queries=held_out, query_embeddings=query_emb,
                                                  model=model.artifact), force)]
    if ev.semantic:
        job = SemanticJob(label=model.label, dataset=dataset, pooling=model.pooling, semantic=ev.semantic, **embed)
        scores.append(stage(SEMANTIC, job, SemanticInputs(documents=docs, embeddings=docs_emb, summaries=summaries,
                                                          model=model.artifact), force))
    if ev.mteb:
        for task in [*ev.mteb.task_names, *ev.mteb.local]:
            job = MtebJob(model=model.external, pooling=model.pooling, task=task, settings=ev.mteb.settings,
                          device=ev.device)
            scores.append(stage(MTEB, job, ModelInputs(model=model.artifact), force))
    return scores


@dataclass(frozen=True)
class Corpus:
    docs: ArtifactRef  # the config's documents: kNN's labels, the semantic benchmark's papers
    summaries: ArtifactRef | None
    queries: ArtifactRef | None = None  # the generated queries (their held-out ones are scored)


def summarize_corpus(run: Run, docs: ArtifactRef) -> ArtifactRef | None:
    """LLM summaries (SemCSE's positives, the semantic benchmark's queries), if the config asks."""
    summaries = run.cfg.summaries
    if not summaries:
        return None
    llm = run.stage(LLM, LlmJob(source=summaries.llm), NoInputs()) if needs_conversion(summaries.llm) else None
    return run.stage(SUMMARIZE, summaries, SummarizeInputs(documents=docs, llm=llm))


def write_queries(run: Run, methods: list[MethodConfig], docs: ArtifactRef) -> ArtifactRef | None:
    """The LLM-written queries, if one of `methods` trains on them (their held-out ones are then scored)."""
    queries = run.cfg.queries
    if not any(RECIPES[m.recipe].needs_queries for m in methods):
        return None
    llm = run.stage(LLM, LlmJob(source=queries.llm), NoInputs()) if needs_conversion(queries.llm) else None
    return run.stage(QUERIES, queries, QueriesInputs(documents=docs, llm=llm))


def mine_queries(run: Run, methods: list[MethodConfig], docs: ArtifactRef,
                 start: ReportedModel) -> tuple[ArtifactRef | None, ArtifactRef | None]:
    """LLM-written queries and the hard negatives the start model ranks high for them (GPL's and
    InPars' training data), if one of `methods` trains on them: (queries, negatives)."""
    written = write_queries(run, methods, docs)
    if written is None:
        return None, None
    job = NegativesJob(model=start.external, pooling=start.pooling, negatives=run.cfg.negatives,
                       device=run.cfg.evaluate.device, dtype=run.cfg.evaluate.dtype)
    return written, run.stage(NEGATIVES, job, NegativesInputs(documents=docs, queries=written, model=start.artifact))


def train_models(run: Run, methods: list[MethodConfig]) -> tuple[list[ReportedModel], Corpus]:
    """The base encoder, stage 1 (if any) and every method's model; registered in the run record."""
    cfg = run.cfg
    docs = run.stage(INGEST, cfg.data, NoInputs())
    splitting = cfg.sentences.model_copy(update={"workers": cfg.run.workers})
    sentences = run.stage(SENTENCES, splitting, SentencesInputs(documents=docs))
    init = run.stage(INIT, InitConfig.from_model(cfg.model), NoInputs()) if cfg.model.random_init else None
    summaries = summarize_corpus(run, docs)

    base = None if init else cfg.model.name_or_path
    models = [ReportedModel("base (random init)", "none", init) if init else
              ReportedModel(f"base ({base})", "none", None, base)]
    start = init
    if cfg.model.pretrain:  # stage 1 on a generic corpus; every method starts from its result
        pre = cfg.model.pretrain
        generic = run.stage(INGEST, pre.data, NoInputs(), "stage 1")
        generic_sentences = run.stage(SENTENCES, splitting, SentencesInputs(documents=generic), "stage 1")
        stage1 = train_method(run, pre.method, pre.train_for(), generic, generic_sentences, base, start)
        models.append(replace(stage1, label=f"stage 1 ({pre.method.name})"))
        base, start = None, stage1.artifact
    queries, negatives = mine_queries(run, methods, docs, models[-1])  # the base, or stage 1's model
    for method in methods:
        models.append(train_method(run, method, cfg.train_for(method), docs, sentences, base, start, summaries,
                                   negatives))
    run.register(models)
    return models, Corpus(docs, summaries, queries)


def report_models(run: Run, models: list[ReportedModel], corpus: Corpus, force: bool = False) -> ArtifactRef:
    """Score every model (cached per model and task), then the report, shown in the Prefect UI."""
    scores = {m.label: evaluate_model(run, m, corpus.docs, corpus.summaries, force, corpus.queries)
              for m in models}
    job = ReportJob(title=f"{run.cfg.name}: {run.cfg.data.display_name}",
                    entries=[ReportEntry(label=m.label, method=m.method, swept=m.swept) for m in models])
    report = run.stage(REPORT, job, ReportInputs(scores=scores))
    run.wait()
    publish_report(run.store.url, report)
    return report


def selected_methods(cfg: PipelineConfig, names: list[str]) -> list[MethodConfig]:
    """The config's methods named in `names` (all when empty); a sweep's name selects all its values."""
    known = list(dict.fromkeys(n for m in cfg.methods for n in (m.sweep_of, m.name) if n))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ConfigError(f"methods {unknown} are not in the config; it has {known}")
    return [m for m in cfg.methods if not names or {m.name, m.sweep_of} & set(names)]


@flow(name="pipeline")
def pipeline(params: RunParams) -> str:
    """Train and evaluate an experiment config end to end; returns the report artifact's folder."""
    run = open_run(params, "pipeline")

    def body() -> str:
        models, corpus = train_models(run, run.cfg.methods)
        references = [ReportedModel(name, "reference", None, name) for name in run.cfg.evaluate.reference_models]
        run.register(references)
        report = report_models(run, models + references, corpus)
        return run.store.location("artifacts", report.stage, report.key)

    return recorded(run, body)


@flow(name="train")
def train(params: TrainParams) -> list[dict]:
    """Train the config's methods (or some of them) without evaluating; the models are registered
    for the `evaluate` and `nightly` deployments. Returns the trained artifacts."""
    run = open_run(params, "train")
    return recorded(run, lambda: [m.registration()
                                  for m in train_models(run, selected_methods(run.cfg, params.methods))[0]])


@flow(name="summarize")
def summarize(params: RunParams) -> str:
    """Generate the config's LLM summaries (only the missing ones); returns the summaries artifact's folder."""
    run = open_run(params, "summarize")

    def body() -> str:
        if not run.cfg.summaries:
            raise ConfigError(f"{params.config}: summaries: the config has no `summaries` section")
        summaries = summarize_corpus(run, run.stage(INGEST, run.cfg.data, NoInputs()))
        return run.store.location("artifacts", summaries.stage, summaries.key)

    return recorded(run, body)
