"""tasks/core/halving.py: successive halving over candidate recipes, on scores given by a function."""

import pytest

from tasks.core.halving import Candidate, Ladder, successive_halving

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
