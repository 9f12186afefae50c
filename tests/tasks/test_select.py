"""tasks/select.py's search and decision: successive halving over candidate recipes, on scores given by a function."""

import json

import numpy as np
import pytest

from tasks.config.base import BASE
from tasks.config.evaluation import YardstickConfig
from tasks.metrics.significance import paired_difference
from tasks.select import (
    Candidate,
    Ladder,
    SelectJob,
    decide,
    decision_of,
    section,
    stored_difference,
    successive_halving,
)

NINE = [Candidate(recipe, lr) for recipe in ("crops", "dropout", "tsdae") for lr in (1e-4, 3e-4, 1e-3)]


def quality(candidate: Candidate, steps: int) -> float:
    """A score that grows with steps, at a rate set by the candidate (dropout at 3e-4 learns fastest)."""
    rate = {"crops": 0.5, "dropout": 1.0, "tsdae": 0.2}[candidate.recipe] * {1e-4: 0.5, 3e-4: 1.0, 1e-3: 0.8}[
        candidate.lr]
    return rate * steps / (steps + 100)


def test_the_best_third_goes_on_from_each_rung_and_the_last_trains_the_whole_budget():
    calls = []
    ladder = successive_halving(NINE, 900, 3, lambda c, s: calls.append((c.name, s)) or quality(c, s))
    assert ladder.winner == Candidate("dropout", 3e-4)
    assert [s for _, s in calls] == [100] * 9 + [300] * 3 + [900]
    assert {c for c, s in calls if s == 300} == {"dropout@0.0003", "dropout@0.001", "crops@0.0003"}
    # each candidate's steps once: 9 x 100, 3 more x 200, the winner 600 more; against 9 x 900 trained fully
    assert ladder.trained_steps == 9 * 100 + 3 * 200 + 600 == 2_100
    assert ladder.trained_steps / (9 * 900) < 0.35
    rows = ladder.rows()
    assert [(r["candidate"], r["steps"], r["dropped"]) for r in rows if r["dropped"]] == [
        *[(c.name, 100, "pruned") for c in NINE if c.name not in {"dropout@0.0003", "dropout@0.001", "crops@0.0003"}],
        ("crops@0.0003", 300, "pruned"), ("dropout@0.001", 300, "pruned")]
    assert [r["winner"] for r in rows].count(True) == 3 and rows[-1]["steps"] == 900


def test_a_candidate_the_health_check_stops_is_dropped_with_its_reason():
    def score(candidate, steps):
        if candidate == Candidate("dropout", 3e-4) and steps == 300:
            return "training collapsed at step 180"
        return quality(candidate, steps)

    ladder = successive_halving(NINE, 900, 3, score)
    assert ladder.winner == Candidate("dropout", 1e-3)
    assert ("dropout@0.0003", 300, "training collapsed at step 180") in [
        (r["candidate"], r["steps"], r["dropped"]) for r in ladder.rows()]


def test_every_candidate_stopped_leaves_no_winner():
    ladder = successive_halving(NINE[:3], 90, 3, lambda c, s: "diverged")
    assert ladder.winner is None and {r["dropped"] for r in ladder.rows()} == {"diverged"}


def test_one_candidate_trains_the_whole_budget_at_once():
    ladder = successive_halving(NINE[:1], 90, 3, quality)
    assert ladder.winner == NINE[0] and [(r["steps"], r["winner"]) for r in ladder.rows()] == [(90, True)]
    with pytest.raises(ValueError, match="candidates must differ"):
        successive_halving([NINE[0], NINE[0]], 90, 3, quality)


def test_the_winner_is_the_answer_only_when_it_beats_the_untrained_model_on_the_paired_queries():
    ladder = successive_halving(NINE, 900, 3, quality)
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, 200)  # per-query nDCG@10 of the untrained model
    better = np.clip(base + rng.normal(0.05, 0.05, 200), 0, 1)
    won, other = ladder.runner_up()
    assert won.candidate == ladder.winner == Candidate("dropout", 3e-4) and won.steps == 300
    assert other.candidate == Candidate("dropout", 1e-3)  # the best of the rest on the last rung both were on
    decision = decide(ladder, better, base, (better, base))
    assert decision.chosen == "dropout@0.0003" and decision.versus_base.low > 0
    assert decision.runner_up == "dropout@0.001"
    d = paired_difference(better, base)
    assert decision.said.startswith(f"dropout@0.0003 beats the untrained model by {d.mean:+.3f} [{d.low:+.3f}, "
                                    f"{d.high:+.3f}] over 200 queries")
    assert "against the runner-up dropout@0.001 at 300 steps" in decision.said
    # No better than the untrained model (a noisy tie): the answer is the base, said plainly.
    tie = np.clip(base + rng.normal(0.0, 0.05, 200), 0, 1)
    decision = decide(ladder, tie, base, (tie, tie))
    assert decision.chosen == BASE and decision.said.startswith("no candidate beats the untrained model "
                                                                "significantly (the best, dropout@0.0003:")
    assert decision.said.endswith("the answer is the base model as it is")
    assert "a gain of 0.03 or more is ruled out" in decision.said
    # On a pooled yardstick the same tie rules nothing out: a model unlike the others is marked down by them.
    decision = decide(ladder, tie, base, (tie, tie), pooled=True)
    assert decision.chosen == BASE and "ruled out" not in decision.said and "rules none out" in decision.said
    # and a gain there is the trained candidates' agreement: the winner stays the answer, said to need confirming
    decision = decide(ladder, better, base, (better, base), pooled=True)
    assert decision.chosen == "dropout@0.0003" and decision.said.startswith("dropout@0.0003 beats the untrained")
    assert decision.said.endswith("not proof of a better model (the yardstick's known bias): your labels, titles or "
                                  "queries (another kind) would confirm it")
    assert "not proof" not in decide(ladder, better, base, (better, base)).said
    # Too few queries to tell a gain of 0.03 from none: the answer says the yardstick cannot tell, not that the base
    # won.
    noisy = np.clip(base[:20] + rng.normal(0.03, 0.2, 20), 0, 1)
    decision = decide(ladder, noisy, base[:20])
    assert decision.chosen == BASE and decision.versus_base.low < 0 < 0.03 < decision.versus_base.high
    said = f"the yardstick cannot tell: a gain of up to {decision.versus_base.high:+.3f} is not ruled out"
    assert said in decision.said
    worse = base - 0.1  # significantly worse is no better
    assert decide(ladder, worse, base).chosen == BASE
    every_stopped = successive_halving(NINE, 900, 3, lambda c, s: "collapsed")
    assert decide(every_stopped, None, base).chosen == BASE
    # An untrained model that nearly aces the yardstick leaves it no room to show a gain: the answer says so.
    aced = np.r_[np.ones(190), np.full(10, 0.5)]  # mean 0.975
    decision = decide(ladder, aced, aced, (aced, aced))
    assert decision.chosen == BASE and decision.said.endswith(
        "the answer is the base model as it is; but the untrained model already scores 0.975 of 1 on this yardstick, "
        "which leaves little room to show one: a harder yardstick (your labels, a label column) would tell more")


def test_a_ladder_is_rebuilt_from_its_rows():
    ladder = successive_halving(NINE, 900, 3, quality)
    again = Ladder.from_rows(ladder.rows(), 900, 3)
    assert again.rows() == ladder.rows() and again.winner == ladder.winner
    assert again.trained_steps == ladder.trained_steps == 6 * 100 + 2 * 300 + 900


def test_each_rung_s_candidates_are_started_together_before_any_is_scored():
    events = []
    successive_halving(NINE, 900, 3, lambda c, s: events.append(("score", c.name, s)) or quality(c, s),
                       lambda live, s: events.append(("start", [c.name for c in live], s)))
    starts = [e for e in events if e[0] == "start"]
    assert [(len(names), s) for _, names, s in starts] == [(9, 100), (3, 300), (1, 900)]
    for _, names, steps in starts:  # then exactly those, scored
        at = events.index(("start", names, steps))
        assert [e[1] for e in events[at + 1 : at + 1 + len(names)]] == names


def test_a_decision_reads_back_from_its_artifact_as_it_was_made():
    ladder = successive_halving(NINE, 900, 3, quality)
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.6, 50)
    made = decide(ladder, base + 0.1, base, (base + 0.1, base))
    stored = {"extra": {"decision": dict(chosen=made.chosen, said=made.said, runner_up=made.runner_up,
                                         versus_base=stored_difference(made.versus_base),
                                         versus_runner_up=stored_difference(made.versus_runner_up))}}
    assert decision_of(json.loads(json.dumps(stored))) == made  # through the manifest's JSON
    made = decide(successive_halving(NINE, 900, 3, lambda c, s: "collapsed"), None, base)
    assert decision_of({"extra": {"decision": dict(chosen=made.chosen, said=made.said, runner_up=None,
                                                   versus_base=None, versus_runner_up=None)}}) == made


def test_the_section_gives_the_untrained_model_s_score_on_each_rung():
    """A pooled yardstick judges the untrained model in each rung's pool: the section's row gives each rung's."""
    ladder = successive_halving(NINE, 900, 3, quality)
    base = np.random.default_rng(2).uniform(0.2, 0.6, 50)
    job = SelectJob(name="corpus", ladder=ladder.rows(), total=900, eta=3,
                    yardstick=YardstickConfig(kind="neighbours"), base="base")
    yardstick = {"extra": {"kind": "neighbours", "held_out": 50, "share": 0.25, "queries": 50}}
    cost = dict(trained_steps=ladder.trained_steps, exhaustive_steps=9 * 900, candidates=9, share=0.3,
                earlier_steps=0)
    text = section(job, yardstick, ladder, decide(ladder, base + 0.1, base), {100: 0.71, 300: 0.62, 900: 0.55}, cost)
    assert "| untrained model | 0.710 | 0.620 | 0.550 | |" in text
    assert "Yardstick: neighbours_ndcg_at_10, each held-out document, by its own vector" in text
