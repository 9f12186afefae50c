"""tasks/methods/health.py: collapse and divergence stop training with one error (or a warning), a
healthy run is never flagged, and clipping changes a step only above its threshold."""

import json
import logging
import math

import pytest
import torch

from tasks.config.training import TrainConfig
from tasks.encoders.models import sentence_model
from tasks.encoders.precision import MixedPrecision
from tasks.methods import health
from tasks.methods.batches import PairBatches
from tasks.methods.health import PATIENCE, PROBE_EVERY, Problem, TrainingUnhealthy, check, first_probe, summary
from tasks.methods.objectives import build_objective
from tasks.methods.training import Checkpoints, StepLog, health_of, train_model, warmup_steps
from tasks.train import probe_cosine
from tests.helpers import model_tokens_file

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
PAIRS = [[(f"doc {i} about {WORDS[i % 12]} and {WORDS[i * 7 % 12]}", f"doc {i} more on {WORDS[i % 12]} "
           f"{WORDS[i * 5 % 12]}") for i in range(320)]]  # 40 batches of 8
CHANCE = math.log(8)


def trained(tiny_dir, tmp_path, recipe, **train):
    cfg = TrainConfig(batch_size=8, max_length=32, warmup_ratio=0.1, **{"lr": 1e-3, **train})
    model = sentence_model(tiny_dir, cfg.max_length, "cpu")
    objective = build_objective(model, recipe, cfg, 0.15 if recipe == "mlm" else None, None)
    batches = PairBatches(model_tokens_file(model, PAIRS, 50), cfg.batch_size)  # as the train stage reads them
    probe = probe_cosine(model, [a for a, _ in PAIRS[0][:64]])
    history = train_model(objective, batches, cfg, Checkpoints(tmp_path), probe=probe)
    return history, health_of(batches, cfg, history), warmup_steps(cfg, batches)


def test_an_absurd_learning_rate_stops_with_the_collapse_error_within_patience_steps(tiny_dir, tmp_path):
    said = (r"training collapsed at step (\d+) \(lr 30\): the loss has been 2\.\d+, chance level \(ln of the batch "
            r"= 2\.079\).*mean cosine is 0\.99.*lower train\.lr")
    with pytest.raises(TrainingUnhealthy, match=said) as e:
        trained(tiny_dir, tmp_path, "crops", lr=30.0, precision="fp32")  # bf16 rounds the collapse's cosine to 1
    step = int(e.value.args[0].split("step ")[1].split()[0])
    assert step <= 4 + PATIENCE + PROBE_EVERY  # warm-up (10% of 40 steps), then PATIENCE steps and a probe


def test_with_warn_the_collapsed_run_finishes_and_its_health_says_so(tiny_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "embforge.train"):
        history, found, _ = trained(tiny_dir, tmp_path, "crops", lr=30.0, on_unhealthy="warn")
    assert len(history) == 40
    assert health.findings(found)[0].kind == "collapsed" and found["chance_loss"] == pytest.approx(CHANCE)
    assert found["probe_mean_cosine"] > 0.99 and abs(found["final_loss"] - CHANCE) < 0.03 * CHANCE
    assert [r.message.count("collapsed") for r in caplog.records] == [1]  # warned once, not at every step


@pytest.mark.parametrize("recipe", ["crops", "tsdae", "mlm"])
def test_a_healthy_run_is_not_flagged(tiny_dir, tmp_path, recipe):
    history, found, _ = trained(tiny_dir, tmp_path, recipe)
    assert found["findings"] == []
    assert found["grad_norm_min"] > 0 and found["grad_norm_max"] >= found["grad_norm_min"]
    assert [h.step for h in history if h.probe_cosine is not None] == [1, 10, 20, 30, 40]  # after step 1, then every 10
    assert found["probe_mean_cosine"] < health.PROBE_COLLAPSED
    if recipe == "crops":
        assert found["final_loss"] < 0.5 * CHANCE  # it learned: far under chance
    else:
        assert found["chance_loss"] is None  # reconstruction losses have no chance level


def log(losses, probes=None, start=1, chance=CHANCE, norms=None):
    """Steps of a batch-8 InfoNCE run (`chance=None`: a loss without a chance level)."""
    probes, norms = probes or {}, norms or {}
    return [StepLog(step, 0, loss, 1e-3, chance=chance, grad_norm=norms.get(step, 1.0), probe_cosine=probes.get(step))
            for step, loss in enumerate(losses, start)]


def said(found: dict) -> str:
    """The verdict of a health summary, as the log, the catalog and the report say it."""
    return health.verdict(health.findings(found))


def test_the_symptoms_and_what_is_not_one():
    warmup = 5
    dead = log([CHANCE] * 30, {10: 1.0, 20: 1.0, 30: 1.0})
    assert check(dead, warmup).kind == "collapsed"
    assert check(dead[:warmup + PATIENCE], warmup) is None  # not before PATIENCE steps after warm-up
    alive = log([CHANCE] * 30, {10: 0.6, 20: 0.7, 30: 0.8})  # at chance, but the texts still differ
    assert check(alive, warmup) is None
    assert check(log([1.0] * 29 + [float("nan")]), warmup).kind == "diverged"
    assert check(log([float("inf")]), warmup).kind == "diverged"  # at once, even in warm-up
    assert check(log([1.0] * 29 + [4.5]), warmup).kind == "diverged"  # 3 x median + 1 = 4
    assert check(log([1.0] * 29 + [3.9]), warmup) is None
    easy = log([0.001] * 40, {20: 0.3, 30: 0.5, 40: 0.6})
    assert check(easy, warmup) == Problem("trivial", 40, check(easy, warmup).why)
    assert not check(easy, warmup).fatal
    reconstruction_dead = log([5.0] * 40, {1: 0.6, 30: 0.99999, 40: 0.99999}, chance=None)
    assert check(reconstruction_dead, warmup, first_probe(reconstruction_dead)).kind == "collapsed"
    assert check(log([5.0] * 40, {30: 0.95, 40: 0.95}, chance=None), warmup) is None  # TSDAE ends near 0.90
    # A deep random encoder starts with one vector for every text: it has yet to spread, not collapsed.
    spreading = log([10.0 - 0.01 * i for i in range(40)], {1: 0.99999, 30: 0.99999, 40: 0.99999}, chance=None)
    assert check(spreading, warmup, first_probe(spreading)) is None
    assert check(spreading, warmup, first_probe(spreading), final=True) is None


def test_an_epoch_s_smaller_last_batch_is_judged_against_its_own_chance_level():
    # 3 epochs of 7 steps: 6 batches of 16 rows, then 7 rows (ln 7 = 1.946 is 30% under ln 16 = 2.773)
    steps = [StepLog(i, (i - 1) // 7, math.log(7 if i % 7 == 0 else 16), 1e-3, chance=math.log(7 if i % 7 == 0 else 16),
                     grad_norm=1e-4, probe_cosine=0.9998 if i % 10 == 0 or i == 1 else None) for i in range(1, 50)]
    found = check(steps[:23], warmup=2)  # the first step past warm-up + PATIENCE, the partial batches among them
    assert found.kind == "collapsed" and found.step == 23
    assert "chance level (ln of the batch = 2.773, less for an epoch's smaller last batch), for 20 steps" in found.why
    assert said(summary(steps, warmup=2)) == "collapsed at step 23"
    assert summary(steps, warmup=2)["chance_loss"] == pytest.approx(math.log(16))  # the full batch's


def test_a_run_shorter_than_the_window_is_judged_at_its_end():
    # the run: 21 steps (3 epochs of 7, the last batch of each smaller), warm-up 1, texts at one vector
    steps = [StepLog(i, 0, math.log(8 if i % 7 == 0 else 20) * 1.001, 1e-3, chance=math.log(8 if i % 7 == 0 else 20),
                     grad_norm=1e-4, probe_cosine={1: 0.978, 10: 0.99979, 20: 0.99976, 21: 0.99976}.get(i))
             for i in range(1, 22)]
    assert all(check(steps[:end], warmup=1) is None for end in range(1, 22))  # too short for the running rules
    found = check(steps, warmup=1, start=0.978, final=True)
    assert found.kind == "collapsed" and found.step == 21 and "for 10 steps" in found.why  # since the probe before
    early = [StepLog(h.step, 0, h.chance * (1.04 if h.step <= 11 else 1.0), 1e-3, chance=h.chance,
                     probe_cosine=h.probe_cosine) for h in steps]  # 4% off chance until step 11: not yet at it
    assert check(early, warmup=1, start=0.978, final=True).kind == "collapsed"
    assert check(early[:-1], warmup=1, start=0.978, final=True) is None  # ending at step 20: 11 is off chance
    # a deep random encoder (every text one vector from the start) at chance after a short run has yet to spread
    assert check(steps, warmup=1, start=0.99995, final=True) is None
    assert said(summary(steps, warmup=1)) == "collapsed at step 21"
    # any loss: texts that started apart and end at one vector
    reconstruction = log([5.0 - 0.1 * i for i in range(12)], {1: 0.7, 10: 0.99, 12: 0.99995}, chance=None)
    assert check(reconstruction, 5, first_probe(reconstruction), final=True).kind == "collapsed"
    assert check(reconstruction, 5, first_probe(reconstruction)) is None  # not before the end
    learning = log([CHANCE * 0.6] * 12, {1: 0.9, 10: 0.995, 12: 0.995})  # under chance: the texts are told apart
    assert check(learning, 5, first_probe(learning), final=True) is None


def test_gradients_that_are_never_finite_are_a_divergence_whatever_the_loss():
    inf = {step: float("inf") for step in range(1, 41)}
    stuck = log([3e27] * 40, {1: 0.5, 10: 0.5, 20: 0.5, 30: 0.5, 40: 0.5}, norms=inf)
    assert [check(stuck[:end], 5) for end in range(1, PATIENCE)] == [None] * (PATIENCE - 1)
    found = check(stuck[:PATIENCE], 5)
    assert found.kind == "diverged" and found.step == PATIENCE and "the gradient norm has been inf" in found.why
    assert check(stuck[:3], 5, final=True).kind == "diverged"  # a run shorter than PATIENCE: every step of it
    # fp16's scaler: a few overflowing steps while it finds its scale are skipped, not a divergence
    skipped = log([2.0] * 40, {1: 0.5, 10: 0.5, 20: 0.5, 30: 0.5, 40: 0.4}, norms={1: float("inf"), 2: float("nan")})
    assert said(summary(skipped, 5)) == "healthy"
    assert said(summary(stuck, 5)) == "diverged at step 20"


def test_the_summary_names_the_first_step_of_each_problem_and_becomes_catalog_rows():
    steps = log([CHANCE] * 40, {10: 1.0, 20: 1.0, 30: 1.0, 40: 1.0})
    for s, norm in zip(steps, range(1, 41)):
        s.grad_norm = float(norm)
    found = summary(steps, warmup=5)
    assert found == dict(findings=[dict(kind="collapsed", step=26, why=check(steps[:26], 5).why)], final_loss=CHANCE,
                         chance_loss=CHANCE, probe_mean_cosine=1.0, grad_norm_min=1.0, grad_norm_max=40.0)
    assert json.loads(json.dumps(found)) == found  # the manifest's `health` as it is
    rows = {r["metric"]: r for r in health.health_rows(found)}
    assert rows["health"]["note"] == "collapsed at step 26" and rows["health"]["value"] is None
    assert rows["grad_norm_max"]["value"] == 40.0 and {r["dataset"] for r in rows.values()} == {"training"}


def with_findings(*problems: Problem) -> dict:
    return dict(findings=[vars(p) for p in problems], final_loss=1.0)


COLLAPSED = Problem("collapsed", 40, "one vector")
TRIVIAL = Problem("trivial", 12, "too easy")
DIVERGED = Problem("diverged", 50, "the loss is nan")


def test_the_findings_are_read_as_they_were_written_and_only_a_trivial_view_is_not_fatal():
    found = with_findings(TRIVIAL, COLLAPSED, DIVERGED)
    assert health.findings(found) == [TRIVIAL, COLLAPSED, DIVERGED]
    assert said(found) == "trivial at step 12; collapsed at step 40; diverged at step 50"  # in the order found
    assert health.fatal_verdict(found) == "collapsed at step 40; diverged at step 50"
    assert health.fatal_verdict(with_findings(TRIVIAL)) is None and said(with_findings(TRIVIAL)) == "trivial at step 12"
    assert health.fatal_verdict(with_findings()) is None and said(with_findings()) == "healthy"


def test_documents_at_one_vector_are_a_collapse_added_once_by_the_evaluation():
    seen = health.evaluated(with_findings(), 0.9998)
    assert health.findings(seen) == [Problem("collapsed", None, "the documents' mean cosine is 0.9998")]
    assert health.findings(seen)[0].fatal and seen["final_loss"] == 1.0
    assert said(seen) == "collapsed at evaluation (the documents' mean cosine is 0.9998)"
    assert health.evaluated(seen, 0.9999) == seen  # a collapse is there: once
    assert said(health.evaluated(with_findings(TRIVIAL), 0.9998)) == f"trivial at step 12; {said(seen)}"
    assert health.evaluated(with_findings(COLLAPSED), 0.9998) == with_findings(COLLAPSED)  # training saw it first
    for spread in (0.98, None):  # an untrained random encoder's documents; no documents measured
        assert health.evaluated(with_findings(), spread) == with_findings()
    rows = {r["metric"]: r for r in health.health_rows(seen)}
    assert rows["health"]["note"] == said(seen) and rows["final_loss"]["value"] == 1.0
    assert set(rows) == {"health", "final_loss"}  # the numbers it has

def test_probe_mean_cosine_is_1_for_one_vector_and_0_for_orthogonal_ones():
    assert health.probe_mean_cosine(lambda texts: torch.ones(len(texts), 4), ["a", "b", "c"]) == pytest.approx(1.0)
    assert health.probe_mean_cosine(lambda texts: torch.eye(3), ["a", "b", "c"]) == pytest.approx(0.0)


def one_step(max_grad_norm):
    """A step of a linear layer under SGD(lr=1): the weights move by minus the (clipped) gradient."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    norm = MixedPrecision("fp32", torch.device("cpu")).backward_and_step(
        (layer(torch.ones(2, 4)) ** 2).sum(), optimizer, max_grad_norm)
    moved = torch.cat([(before - layer.weight.detach()).flatten(), layer.bias.grad.flatten()])
    return norm, layer.weight.detach(), moved


def test_clipping_leaves_a_step_under_the_threshold_bit_identical_and_scales_one_above():
    norm, unclipped, _ = one_step(None)
    assert torch.equal(one_step(norm * 1.01)[1], unclipped)
    clipped_norm, clipped, moved = one_step(norm / 4)
    assert clipped_norm == norm  # the norm before clipping is what is logged
    assert not torch.equal(clipped, unclipped)
    assert float(moved.norm()) == pytest.approx(norm / 4, rel=1e-4)  # the whole gradient scaled to the threshold
