"""Select: the decision of a search over recipes (`embforge select`, flows/select.py), and its report section.

The flow runs the search (tasks/core/selection.py: successive halving, each rung a cached train stage scored by the
evaluate stage on the yardstick, tasks/yardstick.py) and hands this stage the ladder it climbed. Here the
yardstick's per-query scores are paired: the winner at the full budget against the untrained model, and against the
runner-up on the last rung they shared; the winner is the answer only if it beats the untrained model significantly.

Inputs: `base`, the untrained model's evaluate artifact, and `scored`, each rung's (`<candidate>@<steps>`).
Output: `ladder.parquet` (every candidate on every rung it reached: its score, or why it stopped there), the
manifest's `decision` and `cost`, `ladder.png` (score against steps per candidate) and `selection.md`: the section a
person reads in a minute.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa

from storage.base import ArtifactRef
from storage.catalog import YARDSTICK_METRICS, YARDSTICK_SCORES
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Section
from tasks.config.evaluation import YardstickConfig
from tasks.core.selection import Decision, Ladder, Step, decide
from tasks.core.stage import Inputs, Stage
from tasks.metrics.significance import PairedDifference
from tasks.reporting import plots
from tasks.yardstick import yardstick_kind

# What a reader of a decision made on the yardstick must know, by kind.
BIAS = {"qrels": "it rewards what your queries ask, and no more: with few of them its intervals are wide, and only the "
                 "queries whose every relevant document fell in the held-out share ask (a larger `held_out` asks more, "
                 "and trains on fewer documents)",
        "titles": "a title names its document's topic in a few words, so the yardstick favours models that match "
                  "short texts to long ones by topic (the query-trained recipes, SemCSE with titles as positives)",
        "labels": "it rewards models that put documents of one label near each other; if what you will use the model "
                  "for is not that grouping (finding answers to questions, say), a recipe it ranks lower may suit "
                  "you better"}
# What each kind's query asks, for the reader of the decision.
ASKS = {"qrels": "each of your queries whose relevant documents are all held out finding them among the corpus",
        "titles": "each held-out document's title finding its own text among the corpus",
        "labels": "each labelled held-out document finding the documents of its label among those not held out "
                  "(your labels: no training used them)"}

PICTURE = "ladder.png"
SECTION = "selection.md"


def rung_name(candidate: str, steps: int) -> str:
    return f"{candidate}@{steps}"


def yardstick_scores(store: ArtifactStore, evaluate: ArtifactRef) -> pd.Series:
    """Each yardstick query's nDCG@10 under one model (its evaluate artifact), by query id."""
    if YARDSTICK_SCORES not in store.manifest(evaluate)["rows"]:
        raise InputError(f"{evaluate.address}: no yardstick scores: evaluated without the yardstick")
    table = store.read_table(evaluate, YARDSTICK_SCORES, ["query_id", "ndcg"]).to_pandas()
    return table.set_index("query_id")["ndcg"].sort_index()


class SelectJob(Section):
    name: str  # the corpus's, for titles
    ladder: list[dict]  # Ladder.rows(): what the search did, with each rung's yardstick score
    total: int
    eta: int
    yardstick: YardstickConfig
    base: str  # the untrained model's label


class SelectInputs(Inputs):
    yardstick: ArtifactRef  # its queries, and the kind it is
    base: ArtifactRef  # the untrained model's evaluate artifact
    scored: dict[str, ArtifactRef]  # rung_name(candidate, steps) → that rung's evaluate artifact
    pool: ArtifactRef | None = None  # what the yardstick ranked among, on a large corpus (tasks/pool.py)


def _difference(d: PairedDifference | None) -> dict | None:
    return None if d is None else dict(mean=d.mean, low=d.low, high=d.high, n=d.n, significant=d.significant)


def section(job: SelectJob, kind: str, ladder: Ladder, decision: Decision, base_score: float, cost: dict,
            pooled: dict | None = None) -> str:
    """The report section: the answer, the ladder, the compute, what the yardstick is and its bias (and the pool it
    ranked among, if any: the pool stage's manifest extra)."""
    rows = pd.DataFrame(ladder.rows())
    rungs = sorted(rows["steps"].unique())
    ranked = (f" It ranked among {pooled['documents']:,} of the {pooled['of']:,} documents: the {pooled['needed']:,} "
              "its queries need and a sample of the others (`select.pool`)." if pooled else "")
    lines = [f"# {job.name}: which recipe", "", f"**Answer: {decision.chosen}.** {decision.said}.", "",
             f"Yardstick: {YARDSTICK_METRICS[kind]}, {ASKS[kind]}; the held-out documents "
             f"({job.yardstick.held_out:.0%} of the corpus) are left out of every candidate's training. "
             f"Its known bias: {BIAS[kind]}.{ranked}", "",
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
    lines += ["| untrained model | " + " | ".join(f"{base_score:.3f}" for _ in rungs) + " | |", "",
              f"Compute: {cost['trained_steps']:,} training steps, {cost['share']:.0%} of the "
              f"{cost['exhaustive_steps']:,} that training all {cost['candidates']} candidates to {job.total} steps "
              "would have cost.", "", f"![yardstick against steps]({PICTURE})", ""]
    return "\n".join(lines)


def build_selection(store: ArtifactStore, job: SelectJob, inputs: SelectInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    ladder = Ladder.from_rows(job.ladder, job.total, job.eta)
    kind = yardstick_kind(store.manifest(inputs.yardstick))
    base = yardstick_scores(store, inputs.base)

    def scores(step: Step) -> np.ndarray:  # in the base's query order: every model scores every yardstick query
        return yardstick_scores(store, inputs.scored[rung_name(step.candidate.name, step.steps)])[base.index].to_numpy()

    final = ladder.steps[-1] if ladder.winner is not None else None
    shared = ladder.runner_up()
    decision = decide(ladder, scores(final) if final else None, base.to_numpy(),
                      (scores(shared[0]), scores(shared[1])) if shared else None)
    candidates = len({r["candidate"] for r in job.ladder})
    cost = dict(trained_steps=ladder.trained_steps, exhaustive_steps=job.total * candidates, candidates=candidates,
                share=ladder.trained_steps / (job.total * candidates))
    out.write_table("ladder", pa.Table.from_pylist(job.ladder))
    out.extra.update(decision=dict(chosen=decision.chosen, said=decision.said, runner_up=decision.runner_up,
                                   versus_base=_difference(decision.versus_base),
                                   versus_runner_up=_difference(decision.versus_runner_up)),
                     cost=cost, base_score=float(base.mean()))
    plots.ladder_png(pd.DataFrame(job.ladder), float(base.mean()), YARDSTICK_METRICS[kind], out.folder / PICTURE,
                     f"{job.name}: the search's rungs")
    pooled = store.manifest(inputs.pool)["extra"] if inputs.pool else None
    out.write_text(SECTION, section(job, kind, ladder, decision, float(base.mean()), cost, pooled))
    log.info("answer: %s. %s", decision.chosen, decision.said)


SELECT = Stage("select", build_selection)
