"""The `pipeline` flow: ingest → sentences → [summarize] → [stage 1] → pairs → tokens → train → text tokens →
embed → evaluate → report, and its parts as flows of their own: `train` (no evaluation) and `summarize`
(flows/evaluate_registered.py scores registered models).

It only composes: each stage is a cached Prefect task (tasks/), artifacts are passed as small
references, and a run record in the store says which artifact every stage used and whether
Prefect found it cached, so the catalog can answer "what ran, on what, with what result".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from prefect import flow

from flows.params import RunParams, TrainParams
from flows.runs import ReportedModel, Run, open_run, recorded
from flows.scoring import Corpus, report_models
from storage.base import ArtifactRef
from tasks.config.base import BASE, ConfigError, InputError
from tasks.config.data import SentenceConfig
from tasks.config.evaluation import YardstickConfig
from tasks.config.families import FAMILIES
from tasks.config.pipeline import PipelineConfig
from tasks.config.queries import AskedQueries, AskingDocuments, QueriesConfig
from tasks.config.recipes import RECIPES
from tasks.config.static import StaticConfig, StaticSettings
from tasks.config.training import MethodConfig, TrainConfig, pooling_for
from tasks.config.yardsticks import MIN_POOL
from tasks.core.stage import NoInputs
from tasks.encoders.families import check_masked_lm, family_of
from tasks.encoders.lora import check_targets, start_layers
from tasks.encoders.models import start_config, start_width
from tasks.ingest import INGEST
from tasks.init import INIT, InitConfig
from tasks.llm import LLM, LlmJob, is_gguf_model, needs_conversion
from tasks.merge import MERGE, MergeInputs, MergeJob
from tasks.negatives import NEGATIVES, NegativesInputs, NegativesJob
from tasks.pairs import PAIRS, PairsConfig, PairsInputs
from tasks.queries import QUERIES, QueriesInputs
from tasks.sentences import SENTENCES, SentencesInputs
from tasks.static import STATIC, StaticInputs, StaticJob
from tasks.summarize import SUMMARIZE, SummarizeInputs
from tasks.tokens import TOKENS, TokensInputs, TokensJob
from tasks.train import TRAIN, TrainInputs, TrainJob
from tasks.yardstick import YARDSTICK, YardstickInputs, YardstickJob, llm_queries_needed


def train_method(run: Run, method: MethodConfig, train: TrainConfig, docs: ArtifactRef, sentences: ArtifactRef,
                 base_model: str | None, start: ArtifactRef | None,
                 summaries: ArtifactRef | None = None, negatives: ArtifactRef | None = None,
                 yardstick: YardstickConfig | None = None, until: int | None = None,
                 resume: ArtifactRef | None = None, schedule: bool = False) -> ReportedModel:
    """Pairs, their tokens, then training, for one method; `start` is the encoder artifact to start from, if any;
    `yardstick`: its documents are left out of the pairs; `until` and `resume`: a rung of a search
    (tasks/train.py), going on from the train artifact `resume`; `schedule`: the pairs hold as many epochs as
    `train.max_steps` takes (a search's candidates, on one schedule whatever their view's rows)."""
    knn = run.cfg.evaluate.knn
    pairs = method_pairs(run, method, train, docs, sentences, summaries, negatives, yardstick,
                         train.max_steps if schedule else None)
    prompts = run.cfg.model.prompts
    tokens = run.stage(TOKENS, TokensJob.for_method(base_model, method, train, prompts),
                       TokensInputs(pairs=pairs, start=start), method.name)
    job = TrainJob.for_method(base_model, method, train, knn, prompts).model_copy(update={"until": until})
    trained = run.stage(TRAIN, job, TrainInputs(pairs=pairs, tokens=tokens, start=start, resume=resume,
                                                documents=docs if job.knn else None), method.name, method.recipe)
    if train.lora:  # the adapter added into the model it trained on: what is evaluated, chained on and exported
        trained = run.stage(MERGE, MergeJob(base_model=base_model, save_dtype=train.save_dtype),
                            MergeInputs(adapter=trained, start=start), method.name, method.recipe)
    per_token = FAMILIES[method.family].per_token
    pooling = "mean" if per_token else pooling_for(method.recipe, train)  # a multi-vector model: its mean token vector
    return ReportedModel(method.name, method.recipe, trained, pooling=pooling,
                         knn_holdout=method.knn_holdout, swept=method.swept, family=method.family)


def method_pairs(run: Run, method: MethodConfig, train: TrainConfig, docs: ArtifactRef,
                 sentences: ArtifactRef, summaries: ArtifactRef | None, negatives: ArtifactRef | None,
                 yardstick: YardstickConfig | None, steps: int | None = None) -> ArtifactRef:
    """The pairs artifact of a method's view over `train.epochs`, or as many as `steps` batches take (the yardstick's
    documents left out)."""
    views = PairsConfig.for_method(method, train.epochs, run.cfg.evaluate.knn, train.batch_size, yardstick, steps,
                                   train.min_batch_rows)
    return run.stage(PAIRS, views, PairsInputs.for_view(views, sentences, docs, summaries, negatives), method.name)


def yardstick_of(run: Run, docs: ArtifactRef, families: Iterable[str], models: int,
                 single: bool = False) -> ArtifactRef | None:
    """The yardstick's queries, if the config asks (its documents are then left out of training), for `models` models
    of `families`; an LLM writes them for the held-out documents where the kind asks for an LLM's queries
    (tasks/yardstick.py). `single`: on the same held-out documents, the kind of one model that confirms a pooled
    kind's decision (`confirm`)."""
    if not run.cfg.evaluate.yardstick:
        return None
    settings = run.cfg.evaluate.yardstick.model_dump()
    cfg = (YardstickJob(**settings | {"kind": "auto"}, single=True) if single else
           YardstickJob(**settings, small_pool=models < MIN_POOL,
                        per_token=any(FAMILIES[family].per_token for family in families)))
    generated = None
    ingested = run.settled(docs)
    if llm_queries_needed(cfg, ingested["extra"], ingested["rows"]["documents"]):
        queries = run.cfg.queries or QueriesConfig()
        most = -(-cfg.max_queries // queries.sampling.n) if cfg.max_queries else None  # documents enough to ask
        job = AskedQueries(**queries.model_dump(exclude={"limit"}),
                           asking=AskingDocuments(held_out=cfg.held_out, seed=cfg.seed, most=most))
        llm = run.stage(LLM, LlmJob(source=job.llm), NoInputs()) if needs_conversion(job.llm) else None
        generated = run.stage(QUERIES, job, QueriesInputs(documents=docs, llm=llm))
    return run.stage(YARDSTICK, cfg, YardstickInputs(documents=docs, generated=generated))


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
                       device=run.cfg.evaluate.device, dtype=run.cfg.evaluate.dtype, prompts=run.cfg.model.prompts)
    return written, run.stage(NEGATIVES, job, NegativesInputs(documents=docs, queries=written, model=start.artifact))


@dataclass(frozen=True)
class Start:
    """What every method of a run trains on and from."""

    docs: ArtifactRef
    sentences: ArtifactRef
    summaries: ArtifactRef | None
    base: ReportedModel  # the untrained model, scored beside the trained ones
    base_model: str | None  # the named model training starts from, or None when `start` holds it
    start: ArtifactRef | None  # the random init or the converted GGUF decoder
    converted: bool  # a converted decoder: each model has its own tokenizer


def splitting(cfg: PipelineConfig) -> SentenceConfig:
    """The sentences stage's config: the section, with the run's worker processes."""
    return cfg.sentences.model_copy(update={"workers": cfg.run.workers})


def static_settings(cfg: PipelineConfig) -> StaticConfig | None:
    """How the run's static models are made: the `static` section, else its defaults where `embforge select` distils
    its answer (`select.static`); None: no static model."""
    return cfg.static or (StaticConfig(of=[BASE]) if cfg.select and cfg.select.static else None)


def check_static_width(cfg: PipelineConfig) -> None:
    """`static.pca_dims` against the models' width, before any stage (the static stage checks it again against the
    teacher it distils)."""
    static = static_settings(cfg)
    if static and static.pca_dims and (width := start_width(cfg.model.name_or_path, cfg.model.random_init)):
        if static.pca_dims > width:
            raise ConfigError(f"static.pca_dims: {static.pca_dims} is more than the {width} dimensions of the run's "
                              f"models ({cfg.model.name_or_path}{', random init' if cfg.model.random_init else ''}); "
                              f"at most {width}, or null to keep them")


def check_lora_targets(cfg: PipelineConfig) -> None:
    """`train.lora.target_modules` (the run's and each method's) against the named start model's layers, before any
    stage; a random init's are checked when its training attaches the adapter."""
    wanted = [lora for lora in (cfg.train.lora, *(cfg.train_for(m).lora for m in cfg.methods)) if lora]
    if wanted and not cfg.model.random_init and (layers := start_layers(cfg.model.name_or_path)):
        for lora in wanted:
            check_targets(layers, lora.target_modules, cfg.model.name_or_path)


def check_splade_base(cfg: PipelineConfig) -> None:
    """A SPLADE model (a method's, or select's sparse candidates') reads a masked-LM head, which a decoder LLM has
    not: the named start model's config, before any stage (a random init's is checked when it trains)."""
    wanted = [f"methods.{i}.sparse.kind" for i, m in enumerate(cfg.methods)
              if m.family == "sparse" and m.sparse.kind == "splade"]
    if cfg.select and "sparse" in cfg.select.families and cfg.select.sparse.kind == "splade":
        wanted.append("select.sparse.kind")
    if not wanted or cfg.model.random_init:
        return
    name = cfg.model.name_or_path
    if is_gguf_model(name):
        raise ConfigError(f"{wanted[0]}: splade, but {name} is a GGUF LLM, a decoder without a masked-LM head; use "
                          "sparse.kind csr")
    if (config := start_config(name)) is not None:
        try:
            check_masked_lm(name, config)
        except InputError as e:
            raise ConfigError(f"{wanted[0]}: {e}") from None


def start_of(run: Run) -> Start:
    """The corpus, its sentences and summaries, and the model training starts from."""
    cfg = run.cfg
    check_static_width(cfg)
    check_lora_targets(cfg)
    check_splade_base(cfg)
    docs = run.stage(INGEST, cfg.data, NoInputs())
    sentences = run.stage(SENTENCES, splitting(cfg), SentencesInputs(documents=docs))
    init = run.stage(INIT, InitConfig.from_model(cfg.model), NoInputs()) if cfg.model.random_init else None
    # A GGUF decoder (the offline default LLM) is converted to a folder first, which training starts from.
    converted = (run.stage(LLM, LlmJob(source=cfg.model.name_or_path), NoInputs())
                 if not init and is_gguf_model(cfg.model.name_or_path) else None)
    start = init or converted
    base = (ReportedModel("base (random init)", "none", init) if init else
            # a converted decoder is its artifact's folder, not a name to load (a GGUF package has no model folder)
            ReportedModel(f"base ({cfg.model.name_or_path})", "none", converted,
                          None if converted else cfg.model.name_or_path,
                          family="dense" if converted else family_of(cfg.model.name_or_path)))
    return Start(docs, sentences, summarize_corpus(run, docs), base, None if start else cfg.model.name_or_path,
                 start, converted is not None)


def with_tokenizer(run: Run, start: Start, models: list[ReportedModel]) -> list[ReportedModel]:
    """The init's and training's tokenizer named on each model (a converted one is read from each model)."""
    return models if start.converted else [replace(m, tokenizer=run.cfg.model.name_or_path) for m in models]


def train_models(run: Run, methods: list[MethodConfig], references: list[ReportedModel] = ()
                 ) -> tuple[list[ReportedModel], Corpus]:
    """The base encoder, stage 1 (if any) and every method's model; registered in the run record. The yardstick
    is the one that ranks these and `references` (a multi-vector one is ranked by MaxSim: no pooled kind)."""
    cfg = run.cfg
    begun = start_of(run)
    docs, sentences, summaries = begun.docs, begun.sentences, begun.summaries
    base, start = begun.base_model, begun.start
    models = [begun.base]
    if cfg.model.pretrain:  # stage 1 on a generic corpus; every method starts from its result
        pre = cfg.model.pretrain
        generic = run.stage(INGEST, pre.data, NoInputs(), "stage 1")
        generic_sentences = run.stage(SENTENCES, splitting(cfg), SentencesInputs(documents=generic), "stage 1")
        stage1 = train_method(run, pre.method, pre.train_for(), generic, generic_sentences, base, start)
        models.append(replace(stage1, label=f"stage 1 ({pre.method.name})"))
        base, start = None, stage1.artifact
    queries, negatives = mine_queries(run, methods, docs, models[-1])  # the base, or stage 1's model
    trained: dict[str, ReportedModel] = {}
    for method in methods:
        after = trained[method.start_from].artifact if method.start_from else None  # a chained recipe's stage
        trained[method.name] = train_method(run, method, cfg.train_for(method), docs, sentences,
                                            None if after else base, after or start, summaries, negatives,
                                            cfg.evaluate.yardstick)
    models = with_tokenizer(run, begun, models + list(trained.values()))
    if cfg.static:  # the models `static.of` names: methods by name, the untrained model as `base`
        named = [m for m in models if (BASE if m.method == "none" else m.label) in cfg.static.of]
        models += [static_model(run, m, sentences) for m in named]
    run.register(models)
    families = (m.family for m in [*models, *references])
    return models, Corpus(docs, summaries, queries, yardstick_of(run, docs, families, len(models)))


def static_model(run: Run, teacher: ReportedModel, sentences: ArtifactRef,
                 settings: StaticSettings | None = None) -> ReportedModel:
    """The static embedding model distilled from `teacher` (tasks/static.py) with `settings` (default: the config's
    `static` section's), reported beside it."""
    job = StaticJob(model=teacher.external, pooling=teacher.pooling,
                    **(settings or run.cfg.static).model_dump(include=set(StaticSettings.model_fields)))
    static = run.stage(STATIC, job, StaticInputs(model=teacher.artifact, sentences=sentences), teacher.label,
                       STATIC.name)
    return ReportedModel(f"{teacher.label} static", STATIC.name, static, teacher=teacher.label)


def selected_methods(cfg: PipelineConfig, names: list[str]) -> list[MethodConfig]:
    """The config's methods named in `names` (all when empty); a sweep's name selects all its values."""
    known = list(dict.fromkeys(n for m in cfg.methods for n in (m.sweep_of, m.name) if n))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ConfigError(f"methods {unknown} are not in the config; it has {known}")
    chosen = {m.name for m in cfg.methods if not names or {m.name, m.sweep_of} & set(names)}
    for m in reversed(cfg.methods):  # and the methods they start from (a chained recipe's earlier stages)
        if m.name in chosen and m.start_from:
            chosen.add(m.start_from)
    return [m for m in cfg.methods if m.name in chosen]


@flow(name="pipeline")
def pipeline(params: RunParams) -> str:
    """Train and evaluate an experiment config end to end; returns the report artifact's folder."""
    run = open_run(params, "pipeline")

    def body() -> str:
        references = [ReportedModel(name, "reference", None, name, family=family_of(name))  # a ColBERT: by MaxSim
                      for name in run.cfg.evaluate.reference_models]
        models, corpus = train_models(run, run.cfg.methods, references)
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
