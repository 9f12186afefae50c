"""tasks/select.py's decision over the ladder a search left (tests/tasks/core/test_halving.py climbs it)."""

import json

import numpy as np

from tasks.config.base import BASE
from tasks.config.evaluation import YardstickConfig
from tasks.core.halving import Candidate, successive_halving
from tasks.metrics.significance import paired_difference
from tasks.select import Confirmation, SelectJob, decide, decision_of, section, stored_decision
from tests.tasks.core.test_halving import NINE, quality


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


def test_a_decision_reads_back_from_its_artifact_as_it_was_made():
    ladder = successive_halving(NINE, 900, 3, quality)
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.6, 50)
    made = decide(ladder, base + 0.1, base, (base + 0.1, base))
    confirmed = decide(ladder, base + 0.1, base, (base + 0.1, base), pooled=True,
                       confirm=Confirmation("titles", base[:40] + 0.05, base[:40]))
    for made in (made, confirmed):
        stored = {"extra": {"decision": stored_decision(made)}}
        assert decision_of(json.loads(json.dumps(stored))) == made  # through the manifest's JSON
    assert confirmed.confirmed_by == "titles" and confirmed.versus_base.n == 40 and confirmed.pool_lead.n == 50
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


def test_a_pooled_kinds_winner_is_set_against_the_untrained_model_on_a_kind_of_one_model():
    """`confirm`: the pool ranks, but its lead over the untrained model is the trained candidates' agreement; the
    kind that judges each model by itself decides whether the winner ships."""
    ladder = successive_halving(NINE, 900, 3, quality)
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.6, 400)  # per-document scores on the pooled kind
    ahead = np.clip(base + rng.normal(0.04, 0.02, 400), 0, 1)  # the pool puts the winner well ahead
    titles = rng.uniform(0.3, 0.9, 150)  # the untrained model on the titles
    level = np.clip(titles + rng.normal(0.0, 0.05, 150), 0, 1)
    decision = decide(ladder, ahead, base, (ahead, base), pooled=True, units="documents",
                      confirm=Confirmation("titles", level, titles))
    # level on the titles: the base, whatever the pool said, with the titles' interval and the pool's lead both given
    d, pool = paired_difference(level, titles), paired_difference(ahead, base)
    assert decision.chosen == BASE and decision.confirmed_by == "titles"
    assert (decision.versus_base.mean, decision.versus_base.n) == (d.mean, 150)
    assert decision.said.startswith(f"the pool ranked dropout@0.0003 first, at {pool.mean:+.3f} [{pool.low:+.3f}, "
                                    f"{pool.high:+.3f}] over 400 documents relative to the untrained model")
    assert (f"on the titles (each model judged by itself) dropout@0.0003 scores {d.mean:+.3f} [{d.low:+.3f}, "
            f"{d.high:+.3f}] over 150 queries: it does not beat it significantly; a gain of 0.03 or more by it is "
            "ruled out: the answer is the base model as it is") in decision.said
    assert "not proof" not in decision.said and "rules none out" not in decision.said
    assert decision.pool_lead == pool  # kept beside the confirming interval
    # too few of an LLM's queries to tell, where the untrained model nearly aces them: said of that kind
    aced = np.r_[np.ones(16), np.full(4, 0.6)]  # mean 0.92
    level = aced + np.r_[np.zeros(12), np.full(4, -0.3), np.full(4, 0.3)]  # as much lost as won: -0.1 to +0.1
    decision = decide(ladder, ahead, base, pooled=True, units="documents", confirm=Confirmation("queries", level, aced))
    assert decision.chosen == BASE and "an LLM's queries cannot tell: a gain of up to" in decision.said
    assert "(more queries would narrow it: a larger `evaluate.yardstick.held_out` or `max_queries`)" in decision.said
    assert "already scores 0.920 of 1 on an LLM's queries" in decision.said
    # ahead on the titles too: the winner ships, the runner-up compared on the pool's documents
    better = np.clip(titles + rng.normal(0.05, 0.05, 150), 0, 1)
    decision = decide(ladder, ahead, base, (ahead, base), pooled=True, units="documents",
                      confirm=Confirmation("titles", better, titles))
    assert decision.chosen == "dropout@0.0003" and decision.versus_base.n == 150 and decision.versus_base.low > 0
    assert "dropout@0.0003 beats it by" in decision.said and "over 150 queries" in decision.said
    assert "against the runner-up dropout@0.001 at 300 steps" in decision.said
    assert decision.said.split("against the runner-up")[1].count("over 400 documents") == 1
    assert "not proof" not in decision.said
