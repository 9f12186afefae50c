"""Select: the decision of a search over recipes (`embforge select`, flows/select.py), and its report section.

The flow runs the search (`successive_halving` below, each rung a cached train stage scored by the evaluate stage on
the yardstick, tasks/yardstick.py) and hands this stage the ladder it climbed. Here the
yardstick's per-query scores are paired: the winner at the full budget against the untrained model, and against the
runner-up on the last rung they shared; the winner is the answer only if it beats the untrained model significantly.

Inputs: `base`, the untrained model's evaluate artifact, and `scored`, each rung's (`<candidate>@<steps>`).
Output: `ladder.parquet` (every candidate on every rung it reached: its score, or why it stopped there), the
manifest's `decision` and `cost`, `ladder.png` (score against steps per candidate) and `selection.md`: the section a
person reads in a minute.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_SCORES
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import BASE, InputError, Section
from tasks.config.evaluation import YardstickConfig
from tasks.config.select import rung_steps
from tasks.config.splits import WORTH
from tasks.config.yardsticks import YARDSTICKS, yardstick_kind, yardstick_pooled
from tasks.core.stage import Inputs, Stage
from tasks.metrics.pool import pool_scores
from tasks.metrics.significance import PairedDifference, paired_difference
from tasks.metrics.speed import SPEED_METRICS
from tasks.reporting import plots

# The search: successive halving over candidate recipes.
# Every candidate (a recipe at a learning rate) trains a short first rung and is scored on the yardstick; the best
# 1/eta go on *from their checkpoint* to the next rung (eta times as many steps of the same schedule), and so on,
# until one is left, which trains the whole budget. Synchronous: every live candidate is scored on a rung before any
# is judged on it, so the decision is the same whatever order the candidates come in. (Optuna's
# SuccessiveHalvingPruner is the asynchronous kind, ASHA: it judges a trial against those that reached its rung
# before it, so with rungs scored together the first trials judged always go on: 5 of 9 candidates where halving
# keeps 3.) The caller trains and scores (`Score`) through cached stages, so a rerun decides the same from the cache
# (`start`, if given, is told each rung's candidates first, so a task runner can train them side by side);
# `Ladder.rows` is what the select artifact keeps. Pure: nothing here runs a model.

# A candidate's score on the yardstick after `steps` (higher is better), or the reason it cannot go on (the
# health check stopped it).
Score = Callable[["Candidate", int], "float | str"]


@dataclass(frozen=True)
class Candidate:
    recipe: str
    lr: float
    family: str = "dense"  # tasks/config/families.py

    @property
    def name(self) -> str:
        """`crops@2e-05`; another family than dense is named too: `crops-multi-vector@2e-05`."""
        family = "" if self.family == "dense" else "-" + self.family.replace("_", "-")
        return f"{self.recipe}{family}@{self.lr:g}"


@dataclass
class Step:
    """One rung of one candidate: its score there, or why it stopped."""

    candidate: Candidate
    steps: int
    score: float | None
    dropped: str | None = None  # why it went no further: "pruned" (halving), or the health check's reason

    @classmethod
    def scored(cls, candidate: Candidate, steps: int, score: Score) -> Step:
        found = score(candidate, steps)
        return cls(candidate, steps, None, found) if isinstance(found, str) else cls(candidate, steps, found)


@dataclass
class Ladder:
    """What the search did: every (candidate, rung) scored, the winner, and the steps it cost."""

    total: int
    eta: int
    steps: list[Step] = field(default_factory=list)
    winner: Candidate | None = None

    @property
    def trained_steps(self) -> int:
        """Steps trained over all candidates, each rung going on from the one before (the winner's last leg
        included): what the search cost, against `total` times the candidates for training each fully."""
        reached: dict[Candidate, int] = {}
        for step in self.steps:
            reached[step.candidate] = max(reached.get(step.candidate, 0), step.steps)
        return sum(reached.values())

    @classmethod
    def from_rows(cls, rows: list[dict], total: int, eta: int) -> Ladder:
        """The ladder `rows` made (a select artifact's)."""
        steps = [Step(Candidate(r["recipe"], r["lr"], r["family"]), r["steps"], r["score"], r["dropped"]) for r in rows]
        winner = next((s.candidate for s, r in zip(steps, rows) if r["winner"]), None)
        return cls(total, eta, steps, winner)

    def runner_up(self) -> tuple[Step, Step] | None:
        """(the winner's step, the best other candidate's) on the last rung they were scored on together: the
        decision the search made last."""
        for steps in sorted({s.steps for s in self.steps if s.steps < self.total}, reverse=True):
            rung = [s for s in self.steps if s.steps == steps]
            won = next((s for s in rung if s.candidate == self.winner), None)
            others = sorted((s for s in rung if s.candidate != self.winner and s.score is not None),
                            key=lambda s: -s.score)
            if won and others:
                return won, others[0]
        return None

    def rows(self) -> list[dict]:
        return [dict(candidate=s.candidate.name, recipe=s.candidate.recipe, lr=s.candidate.lr,
                     family=s.candidate.family, steps=s.steps,
                     score=s.score, dropped=s.dropped, winner=s.candidate == self.winner) for s in self.steps]


def successive_halving(candidates: list[Candidate], total: int, eta: int, score: Score,
                       start: Callable[[list[Candidate], int], None] | None = None) -> Ladder:
    """Train and score every candidate rung by rung (`score`), keeping the best ceil(1/eta) of each rung (ties: the
    earlier candidate), then the one left to `total` steps: the Ladder. A candidate whose `score` gives a reason (the
    health check stopped it) is dropped with it. All dropped: no winner. `start(candidates, steps)` is called before
    a rung's candidates are scored."""
    start = start or (lambda live, steps: None)
    if len(set(candidates)) != len(candidates):
        raise ValueError("candidates must differ")
    ladder, live = Ladder(total, eta), list(candidates)
    for steps in rung_steps(total, len(candidates), eta):
        if len(live) <= 1:
            break
        start(live, steps)
        rung = [Step.scored(c, steps, score) for c in live]
        ranked = sorted((s for s in rung if s.dropped is None), key=lambda s: (-s.score, candidates.index(s.candidate)))
        for step in ranked[math.ceil(len(live) / eta):]:
            step.dropped = "pruned"
        ladder.steps += rung
        live = [s.candidate for s in rung if s.dropped is None]  # in the candidates' order
    if live:
        start(live[:1], total)
        ladder.steps.append(last := Step.scored(live[0], total, score))
        ladder.winner = None if last.dropped else live[0]
    return ladder


CEILING = 0.9  # the untrained model's mean yardstick score from which a "base" answer says the yardstick is near top


@dataclass(frozen=True)
class Decision:
    """The answer to "which recipe on this corpus": the model to ship and the evidence, in one sentence."""

    chosen: str  # the winning candidate's name, or BASE
    said: str
    versus_base: PairedDifference | None  # the winner at the budget minus the untrained model, per yardstick query
    versus_runner_up: PairedDifference | None  # the winner minus the runner-up, both at the last rung they shared
    runner_up: str | None = None


def decide(ladder: Ladder, winner: np.ndarray | None, base: np.ndarray,
           rung: tuple[np.ndarray, np.ndarray] | None = None, pooled: bool = False, units: str = "queries"
           ) -> Decision:
    """The winner if it beats the untrained model significantly (its paired interval over the yardstick's
    queries leaves out 0, above it), else the base, said plainly. `winner`, `base`: per-query scores in the same
    query order; `rung`: the winner's and the runner-up's on their last shared rung; `pooled`: scores of a pooled
    kind, agreement with the other models, which cannot rule a gain out nor prove one; `units`: what asks
    (Yardstick.units)."""
    if ladder.winner is None or winner is None:
        return Decision(BASE, "every candidate was stopped by its health check: the answer is the base model as it "
                        "is", None, None)
    name = ladder.winner.name
    shared = ladder.runner_up()
    runner_up = shared[1].candidate.name if shared else None
    versus_runner_up = paired_difference(*rung) if rung is not None else None
    versus_base = paired_difference(winner, base)
    if versus_base.significant and versus_base.mean > 0:
        said = f"{name} beats the untrained model by {_interval(versus_base, units)}"
        if versus_runner_up is not None:
            said += (f"; against the runner-up {runner_up} at {shared[0].steps} steps: "
                     f"{_interval(versus_runner_up, units)}"
                     + ("" if versus_runner_up.significant else " (not told apart: either would do)"))
        if pooled:  # the untrained model is judged by what trained candidates agree on: the pool is one side
            said += ("; on a pooled yardstick this is agreement with the trained candidates, whose grouping judges "
                     "the untrained model, not proof of a better model (the yardstick's known bias): your labels, "
                     "titles or queries (another kind) would confirm it")
        return Decision(name, said, versus_base, versus_runner_up, runner_up)
    said = f"no candidate beats the untrained model significantly (the best, {name}: {_interval(versus_base, units)})"
    if pooled:  # a model unlike the others is marked down: a gain on its own is not ruled out by disagreement
        said += ("; on a pooled yardstick the interval measures agreement with the other models, not a gain, so it "
                 "rules none out: the answer stays the base model as it is, and your labels, titles or queries "
                 "(another kind) would tell more")
    elif versus_base.high < WORTH:
        said += f"; a gain of {WORTH} or more is ruled out: the answer is the base model as it is"
    else:  # too few queries to speak: say so, rather than let "the base" read as the evidence's answer
        more = "`max_queries`, or `kind: queries`, three a document" if units == "queries" else "`max_queries`"
        said += (f"; the yardstick cannot tell: a gain of up to {versus_base.high:+.3f} is not ruled out (more {units} "
                 f"would narrow it: a larger `evaluate.yardstick.held_out` or {more}), so the answer stays the base "
                 "model as it is")
    if base.mean() >= CEILING:  # a yardstick the start model nearly aces cannot show a gain: say so
        said += (f"; but the untrained model already scores {base.mean():.3f} of 1 on this yardstick, which leaves "
                 "little room to show one: a harder yardstick (your labels, a label column) would tell more")
    return Decision(BASE, said, versus_base, versus_runner_up, runner_up)


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


def stored_difference(d: PairedDifference | None) -> dict | None:
    return None if d is None else dict(mean=d.mean, low=d.low, high=d.high, n=d.n, significant=d.significant)


def decision_of(manifest: dict) -> Decision:
    """The Decision a select artifact holds (its manifest's), as the stage made it."""
    kept = manifest["extra"]["decision"]
    differences = {k: PairedDifference(**{f: kept[k][f] for f in ("mean", "low", "high", "n")}) if kept[k] else None
                   for k in ("versus_base", "versus_runner_up")}
    return Decision(kept["chosen"], kept["said"], runner_up=kept["runner_up"], **differences)


def section(job: SelectJob, yardstick: dict, ladder: Ladder, decision: Decision, base_scores: dict[int, float],
            cost: dict, sampled: dict | None = None) -> str:
    """The report section: the answer, the ladder beside the untrained model's score on each rung (`base_scores`, by
    steps: a pooled kind judges it in each rung's pool), the compute, what the yardstick (its artifact's manifest) is
    and its bias (and the sample it ranked among, if any: the sample stage's manifest extra)."""
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
    decision = decide(ladder, scores(final) if final else None, base.to_numpy(),
                      (scores(shared[0]), scores(shared[1])) if shared else None, pooled, YARDSTICKS[kind].units)
    candidates = len({r["candidate"] for r in job.ladder})
    trained, exhaustive = ladder.trained_steps + job.earlier_steps, job.total * candidates + job.earlier_steps
    cost = dict(trained_steps=trained, exhaustive_steps=exhaustive, candidates=candidates, share=trained / exhaustive,
                earlier_steps=job.earlier_steps)
    out.write_table("ladder", pa.Table.from_pylist(job.ladder))
    out.extra.update(decision=dict(chosen=decision.chosen, said=decision.said, runner_up=decision.runner_up,
                                   versus_base=stored_difference(decision.versus_base),
                                   versus_runner_up=stored_difference(decision.versus_runner_up)),
                     cost=cost, base_score=float(base.mean()))
    plots.ladder_png(pd.DataFrame(job.ladder), float(base.mean()), YARDSTICKS[kind].metric, out.folder / PICTURE,
                     f"{job.name}: the search's rungs")
    sampled = store.manifest(inputs.sample)["extra"] if inputs.sample else None
    out.write_text(SECTION, section(job, yardstick, ladder, decision, base_scores, cost, sampled))
    log.info("answer: %s. %s", decision.chosen, decision.said)


SELECT = Stage("select", build_selection)
