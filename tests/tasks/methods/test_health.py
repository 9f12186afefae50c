"""tasks/methods/health.py: collapse and divergence stop training with one error (or a warning), a
healthy run is never flagged, and clipping changes a step only above its threshold."""

import logging
import math

import pytest
import torch

from tasks.config.training import TrainConfig
from tasks.encoders.models import sentence_model
from tasks.methods import health
from tasks.methods.batches import PairBatches
from tasks.methods.health import PATIENCE, PROBE_EVERY, Problem, TrainingUnhealthy, check, first_probe, summary
from tasks.methods.objectives import build_objective
from tasks.methods.precision import MixedPrecision
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
    return history, health_of(objective, batches, cfg, history), warmup_steps(cfg, batches)


def test_an_absurd_learning_rate_stops_with_the_collapse_error_within_patience_steps(tiny_dir, tmp_path):
    said = (r"training collapsed at step (\d+) \(lr 30\): the loss has been 2\.\d+, chance level \(ln of the batch "
            r"= 2\.079\).*mean cosine is 0\.99.*lower train\.lr")
    with pytest.raises(TrainingUnhealthy, match=said) as e:
        trained(tiny_dir, tmp_path, "crops", lr=30.0)
    step = int(e.value.args[0].split("step ")[1].split()[0])
    assert step <= 4 + PATIENCE + PROBE_EVERY  # warm-up (10% of 40 steps), then PATIENCE steps and a probe


def test_with_warn_the_collapsed_run_finishes_and_its_health_says_so(tiny_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "embforge.train"):
        history, found, _ = trained(tiny_dir, tmp_path, "crops", lr=30.0, on_unhealthy="warn")
    assert len(history) == 40
    assert found["verdict"].startswith("collapsed at step ") and found["chance_loss"] == pytest.approx(CHANCE)
    assert found["probe_mean_cosine"] > 0.99 and abs(found["final_loss"] - CHANCE) < 0.03 * CHANCE
    assert [r.message.count("collapsed") for r in caplog.records] == [1]  # warned once, not at every step


@pytest.mark.parametrize("recipe", ["crops", "tsdae", "mlm"])
def test_a_healthy_run_is_not_flagged(tiny_dir, tmp_path, recipe):
    history, found, _ = trained(tiny_dir, tmp_path, recipe)
    assert found["verdict"] == "healthy"
    assert found["grad_norm_min"] > 0 and found["grad_norm_max"] >= found["grad_norm_min"]
    assert [h.step for h in history if h.probe_cosine is not None] == [1, 10, 20, 30, 40]  # after step 1, then every 10
    assert found["probe_mean_cosine"] < health.PROBE_COLLAPSED
    if recipe == "crops":
        assert found["final_loss"] < 0.5 * CHANCE  # it learned: far under chance
    else:
        assert found["chance_loss"] is None  # reconstruction losses have no chance level


def log(losses, probes=None, start=1):
    probes = probes or {}
    return [StepLog(step, 0, loss, 1e-3, probe_cosine=probes.get(step)) for step, loss in enumerate(losses, start)]


def test_the_symptoms_and_what_is_not_one():
    warmup = 5
    dead = log([CHANCE] * 30, {10: 1.0, 20: 1.0, 30: 1.0})
    assert check(dead, CHANCE, warmup).kind == "collapsed"
    assert check(dead[:warmup + PATIENCE], CHANCE, warmup) is None  # not before PATIENCE steps after warm-up
    alive = log([CHANCE] * 30, {10: 0.6, 20: 0.7, 30: 0.8})  # at chance, but the texts still differ
    assert check(alive, CHANCE, warmup) is None
    assert check(log([1.0] * 29 + [float("nan")]), CHANCE, warmup).kind == "diverged"
    assert check(log([float("inf")]), CHANCE, warmup).kind == "diverged"  # at once, even in warm-up
    assert check(log([1.0] * 29 + [4.5]), CHANCE, warmup).kind == "diverged"  # 3 x median + 1 = 4
    assert check(log([1.0] * 29 + [3.9]), CHANCE, warmup) is None
    easy = log([0.001] * 40, {20: 0.3, 30: 0.5, 40: 0.6})
    assert check(easy, CHANCE, warmup) == Problem("trivial", 40, check(easy, CHANCE, warmup).why)
    assert not check(easy, CHANCE, warmup).fatal
    reconstruction_dead = log([5.0] * 40, {1: 0.6, 30: 0.99999, 40: 0.99999})
    assert check(reconstruction_dead, None, warmup, first_probe(reconstruction_dead)).kind == "collapsed"
    assert check(log([5.0] * 40, {30: 0.95, 40: 0.95}), None, warmup) is None  # TSDAE ends near 0.90
    # A deep random encoder starts with one vector for every text: it has yet to spread, not collapsed.
    spreading = log([10.0 - 0.01 * i for i in range(40)], {1: 0.99999, 30: 0.99999, 40: 0.99999})
    assert check(spreading, None, warmup, first_probe(spreading)) is None


def test_the_summary_names_the_first_step_of_each_problem_and_becomes_catalog_rows():
    steps = log([CHANCE] * 40, {10: 1.0, 20: 1.0, 30: 1.0, 40: 1.0})
    for s, norm in zip(steps, range(1, 41)):
        s.grad_norm = float(norm)
    found = summary(steps, CHANCE, warmup=5)
    assert found == dict(verdict="collapsed at step 26", final_loss=CHANCE, chance_loss=CHANCE,
                         probe_mean_cosine=1.0, grad_norm_min=1.0, grad_norm_max=40.0)
    rows = {r["metric"]: r for r in health.health_rows(found)}
    assert rows["health"]["note"] == "collapsed at step 26" and rows["health"]["value"] is None
    assert rows["grad_norm_max"]["value"] == 40.0 and {r["dataset"] for r in rows.values()} == {"training"}


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
