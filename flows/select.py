"""The `select` flow: from a corpus to a chosen, trained and exported model (`embforge select`, docs/select.md).

Candidates (the `select` section's recipes x learning rates) climb successive halving's rungs
(tasks/core/halving.py). Each rung is an ordinary cached train stage that goes on from the candidate's rung before
(`until`, `resume`: no step is trained twice), merged where LoRA is on, and scored by the evaluate stage on the
yardstick (tasks/yardstick.py: by your queries, labels, titles, clusters, neighbours or an LLM's queries; on a large
corpus among a sample of it, tasks/sample.py), whose held-out documents no candidate trains on. Every candidate is on
one schedule of `select.budget` steps (`train.max_steps`, over as many epochs of its view as that takes: the pairs
stage counts them), so a rung means the same for all. The select stage decides with paired intervals
(tasks/select.py; on a pooled kind, against the untrained model on a kind of one model: `confirming`); the chosen
model is registered and exported with the decision on its card. A rerun recomputes nothing; a new candidate reuses
the others' rungs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.params import SelectParams
from flows.pipeline import (
    Start,
    mine_queries,
    start_of,
    static_model,
    static_settings,
    train_method,
    with_tokenizer,
    yardstick_of,
)
from flows.runs import ReportedModel, Run, open_run, recorded
from flows.scoring import Corpus, cpu_speed, evaluate_model
from storage.base import ArtifactRef
from storage.catalog import Catalog
from storage.store import ArtifactStore
from tasks.config.base import BASE
from tasks.config.pipeline import PipelineConfig
from tasks.config.select import SelectConfig
from tasks.config.training import MethodConfig, expand_chains
from tasks.config.yardsticks import YARDSTICKS, yardstick_kind, yardstick_pooled
from tasks.core.halving import Candidate, Ladder, successive_halving
from tasks.encoders.models import is_decoder_model, trained_ref
from tasks.export import check_export_folder, export_model
from tasks.methods import health
from tasks.metrics.pool import pool_scores
from tasks.report import markdown_for_ui
from tasks.sample import SAMPLE, SampleConfig, SampleInputs
from tasks.select import (
    SECTION,
    SELECT,
    SelectInputs,
    SelectJob,
    decision_of,
    rung_name,
    rung_pool,
    static_summary,
    yardstick_scores,
)


@dataclass(frozen=True)
class Selection:
    chosen: str  # the winning candidate, or BASE
    said: str  # the decision in one sentence
    report: str  # the select artifact's folder: selection.md, ladder.png, ladder.parquet
    artifact: str  # its address, select/<key>
    exported: str | None  # the chosen model's folder; None when the answer is the base model as it is
    base: str  # the untrained model, as the search scored it (a name, or "base (random init)")
    static: str | None = None  # with `select.static`: the static model's folder
    static_said: str | None = None  # and how it compares with its teacher


def export_folder(cfg: PipelineConfig) -> Path:
    """Where the chosen model goes: `select.out`, else selected/<the corpus's name>, from the folder the run started
    in."""
    return Path(cfg.select.out or Path("selected") / cfg.data.display_name).resolve()


def static_folder(out: Path) -> Path:
    return out.with_name(f"{out.name}-static")


def distil(run: Run, teacher: ReportedModel, teacher_scores: ArtifactRef, begun: Start, corpus: Corpus,
           out: Path, pool: dict[str, ArtifactRef] | None) -> str:
    """`select.static`: the static model of the answer (docs/static.md), scored on `corpus`'s yardstick beside its
    teacher (on a pooled kind, in `pool`: the decision's; or on the confirming yardstick), timed beside it on the CPU
    and exported to `out`; what it kept and gained, in one sentence."""
    settings = static_settings(run.cfg)  # what `of` names is the pipeline's, not select's
    static = static_model(run, teacher, begun.sentences, settings)
    scores = evaluate_model(run, static, corpus)[0]
    speed = cpu_speed(run, static, teacher, corpus.docs, settings.speed_documents) if settings.speed_documents else None
    run.register([static])
    said = static_summary(run.store, scores, teacher_scores, speed, teacher.label, pool)
    notes = f"Distilled from {teacher.label} by `embforge select`: {said}.\n"
    export_model(Catalog(run.store), static.artifact.address, out, [], notes=notes)
    return said


def sample_of(run: Run, corpus: Corpus, confirm: ArtifactRef | None = None) -> Corpus:
    """What the yardstick ranks among: the corpus, or where it holds more than `select.sample` documents besides those
    the queries need, the sample stage's draw (tasks/sample.py), its scores filed under a dataset of their own (a
    sample's ranks are not the corpus's: the report must never pair the two). Not where something else is scored on
    the documents (kNN, the semantic benchmark, held-out generated queries): they need the whole corpus. The documents
    a confirming yardstick's queries need (`confirming`) are kept too."""
    size, docs, ev = run.cfg.select.sample, corpus.docs, run.cfg.evaluate
    needed = sum(run.settled(y)["extra"]["needed"] for y in (corpus.yardstick, confirm) if y)  # at most
    if size is None or run.settled(docs)["rows"]["documents"] <= size + needed:
        return corpus
    if also := [name for name, on in (("evaluate.knn", ev.knn), ("evaluate.semantic", ev.semantic),
                                      ("held-out generated queries", corpus.queries and run.cfg.queries.held_out))
                if on]:
        get_run_logger().info("the yardstick ranks among the whole corpus: %s scored on it too", ", ".join(also))
        return corpus
    sample = run.stage(SAMPLE, SampleConfig(size=size, seed=ev.yardstick.seed),
                       SampleInputs(documents=docs, yardstick=corpus.yardstick, confirm=confirm))
    return replace(corpus, docs=sample, dataset=f"{run.cfg.data.display_name} (yardstick sample)")


def stages_of(candidate: Candidate, sel: SelectConfig) -> list[MethodConfig]:
    """What a candidate trains: its recipe at its learning rate as its family (with `sel`'s settings of it), or a
    chained recipe's stages (CHAINS: llm2vec), the last keeping the candidate's name. `warn`: a stage the health check
    finds collapsed or diverged trains to its end and is dropped from its artifact's health, so a rerun finds that
    cached too (a stopped stage trains again)."""
    family = {} if candidate.family == "dense" else {candidate.family: getattr(sel, candidate.family)}
    own = dict(name=candidate.name, recipe=candidate.recipe, family=candidate.family, **family,
               train={"lr": candidate.lr, "on_unhealthy": "warn"})
    return [MethodConfig.model_validate(m) for m in expand_chains([own])]


def search(run: Run, begun: Start, corpus: Corpus, negatives: ArtifactRef | None, candidates: list[Candidate],
           base: ArtifactRef) -> tuple[Ladder, dict[str, ReportedModel], dict[str, ArtifactRef], int]:
    """Successive halving over the candidates: (the ladder, each rung's model and evaluate artifact by
    rung_name, the steps the chained candidates' earlier stages trained before their rungs). A rung's stages are
    all asked for before any is waited on, so a task runner (`run.task_runner`) trains and scores its candidates side
    by side. A chained candidate (CHAINS: llm2vec) trains its earlier stages once to the budget, then climbs the rungs
    as its last stage. On a pooled yardstick (consensus, neighbours, clusters) a rung's candidates and the untrained
    model (`base`, its evaluate artifact) judge each other (tasks/select.py's rung_pool)."""
    budget, yardstick = run.cfg.select.budget, run.cfg.evaluate.yardstick
    pooled = yardstick_pooled(run.settled(corpus.yardstick))
    models: dict[str, ReportedModel] = {}
    scored: dict[str, ArtifactRef] = {}
    reached: dict[Candidate, ReportedModel] = {}  # each candidate's last rung
    before: dict[Candidate, list[ReportedModel]] = {}  # a chained candidate's earlier stages (CHAINS: llm2vec)
    last_rung: dict[Candidate, str] = {}  # its rung_name
    pools: dict[int, dict[str, float]] = {}  # a pooled kind's mean scores by rung, then rung_name

    def trained(method: MethodConfig, after: ReportedModel | None, until: int | None = None,
                resume: ArtifactRef | None = None) -> ReportedModel:
        return train_method(run, method, run.cfg.train_for(method).model_copy(update={"max_steps": budget}),
                            begun.docs, begun.sentences, None if after else begun.base_model,
                            after.artifact if after else begun.start, begun.summaries, negatives, yardstick,
                            until=until, resume=resume, schedule=True)

    def start(live: list[Candidate], steps: int) -> None:
        for candidate in live:
            *earlier, method = stages_of(candidate, run.cfg.select)
            if candidate not in before:  # a chain's earlier stages (CHAINS): once, to the budget, before its rungs
                chain, after = [], None
                for stage in earlier:
                    chain.append(after := trained(stage, after))
                before[candidate] = chain
            after = before[candidate][-1] if before[candidate] else None
            last = reached.get(candidate)
            model = trained(method, after, None if steps == budget else steps,
                            trained_ref(run.store, last.artifact) if last else None)
            name = rung_name(candidate.name, steps)
            model = with_tokenizer(run, begun, [replace(model, label=candidate.name if steps == budget else name)])
            reached[candidate] = models[name] = model[0]
            last_rung[candidate] = name
            scored[name] = evaluate_model(run, model[0], corpus)[0]

    def score(candidate: Candidate, steps: int) -> float | str:
        name = rung_name(candidate.name, steps)
        run.settled(scored[name])
        for model in [*before[candidate], models[name]]:
            trained_by = run.store.manifest(trained_ref(run.store, model.artifact))
            if problem := health.fatal_verdict(trained_by["extra"]["health"]):
                stage = f" (its {model.method} stage)" if before[candidate] else ""
                return f"{candidate.recipe} recipe{stage}: training {problem} (lr {candidate.lr:g})"
        if not pooled:
            return float(yardstick_scores(run.store, scored[name]).mean())
        if steps not in pools:  # the rung's candidates; at the budget, every candidate where it stopped
            pool = [n for c, n in last_rung.items() if steps == budget or n == rung_name(c.name, steps)]
            judged = pool_scores(run.store, {BASE: base} | {n: scored[n] for n in pool})
            pools[steps] = {n: float(v.mean()) for n, v in judged.items()}
        return pools[steps][name]

    ladder = successive_halving(candidates, budget, run.cfg.select.eta, score, start)
    return ladder, models, scored, budget * sum(map(len, before.values()))


def confirming(run: Run, docs: ArtifactRef, yardstick: ArtifactRef) -> ArtifactRef | None:
    """`select.confirm`: where the yardstick is a pooled kind, whose trained majority judges the untrained
    model, a label-free yardstick of one model on the same held-out documents (titles, else an LLM's queries:
    tasks/yardstick.py's `single`) that sets the pool's winner against the untrained model; else None."""
    if not (run.cfg.select.confirm and yardstick_pooled(run.settled(yardstick))):
        return None
    confirm = yardstick_of(run, docs, ["dense"], 2, single=True)
    get_run_logger().info("the %s rank the candidates; %s set the winner against the untrained model (each judged "
                          "by itself)", yardstick_kind(run.settled(yardstick)),
                          YARDSTICKS[yardstick_kind(run.settled(confirm))].called)
    return confirm


def select_model(run: Run) -> Selection:
    cfg, sel = run.cfg, run.cfg.select
    out = export_folder(cfg)
    check_export_folder(out, "select.out:", run.store.root)  # before any stage, whatever the answer
    if sel.static:
        check_export_folder(static_folder(out), "select.static: its folder", run.store.root)
    begun = start_of(run)
    # the defaults depend on the kind of model training starts from, known from the config (no artifact read)
    init = cfg.model.random_init
    decoder = sel.recipes is None and (begun.converted or (init.architecture == "llama" if init else
                                                           is_decoder_model(cfg.model.name_or_path)))
    recipes = sel.candidate_recipes(bool(cfg.summaries), bool(cfg.queries), decoder)
    candidates = [Candidate(*spec) for spec in sel.candidates(recipes)]
    get_run_logger().info("%d candidates: %s%s", len(candidates), ", ".join(c.name for c in candidates),
                          "" if sel.recipes else f" (the defaults from {'a decoder LLM' if decoder else 'an encoder'})")
    queries, negatives = mine_queries(run, [m for c in candidates for m in stages_of(c, sel)], begun.docs, begun.base)
    ranking = yardstick_of(run, begun.docs, sel.families, len(candidates) + 1)
    confirm = confirming(run, begun.docs, ranking) if ranking else None
    corpus = sample_of(run, Corpus(begun.docs, begun.summaries, queries, ranking), confirm)
    base = with_tokenizer(run, begun, [begun.base])[0]
    base_scores = evaluate_model(run, base, corpus)[0]
    ladder, models, scored, earlier = search(run, begun, corpus, negatives, candidates, base_scores)
    pooled = yardstick_pooled(run.settled(corpus.yardstick))
    confirmed = {}  # the untrained model and the pool's winner, evaluated on the confirming yardstick
    if confirm and ladder.winner is not None:
        judged = replace(corpus, yardstick=confirm)
        confirmed = {name: evaluate_model(run, model, judged)[0] for name, model in (
            (BASE, base), (ladder.winner.name, models[rung_name(ladder.winner.name, sel.budget)]))}
    job = SelectJob(name=cfg.data.display_name, ladder=ladder.rows(), total=sel.budget, eta=sel.eta,
                    yardstick=cfg.evaluate.yardstick, base=base.label, earlier_steps=earlier)
    decided = run.stage(SELECT, job, SelectInputs(yardstick=corpus.yardstick, base=base_scores, scored=scored,
                                                  sample=corpus.docs if corpus.docs != begun.docs else None,
                                                  confirm=confirm if confirmed else None, confirmed=confirmed))
    decision = decision_of(run.settled(decided))
    chosen = models.get(rung_name(decision.chosen, sel.budget)) if decision.chosen != BASE else None
    run.register([base] + ([chosen] if chosen else []))
    section = (run.store.path(decided) / SECTION).read_text()
    card = "\n".join(line for line in section.splitlines() if not line.startswith("![")) + "\n"  # the picture stays
    create_markdown_artifact(markdown=markdown_for_ui(run.store, decided, SECTION), key="embforge-select",
                             description="Which recipe: the decision, the ladder, the compute")
    if chosen:
        # by its artifact: labels such as `crops@2e-05` repeat across the searches that share a store
        export_model(Catalog(run.store), chosen.artifact.address, out, [], notes=card)
    static = None
    if sel.static:
        if confirmed:  # judged beside its teacher as the decision was: each model by itself
            teacher_scores, judged, pool = confirmed[decision.chosen], replace(corpus, yardstick=confirm), None
        else:
            teacher_scores = scored[rung_name(decision.chosen, sel.budget)] if chosen else base_scores
            judged, pool = corpus, rung_pool(ladder, sel.budget, base_scores, scored) if pooled else None
        static = distil(run, chosen or base, teacher_scores, begun, judged, static_folder(out), pool)
    return Selection(decision.chosen, decision.said, run.store.location("artifacts", decided.stage, decided.key),
                     decided.address, str(out) if chosen else None, base.label,
                     str(static_folder(out)) if static else None, static)


def outcome_lines(store: ArtifactStore, selection: dict, cfg: PipelineConfig) -> str:
    """What `embforge select` prints when its run is done (`selection`: what the flow returned): the decision's
    section, and where the model is."""
    decided = ArtifactRef.parse(selection["artifact"])
    model = selection["exported"] or f"{selection['base']}, as it is (nothing exported)"
    static = (f"the static model: {selection['static']} ({selection['static_said']})\n" if selection.get("static")
              else "")
    return (f"{(store.path(decided) / SECTION).read_text()}\nthe model: {model}\n{static}"
            f"the decision, its ladder and picture: {store.path(decided)}")


@flow(name="select")
def select(params: SelectParams) -> dict:
    """Pick the recipe for a corpus on the held-out yardstick, train the winner to the full budget and export it;
    returns the decision, the select artifact's folder and the exported model's."""
    run = open_run(params, "select")
    return vars(recorded(run, lambda: select_model(run)))
