"""Select: the decision of a search over recipes (`embforge select`, flows/select.py), and its report section.

The flow runs the search (tasks/core/halving.py, each rung a cached train stage scored by the evaluate stage on
the yardstick, tasks/yardstick.py) and hands this stage the ladder it climbed. Here the
yardstick's per-query scores are paired: the winner at the full budget against the untrained model (on a pooled kind,
with `confirm`, on a kind of one model), and against the runner-up on the last rung they shared; the winner is the
answer only if it beats the untrained model significantly.

Inputs: `base`, the untrained model's evaluate artifact, and `scored`, each rung's (`<candidate>@<steps>`); with
`confirm`, its yardstick and `confirmed`, the untrained model's and the winner's evaluate artifacts on it.
Output: `ladder.parquet` (every candidate on every rung it reached: its score, or why it stopped there), the
manifest's `decision` and `cost`, `ladder.png` (score against steps per candidate) and `selection.md`: the section a
person reads in a minute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_SCORES
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import BASE, InputError, Section
from tasks.config.evaluation import YardstickConfig
from tasks.config.splits import WORTH
from tasks.config.yardsticks import YARDSTICKS, yardstick_kind, yardstick_pooled
from tasks.core.halving import Ladder, Step
from tasks.core.stage import Inputs, Stage
from tasks.metrics.pool import pool_scores
from tasks.metrics.significance import PairedDifference, paired_difference
from tasks.metrics.speed import SPEED_METRICS
from tasks.reporting import plots

CEILING = 0.9  # the untrained model's mean yardstick score from which a "base" answer says the yardstick is near top


@dataclass(frozen=True)
class Decision:
    """The answer to "which recipe on this corpus": the model to ship and the evidence, in one sentence."""

    chosen: str  # the winning candidate's name, or BASE
    said: str
    versus_base: PairedDifference | None  # the winner at the budget minus the untrained model, per yardstick query
    versus_runner_up: PairedDifference | None  # the winner minus the runner-up, both at the last rung they shared
    runner_up: str | None = None
    confirmed_by: str | None = None  # where a pooled kind ranked: the kind of one model versus_base is on
    pool_lead: PairedDifference | None = None  # and the winner minus the untrained model on the pooled kind


@dataclass(frozen=True)
class Confirmation:
    """A pooled kind's winner and the untrained model on a kind that scores each model by itself (`select.confirm`):
    their per-query scores in the same query order."""

    kind: str
    winner: np.ndarray
    base: np.ndarray


def decide(ladder: Ladder, winner: np.ndarray | None, base: np.ndarray,
           rung: tuple[np.ndarray, np.ndarray] | None = None, pooled: bool = False, units: str = "queries",
           confirm: Confirmation | None = None) -> Decision:
    """The winner if it beats the untrained model significantly (its paired interval over the yardstick's
    queries leaves out 0, above it), else the base, said plainly. `winner`, `base`: per-query scores in the same
    query order; `rung`: the winner's and the runner-up's on their last shared rung; `pooled`: scores of a pooled
    kind, agreement with the other models, which cannot rule a gain out nor prove one; `units`: what asks
    (Yardstick.units); `confirm`: where a pooled kind ranked, the winner and the untrained model on a kind of one
    model, which then decides between them."""
    if ladder.winner is None or winner is None:
        return Decision(BASE, "every candidate was stopped by its health check: the answer is the base model as it "
                        "is", None, None)
    name = ladder.winner.name
    shared = ladder.runner_up()
    runner_up = shared[1].candidate.name if shared else None
    versus_runner_up = paired_difference(*rung) if rung is not None else None
    versus_base, ranking_units, lead, ranked, called = paired_difference(winner, base), units, None, "", None
    if confirm is not None:  # the pool ranked; against the untrained model, a kind that judges each model alone
        kind, lead = YARDSTICKS[confirm.kind], versus_base
        called = kind.called
        ranked = (f"the pool ranked {name} first, at {_interval(lead, units)} relative to the untrained model "
                  f"(agreement with the trained candidates, which judge it); against the untrained model on {called} "
                  "(each model judged by itself) ")
        versus_base, base, units, pooled = (paired_difference(confirm.winner, confirm.base), confirm.base, kind.units,
                                            False)
    decided = dict(versus_base=versus_base, versus_runner_up=versus_runner_up, runner_up=runner_up,
                   confirmed_by=confirm and confirm.kind, pool_lead=lead)
    if versus_base.significant and versus_base.mean > 0:
        said = (f"{ranked}{name} beats it by {_interval(versus_base, units)}" if ranked else
                f"{name} beats the untrained model by {_interval(versus_base, units)}")
        if versus_runner_up is not None:
            said += (f"; against the runner-up {runner_up} at {shared[0].steps} steps: "
                     f"{_interval(versus_runner_up, ranking_units)}"
                     + ("" if versus_runner_up.significant else " (not told apart: either would do)"))
        if pooled:  # the untrained model is judged by what trained candidates agree on: the pool is one side
            said += ("; on a pooled yardstick this is agreement with the trained candidates, whose grouping judges "
                     "the untrained model, not proof of a better model (the yardstick's known bias): your labels, "
                     "titles or queries (another kind) would confirm it")
        return Decision(name, said, **decided)
    said = (f"{ranked}{name} scores {_interval(versus_base, units)}: it does not beat it significantly" if ranked else
            f"no candidate beats the untrained model significantly (the best, {name}: {_interval(versus_base, units)})")
    if pooled:  # a model unlike the others is marked down: a gain on its own is not ruled out by disagreement
        said += ("; on a pooled yardstick the interval measures agreement with the other models, not a gain, so it "
                 "rules none out: the answer stays the base model as it is, and your labels, titles or queries "
                 "(another kind) would tell more")
    elif versus_base.high < WORTH:
        said += (f"; a gain of {WORTH} or more{' by it' if ranked else ''} is ruled out: the answer is the base model "
                 "as it is")
    else:  # too few queries to speak: say so, rather than let "the base" read as the evidence's answer (a
        # confirming kind is not yours to choose: titles, else an LLM's queries)
        more = "`max_queries`, or `kind: queries`, three a document" if units == "queries" and not ranked else (
            "`max_queries`")
        said += (f"; {called or 'the yardstick'} cannot tell: a gain of up to {versus_base.high:+.3f} is not ruled "
                 f"out (more {units} would narrow it: a larger `evaluate.yardstick.held_out` or {more}), so the answer "
                 "stays the base model as it is")
    if base.mean() >= CEILING:  # a yardstick the start model nearly aces cannot show a gain: say so
        said += (f"; but the untrained model already scores {base.mean():.3f} of 1 on {called or 'this yardstick'}, "
                 "which leaves little room to show one: a harder yardstick (your labels, a label column) would tell "
                 "more")
    return Decision(BASE, said, **decided)


def _interval(d: PairedDifference, units: str) -> str:
    return f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}] over {d.n:,} {units}"


PICTURE = "ladder.png"
SECTION = "selection.md"


def rung_name(candidate: str, steps: int) -> str:
    return f"{candidate}@{steps}"


def agreement(kind: str) -> str:
    """The yardstick's measured agreement with labels, as the report states it."""
    measured = YARDSTICKS[kind].agreement
    return (f"Its agreement with labels: {measured}." if measured else
            "Its agreement with labels has not been measured (benchmarks/yardsticks.py).")


def yardstick_scores(store: ArtifactStore, evaluate: ArtifactRef) -> pd.Series:
    """Each yardstick query's nDCG@10 under one model (its evaluate artifact), by query id."""
    if YARDSTICK_SCORES not in store.manifest(evaluate)["rows"]:
        raise InputError(f"{evaluate.address}: no yardstick scores: evaluated without the yardstick")
    table = store.read_table(evaluate, YARDSTICK_SCORES, ["query_id", "ndcg"]).to_pandas()
    return table.set_index("query_id")["ndcg"].sort_index()


STATIC = "static"  # the static model's name in a pool


def static_summary(store: ArtifactStore, static: ArtifactRef, teacher: ArtifactRef, speed: ArtifactRef | None,
                   teacher_label: str, pool: dict[str, ArtifactRef] | None = None) -> str:
    """A static model against its teacher (`select.static`): the yardstick, paired over its queries (evaluate
    artifacts; on a pooled kind, both judged in `pool`, the decision's, the static model joining it), and the CPU
    documents/s measured side by side (the speed stage's artifact), in one sentence."""
    if pool:
        judged = pool_scores(store, pool | {STATIC: static})
        mine, theirs = judged[STATIC], judged[next(name for name, ref in pool.items() if ref == teacher)]
    else:
        mine, theirs = yardstick_scores(store, static), yardstick_scores(store, teacher)
    d = paired_difference(mine[theirs.index].to_numpy(), theirs.to_numpy())
    yardstick = store.manifest(ArtifactRef("yardstick", store.manifest(teacher)["input_roles"]["yardstick"]))
    said = (f"the yardstick {mine.mean():.3f} against {teacher_label}'s {theirs.mean():.3f} "
            f"({mine.mean() / theirs.mean():.0%} kept: {_interval(d, YARDSTICKS[yardstick_kind(yardstick)].units)})")
    if speed is not None:
        rates = store.read_table(speed, "metrics", ["metric", "value"]).to_pandas().set_index("metric")["value"]
        fast, slow = (rates[m] for m in SPEED_METRICS)
        said += f"; {fast:,.0f} documents/s on the CPU against {slow:,.0f} ({fast / slow:.1f}x)"
    return said


def rung_pool(ladder: Ladder, steps: int, base: ArtifactRef, scored: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """The models a consensus judges each other by on a rung: the untrained model and every candidate scored there; at
    the full budget, every candidate at the last rung it reached (one model each: no candidate's earlier checkpoint
    votes for it)."""
    last = {s.candidate: s for s in ladder.steps}
    pool = [s for s in ladder.steps if s.steps == steps] if steps < ladder.total else list(last.values())
    return {BASE: base} | {rung_name(s.candidate.name, s.steps): scored[rung_name(s.candidate.name, s.steps)]
                           for s in pool}


class SelectJob(Section):
    name: str  # the corpus's, for titles
    ladder: list[dict]  # Ladder.rows(): what the search did, with each rung's yardstick score
    total: int
    eta: int
    yardstick: YardstickConfig
    base: str  # the untrained model's label
    earlier_steps: int = 0  # trained by the chained candidates' earlier stages (CHAINS), once, before their rungs


class SelectInputs(Inputs):
    yardstick: ArtifactRef  # its queries, and the kind it is
    base: ArtifactRef  # the untrained model's evaluate artifact
    scored: dict[str, ArtifactRef]  # rung_name(candidate, steps) → that rung's evaluate artifact
    sample: ArtifactRef | None = None  # what the yardstick ranked among, on a large corpus (tasks/sample.py)
    confirm: ArtifactRef | None = None  # a pooled kind's: the yardstick of one model it is confirmed on (`confirm`)
    confirmed: dict[str, ArtifactRef] = {}  # BASE and the winner → their evaluate artifacts on `confirm`


def stored_difference(d: PairedDifference | None) -> dict | None:
    return None if d is None else dict(mean=d.mean, low=d.low, high=d.high, n=d.n, significant=d.significant)


DIFFERENCES = ("versus_base", "versus_runner_up", "pool_lead")  # a Decision's paired differences


def stored_decision(decision: Decision) -> dict:
    """A Decision as the select artifact's manifest keeps it (decision_of reads it back)."""
    return dict(chosen=decision.chosen, said=decision.said, runner_up=decision.runner_up,
                confirmed_by=decision.confirmed_by, **{k: stored_difference(getattr(decision, k)) for k in DIFFERENCES})


def decision_of(manifest: dict) -> Decision:
    """The Decision a select artifact holds (its manifest's), as the stage made it (one made before `confirm` has no
    confirmation)."""
    kept = manifest["extra"]["decision"]
    differences = {k: PairedDifference(**{f: kept[k][f] for f in ("mean", "low", "high", "n")}) if kept.get(k) else None
                   for k in DIFFERENCES}
    return Decision(kept["chosen"], kept["said"], runner_up=kept["runner_up"],
                    confirmed_by=kept.get("confirmed_by"), **differences)


def section(job: SelectJob, yardstick: dict, ladder: Ladder, decision: Decision, base_scores: dict[int, float],
            cost: dict, sampled: dict | None = None, confirmed: dict | None = None) -> str:
    """The report section: the answer, the ladder beside the untrained model's score on each rung (`base_scores`, by
    steps: a pooled kind judges it in each rung's pool), the compute, what the yardstick (its artifact's manifest) is
    and its bias (and the sample it ranked among, if any: the sample stage's manifest extra; and the yardstick of one
    model that set the winner against the untrained model, if any: its manifest)."""
    kind, held = yardstick_kind(yardstick), yardstick["extra"]
    rows = pd.DataFrame(ladder.rows())
    rungs = sorted(rows["steps"].unique())
    ranked = (f" It ranked among {sampled['documents']:,} of the {sampled['of']:,} documents: the "
              f"{sampled['needed']:,} its queries need and a sample of the others (`select.sample`)."
              if sampled else "")
    lines = [f"# {job.name}: which recipe", "", f"**Answer: {decision.chosen}.** {decision.said}.", "",
             f"Yardstick: {YARDSTICKS[kind].metric}, {YARDSTICKS[kind].asks}; the held-out documents "
             f"({held['held_out']:,}, {held['share']:.0%} of the corpus) are left out of every candidate's training. "
             f"Its known bias: {YARDSTICKS[kind].bias}. {agreement(kind)}{ranked}", "",
             *(_confirmed_by(confirmed) if confirmed else []),
             "| candidate | " + " | ".join(f"{s} steps" for s in rungs) + " | stopped |",
             "|---|" + "---|" * (len(rungs) + 1)]
    for candidate, steps in rows.groupby("candidate", sort=False):
        scores = dict(zip(steps["steps"], steps["score"]))
        last = steps.iloc[-1]
        # the health check's finding, without its advice (ladder.parquet keeps all of it)
        stopped = ("winner" if last["winner"] and last["steps"] == job.total else
                   (last["dropped"] or "").split(": ")[1 if ": " in (last["dropped"] or "") else 0])
        lines.append(f"| {candidate} | " + " | ".join("" if s not in scores or scores[s] != scores[s] else
                                                       f"{scores[s]:.3f}" for s in rungs) + f" | {stopped} |")
    lines += ["| untrained model | " + " | ".join(f"{base_scores[s]:.3f}" for s in rungs) + " | |", "",
              f"Compute: {cost['trained_steps']:,} training steps, {cost['share']:.0%} of the "
              f"{cost['exhaustive_steps']:,} that training all {cost['candidates']} candidates to {job.total} steps "
              "would have cost" + (f" ({cost['earlier_steps']:,} of them a chained candidate's earlier stages, "
                                   "trained once before its rungs)" if cost["earlier_steps"] else "") + ".", "",
              f"![yardstick against steps]({PICTURE})", ""]
    return "\n".join(lines)


def _confirmed_by(yardstick: dict) -> list[str]:
    """The report's paragraph on the yardstick of one model that set a pooled kind's winner against the untrained
    model (its artifact's manifest)."""
    kind = YARDSTICKS[yardstick_kind(yardstick)]
    return [f"Against the untrained model: {kind.metric}, {kind.asks} ({yardstick['extra']['queries']:,} ask, of the "
            "same held-out documents), which judges each model by itself, so that no trained majority of the pool "
            f"tilts the decision (`select.confirm`). Its known bias: {kind.bias}.", ""]


def build_selection(store: ArtifactStore, job: SelectJob, inputs: SelectInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    ladder = Ladder.from_rows(job.ladder, job.total, job.eta)
    yardstick = store.manifest(inputs.yardstick)
    kind, pooled = yardstick_kind(yardstick), yardstick_pooled(yardstick)
    rungs = {s.steps for s in ladder.steps}
    if pooled:  # judged by the pool the search judged them in (flows/select.py: rung_pool)
        pools = {steps: pool_scores(store, rung_pool(ladder, steps, inputs.base, inputs.scored))
                 for steps in rungs}
        base = pools[job.total if job.total in pools else max(pools)][BASE]
        base_scores = {steps: float(pools[steps][BASE].mean()) for steps in rungs}
    else:
        base = yardstick_scores(store, inputs.base)
        base_scores = dict.fromkeys(rungs, float(base.mean()))

    def scores(step: Step) -> np.ndarray:  # in the base's query order: every model scores every yardstick query
        name = rung_name(step.candidate.name, step.steps)
        found = pools[step.steps][name] if pooled else yardstick_scores(store, inputs.scored[name])
        return found[base.index].to_numpy()

    final = ladder.steps[-1] if ladder.winner is not None else None
    shared = ladder.runner_up()
    confirm = None
    if inputs.confirm and final:  # the untrained model and the winner, each judged by itself
        alone = {name: yardstick_scores(store, ref) for name, ref in inputs.confirmed.items()}
        confirm = Confirmation(yardstick_kind(store.manifest(inputs.confirm)),
                               alone[final.candidate.name][alone[BASE].index].to_numpy(), alone[BASE].to_numpy())
    decision = decide(ladder, scores(final) if final else None, base.to_numpy(),
                      (scores(shared[0]), scores(shared[1])) if shared else None, pooled, YARDSTICKS[kind].units,
                      confirm)
    candidates = len({r["candidate"] for r in job.ladder})
    trained, exhaustive = ladder.trained_steps + job.earlier_steps, job.total * candidates + job.earlier_steps
    cost = dict(trained_steps=trained, exhaustive_steps=exhaustive, candidates=candidates, share=trained / exhaustive,
                earlier_steps=job.earlier_steps)
    out.write_table("ladder", pa.Table.from_pylist(job.ladder))
    out.extra.update(decision=stored_decision(decision), cost=cost, base_score=float(base.mean()))
    plots.ladder_png(pd.DataFrame(job.ladder), float(base.mean()), YARDSTICKS[kind].metric, out.folder / PICTURE,
                     f"{job.name}: the search's rungs")
    sampled = store.manifest(inputs.sample)["extra"] if inputs.sample else None
    confirmed = store.manifest(inputs.confirm) if confirm else None
    out.write_text(SECTION, section(job, yardstick, ladder, decision, base_scores, cost, sampled, confirmed))
    log.info("answer: %s. %s", decision.chosen, decision.said)


SELECT = Stage("select", build_selection)
