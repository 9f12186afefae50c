"""The search of `embforge select`: successive halving over candidate recipes.

Every candidate (a recipe at a learning rate) trains a short first rung and is scored on the yardstick; the best
1/eta go on *from their checkpoint* to the next rung (eta times as many steps of the same schedule), and so on,
until one is left, which trains the whole budget. Synchronous: every live candidate is scored on a rung before any
is judged on it, so the decision is the same whatever order the candidates come in. (Optuna's
SuccessiveHalvingPruner is the asynchronous kind, ASHA: it judges a trial against those that reached its rung
before it, so with rungs scored together the first trials judged always go on: 5 of 9 candidates where halving
keeps 3.) The caller trains and scores (`Score`) through cached stages, so a rerun decides the same from the cache
(`start`, if given, is told each rung's candidates first, so a task runner can train them side by side);
`Ladder.rows` is what the select artifact keeps. Pure: nothing here runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tasks.metrics.significance import PairedDifference, paired_difference

# A candidate's score on the yardstick after `steps` (higher is better), or the reason it cannot go on (the
# health check stopped it).
Score = Callable[["Candidate", int], "float | str"]


@dataclass(frozen=True)
class Candidate:
    recipe: str
    lr: float

    @property
    def name(self) -> str:
        return f"{self.recipe}@{self.lr:g}"


def rung_steps(total: int, candidates: int, eta: int) -> list[int]:
    """The steps each rung trains to, shortest first: as many rungs as halvings leave one candidate
    (ceil(log_eta(candidates))), the first `total / eta ** rungs` steps (at least one), each next eta times as many
    (the rungs of Optuna's pruner). The one candidate left then trains to `total`, beyond the last rung."""
    if total < 1 or candidates < 1 or eta < 2:
        raise ValueError(f"a search needs a budget of at least 1 step, a candidate and eta >= 2, not {total}, "
                         f"{candidates} and {eta}")
    rungs = math.ceil(math.log(candidates, eta) - 1e-9) if candidates > 1 else 0
    first = max(1, total // eta ** rungs)
    steps = [first * eta ** k for k in range(rungs)]
    if steps and steps[-1] >= total:
        raise ValueError(f"a budget of {total} steps is too small for {candidates} candidates at eta {eta}: its "
                         f"rungs ({', '.join(map(str, steps))} steps) must stay below it; at least "
                         f"{eta ** (rungs - 1) + 1} steps")
    return steps


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
        steps = [Step(Candidate(r["recipe"], r["lr"]), r["steps"], r["score"], r["dropped"]) for r in rows]
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
        return [dict(candidate=s.candidate.name, recipe=s.candidate.recipe, lr=s.candidate.lr, steps=s.steps,
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


BASE = "base"  # the decision's name for the untrained model
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
           rung: tuple[np.ndarray, np.ndarray] | None = None) -> Decision:
    """The winner if it beats the untrained model significantly (its paired interval over the yardstick's
    queries leaves out 0, above it), else the base, said plainly. `winner`, `base`: per-query scores in the same
    query order; `rung`: the winner's and the runner-up's on their last shared rung."""
    if ladder.winner is None or winner is None:
        return Decision(BASE, "every candidate was stopped by its health check: the answer is the base model as it "
                        "is", None, None)
    name = ladder.winner.name
    shared = ladder.runner_up()
    runner_up = shared[1].candidate.name if shared else None
    versus_runner_up = paired_difference(*rung) if rung is not None else None
    versus_base = paired_difference(winner, base)
    if versus_base.significant and versus_base.mean > 0:
        said = f"{name} beats the untrained model by {_interval(versus_base)}"
        if versus_runner_up is not None:
            said += (f"; against the runner-up {runner_up} at {shared[0].steps} steps: {_interval(versus_runner_up)}"
                     + ("" if versus_runner_up.significant else " (not told apart: either would do)"))
        return Decision(name, said, versus_base, versus_runner_up, runner_up)
    said = (f"no candidate beats the untrained model significantly (the best, {name}: {_interval(versus_base)}): the "
            "answer is the base model as it is")
    if base.mean() >= CEILING:  # a yardstick the start model nearly aces cannot show a gain: say so
        said += (f"; but the untrained model already scores {base.mean():.3f} of 1 on this yardstick, which leaves "
                 "little room to show one: a harder yardstick (your labels, a label column) would tell more")
    return Decision(BASE, said, versus_base, versus_runner_up, runner_up)


def _interval(d: PairedDifference) -> str:
    return f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}] over {d.n} queries"
