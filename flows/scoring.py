"""How a run scores its models: each model's text sets embedded (its documents are its index), its evaluate,
semantic and mteb artifacts, a static model's CPU speed beside its teacher, the families' query latency side by
side, then the report (the pipeline, select and evaluate flows all score through here).
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.runs import ReportedModel, Run
from storage.base import ArtifactRef
from tasks.config.families import FAMILIES
from tasks.config.yardsticks import YARDSTICKS, Yardstick, yardstick_source
from tasks.core.stage import Inputs, Stage
from tasks.embed import EMBED, EmbedInputs, EmbedJob
from tasks.encoders.models import ModelInputs
from tasks.encoders.text_sets import TextSetInputs
from tasks.evaluate import EVALUATE, EvalJob, EvaluateInputs
from tasks.latency import LATENCY, LatencyInputs, LatencyJob, LatencyModel
from tasks.mteb import MTEB, MtebJob
from tasks.report import REPORT, ReportEntry, ReportInputs, ReportJob, publish_report
from tasks.semantic import SEMANTIC, SemanticInputs, SemanticJob
from tasks.speed import SPEED, SpeedInputs, SpeedJob
from tasks.static import STATIC
from tasks.text_tokens import TEXT_TOKENS, TextTokensJob


@dataclass(frozen=True)
class Corpus:
    # The documents models are scored on: the config's (kNN's labels, the semantic benchmark's papers), or in
    # `embforge select` on a large corpus the sample stage's draw of them (flows/select.py's sample_of).
    docs: ArtifactRef
    summaries: ArtifactRef | None
    queries: ArtifactRef | None = None  # the generated queries (their held-out ones are scored)
    yardstick: ArtifactRef | None = None  # evaluate.yardstick's held-out documents (tasks/yardstick.py)
    dataset: str | None = None  # what its scores are filed under; None: the config's data name


def embedded(run: Run, model: ReportedModel, text_set: dict, inputs: dict, prompt: str, **job) -> ArtifactRef:
    """A text set embedded by `model` (cached per model and text set, from the text set's token ids)."""
    ev = run.cfg.evaluate
    tokenizer = model.tokenizer or model.external  # named: shared by every model that has it
    tokens = None if model.method == STATIC.name else run.stage(  # a static model tokenizes its texts itself
        TEXT_TOKENS, TextTokensJob(model=tokenizer, max_length=ev.max_length, prompt=prompt, **text_set),
        TextSetInputs(model=None if tokenizer else model.artifact, **inputs), model.label, model.method)
    return run.stage(EMBED, EmbedJob(store_dtype=ev.store_dtype, model=model.external, max_length=ev.max_length,
                                     batch_size=ev.batch_size, device=ev.device, dtype=ev.dtype, backend=ev.backend,
                                     **text_set, **job),
                     EmbedInputs(model=model.artifact, tokens=tokens, **inputs), model.label, model.method)


def held_out_of(run: Run, corpus: Corpus) -> tuple[ArtifactRef | None, bool]:
    """The generated queries never trained on (scored held out), if any, and whether the yardstick asks by texts."""
    held_out = corpus.queries if corpus.queries and run.cfg.queries.held_out else None
    queried = bool(corpus.yardstick) and yardstick_entry(run, corpus).queried
    return held_out, queried


def yardstick_entry(run: Run, corpus: Corpus) -> Yardstick:
    """The registry's entry for what the corpus's yardstick asks by (a consensus's: its source)."""
    return YARDSTICKS[yardstick_source(run.settled(corpus.yardstick))]


def documents_embedding(run: Run, model: ReportedModel, corpus: Corpus) -> ArtifactRef:
    """The corpus's documents embedded by `model`: its index (a multi-vector model's token vectors kept where
    queries will search them, or the labels rank documents by them)."""
    held_out, _ = held_out_of(run, corpus)
    searched = bool(held_out) or bool(corpus.yardstick) and yardstick_entry(run, corpus).maxsim
    return embedded(run, model, {}, dict(documents=corpus.docs), run.cfg.model.prompts.document,
                    layers="all" if run.cfg.evaluate.layerwise else "last",
                    token_vectors=FAMILIES[model.family].per_token and searched)


def evaluate_model(run: Run, model: ReportedModel, corpus: Corpus, force: bool = False) -> list[ArtifactRef]:
    """Embed, then score: the evaluate artifact, the semantic benchmark's, then one per MTEB task."""
    docs, summaries = corpus.docs, corpus.summaries
    ev, dataset, prompts = run.cfg.evaluate, corpus.dataset or run.cfg.data.display_name, run.cfg.model.prompts
    embed = dict(model=model.external, max_length=ev.max_length, batch_size=ev.batch_size, device=ev.device,
                 dtype=ev.dtype, backend=ev.backend)

    def stage(kind: Stage, job, inputs: Inputs, again: bool = False) -> ArtifactRef:
        return run.stage(kind, job, inputs, model.label, model.method, again)

    held_out, queried = held_out_of(run, corpus)
    tokens = FAMILIES[model.family].per_token  # retrieval by MaxSim reads the texts' token vectors
    docs_emb = documents_embedding(run, model, corpus)
    sts_emb = (embedded(run, model, dict(pairs_path=ev.sts.path, split=ev.sts.split), {}, prompts.document)
               if ev.sts else None)
    query_emb = (embedded(run, model, {}, dict(held_out_queries=held_out), prompts.query, token_vectors=tokens)
                 if held_out else None)
    asked = (embedded(run, model, {}, dict(held_out_queries=corpus.yardstick), prompts.query, token_vectors=tokens)
             if queried else None)  # titles, the user's or an LLM's
    job = EvalJob(label=model.label, model=model.external, dataset=dataset, pooling=model.pooling,
                  knn_holdout=model.knn_holdout, maxsim=ev.maxsim if tokens else None,
                  **ev.model_dump(include={"knn", "sts", "layerwise", "geometry", "tsne", "tsne_max"}))
    scores = [stage(EVALUATE, job, EvaluateInputs(documents=docs, embeddings=docs_emb, sts_embeddings=sts_emb,
                                                  queries=held_out, query_embeddings=query_emb,
                                                  yardstick=corpus.yardstick, yardstick_embeddings=asked,
                                                  model=model.artifact), force)]
    if ev.semantic:
        job = SemanticJob(label=model.label, dataset=dataset, pooling=model.pooling, semantic=ev.semantic,
                          prompt=prompts.document, **embed)
        scores.append(stage(SEMANTIC, job, SemanticInputs(documents=docs, embeddings=docs_emb, summaries=summaries,
                                                          model=model.artifact), force))
    if ev.mteb:
        for task in [*ev.mteb.task_names, *ev.mteb.local]:
            job = MtebJob(model=model.external, pooling=model.pooling, task=task, settings=ev.mteb.settings,
                          device=ev.device, prompts=prompts)
            scores.append(stage(MTEB, job, ModelInputs(model=model.artifact), force))
    return scores


def cpu_speed(run: Run, static: ReportedModel, teacher: ReportedModel, docs: ArtifactRef,
              documents: int | None = None) -> ArtifactRef:
    """A static model's and its teacher's CPU documents/s, measured side by side on `documents` of `docs` (default:
    `static.speed_documents`): a score of the static model."""
    ev = run.cfg.evaluate
    job = SpeedJob(teacher=teacher.external, pooling=teacher.pooling, dataset=run.cfg.data.display_name,
                   documents=documents or run.cfg.static.speed_documents, max_length=ev.max_length,
                   batch_size=ev.batch_size)
    return run.stage(SPEED, job, SpeedInputs(model=teacher.artifact, static=static.artifact, documents=docs),
                     static.label, static.method)


def query_latency(run: Run, models: list[ReportedModel], corpus: Corpus) -> ArtifactRef | None:
    """The models' CPU query latency side by side (tasks/latency.py), where they are of more than one family and
    held-out queries ask (the yardstick's texts, else the generated ones)."""
    held_out, queried = held_out_of(run, corpus)
    queries = corpus.yardstick if queried else held_out
    if len({m.family for m in models}) < 2 or not queries or not run.cfg.evaluate.latency_queries:
        return None
    job = LatencyJob(models={m.label: LatencyModel(external=m.external, pooling=m.pooling) for m in models},
                     dataset=corpus.dataset or run.cfg.data.display_name, queries=run.cfg.evaluate.latency_queries,
                     max_length=run.cfg.evaluate.max_length, prompt=run.cfg.model.prompts.query,
                     maxsim=run.cfg.evaluate.maxsim if any(FAMILIES[m.family].per_token for m in models) else None)
    return run.stage(LATENCY, job, LatencyInputs(models={m.label: m.artifact for m in models}, queries=queries,
                                                 embeddings={m.label: documents_embedding(run, m, corpus)
                                                             for m in models}))


def report_models(run: Run, models: list[ReportedModel], corpus: Corpus, force: bool = False) -> ArtifactRef:
    """Score every model (cached per model and task), then the report, shown in the Prefect UI."""
    scores = {m.label: evaluate_model(run, m, corpus, force) for m in models}
    by_label = {m.label: m for m in models}
    for m in models:
        if m.teacher in by_label and run.cfg.static and run.cfg.static.speed_documents:
            scores[m.label].append(cpu_speed(run, m, by_label[m.teacher], corpus.docs))
    job = ReportJob(title=f"{run.cfg.name}: {run.cfg.data.display_name}",
                    entries=[ReportEntry(label=m.label, method=m.method, swept=m.swept, teacher=m.teacher)
                             for m in models])
    report = run.stage(REPORT, job, ReportInputs(scores=scores, latency=query_latency(run, models, corpus)))
    run.wait()
    publish_report(run.store.url, report)
    return report
