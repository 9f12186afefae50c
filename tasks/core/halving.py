"""Successive halving over candidate recipes: the search `embforge select` climbs (tasks/select.py decides on the
ladder it leaves; flows/select.py trains and scores each rung through cached stages). Pure: nothing here runs a
model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.config.select import rung_steps

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
