"""Training health: a run that collapsed, diverged or learns from a view too easy, told while it trains.

Judged from the per-step log alone (loss, gradient norm, and every PROBE_EVERY steps the mean cosine
of a fixed probe batch's embeddings), so a resumed run judges exactly as an uninterrupted one.

- collapse: every text gets one vector. For a softmax over the batch's rows (InfoNCE) the loss of
  such a model is ln(batch) exactly; the check needs that loss for PATIENCE steps after warm-up AND
  the probe's mean cosine ≥ PROBE_COLLAPSED. Either alone misleads: healthy TSDAE and SimCSE runs end
  at a mean cosine of 0.90 and 0.58, and a loss can sit near chance while a model still learns.
  For the other losses, the probe alone with a stricter bound (PROBE_DEAD), and only when the run's
  first probe (after step 1) was under it: a model that starts with one vector for every text (a
  deep random encoder's CLS vector) has not collapsed, it has yet to spread, and its loss still falls.
- divergence: a loss that is NaN or infinite, or jumps above SPIKE × the median of the PATIENCE
  steps before it (plus 1, so a loss near 0 may wobble).
- trivial task: the loss under TRIVIAL_LOSS for PATIENCE steps while the probe's spread shrinks;
  the view teaches little (dropout's views often are). Reported, never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tasks.config.base import InputError

PATIENCE = 20  # steps a symptom must last (after warm-up) before it counts
PROBE_EVERY = 10  # steps between two measurements of the probe batch
PROBE_ROWS = 64  # texts in the probe batch
# relative distance to ln(batch) that counts as "at chance": a dead model's loss wobbles by ±1.4% (batch 8)
CHANCE_MARGIN = 0.03
PROBE_COLLAPSED = 0.99  # mean cosine of the probe: its spread is gone
PROBE_DEAD = 0.9999  # the same, for losses without a chance level: no healthy run comes near it
SPIKE = 3.0
LOOKBACK = PATIENCE + PROBE_EVERY + 1  # the most steps `check` reads back from the last
TRIVIAL_LOSS = 0.01


class TrainingUnhealthy(InputError):
    """Training collapsed or diverged: the hyper-parameters cannot train this model on this corpus."""


@dataclass(frozen=True)
class Problem:
    kind: str  # collapsed, diverged or trivial
    step: int
    why: str

    @property
    def fatal(self) -> bool:
        return self.kind != "trivial"


def probe_mean_cosine(encode: Callable[[list[str]], torch.Tensor], texts: list[str]) -> float:
    """Mean cosine similarity of every pair of different probe texts' embeddings (1.0: one vector for all)."""
    x = F.normalize(encode(texts).float(), dim=-1)  # (texts, dim)
    n = len(x)
    return float(((x @ x.T).sum() - n) / (n * (n - 1)))


def first_probe(history: Sequence) -> float | None:
    """The probe taken after step 1: how far apart the run's texts started (None: not taken)."""
    return history[0].probe_cosine if history else None


def check(history: Sequence, chance: float | None, warmup: int, start: float | None = None) -> Problem | None:
    """The problem the log shows at its last step, if any; it reads the last steps only. `history`:
    StepLog-like entries (step, loss, probe_cosine); `chance`: the loss of a model that tells no two
    texts apart, if the loss has one; `start`: the run's first probe (`first_probe` of the whole log)."""
    last = history[-1]
    if not math.isfinite(last.loss):
        return Problem("diverged", last.step, f"the loss is {last.loss}")
    if last.step <= warmup + PATIENCE or len(history) <= PATIENCE:
        return None
    median = float(np.median([h.loss for h in history[-PATIENCE - 1:-1]]))
    if last.loss > SPIKE * median + 1:
        return Problem("diverged", last.step, f"the loss jumped to {last.loss:.3f} from a median of {median:.3f} "
                                              f"over the {PATIENCE} steps before")
    recent = history[-PATIENCE:]
    # the probes of the last PATIENCE steps, and the one before them (the spread's trend)
    probes = [h.probe_cosine for h in history[-PATIENCE - PROBE_EVERY:] if h.probe_cosine is not None]
    if len(probes) < 2:
        return None
    if chance is not None:
        if probes[-1] >= PROBE_COLLAPSED and all(abs(h.loss - chance) <= CHANCE_MARGIN * chance for h in recent):
            return Problem("collapsed", last.step, f"the loss has been {last.loss:.3f}, chance level (ln of the "
                                                   f"batch = {chance:.3f}), for {PATIENCE} steps and the probe "
                                                   f"texts' mean cosine is {probes[-1]:.4f}: one vector for every text")
    elif min(probes[-2:]) >= PROBE_DEAD and (start is None or start < PROBE_DEAD):
        return Problem("collapsed", last.step, f"the probe texts' mean cosine is {probes[-1]:.5f}: one vector for "
                                               "every text")
    if probes[-1] > probes[0] and all(h.loss < TRIVIAL_LOSS for h in recent):
        return Problem("trivial", last.step, f"the loss has stayed under {TRIVIAL_LOSS} for {PATIENCE} steps while "
                                             f"the probe's mean cosine rose from {probes[0]:.3f} to {probes[-1]:.3f}: "
                                             "the view is too easy to teach much")
    return None


def advice(problem: Problem, lr: float, max_grad_norm: float | None) -> str:
    """One line for the user: what happened, where, and what to try."""
    clip = "" if max_grad_norm else ", clipping (train.max_grad_norm: 1.0)"
    return (f"training {problem.kind} at step {problem.step} (lr {lr:g}): {problem.why}. Try a lower train.lr "
            f"(e.g. 2.0e-5){clip} or a longer warm-up (train.warmup_ratio); train.on_unhealthy: warn finishes "
            "the run anyway and reports it")


def summary(history: Sequence, chance: float | None, warmup: int) -> dict:
    """The report's health of one trained model: its verdict (the first problem found, step by step,
    as during training), the last loss against chance, the last probe and the gradient-norm range."""
    found: list[Problem] = []
    start = first_probe(history)
    for end in range(1, len(history) + 1):
        problem = check(history[max(0, end - LOOKBACK):end], chance, warmup, start)  # the steps `check` reads
        if problem and not any(p.kind == problem.kind for p in found):
            found.append(problem)
    norms = [h.grad_norm for h in history if h.grad_norm is not None and math.isfinite(h.grad_norm)]
    probes = [h.probe_cosine for h in history if h.probe_cosine is not None]
    return dict(
        verdict="; ".join(f"{p.kind} at step {p.step}" for p in found) or "healthy",
        final_loss=history[-1].loss if history else None, chance_loss=chance,
        probe_mean_cosine=probes[-1] if probes else None,
        grad_norm_min=min(norms) if norms else None, grad_norm_max=max(norms) if norms else None)


# The rows the evaluate stage adds to a trained model's scores (dataset `training`): metric -> summary field.
HEALTH_METRICS = {"health": "verdict", "final_loss": "final_loss", "chance_loss": "chance_loss",
                  "probe_mean_cosine": "probe_mean_cosine", "grad_norm_min": "grad_norm_min",
                  "grad_norm_max": "grad_norm_max"}


def health_rows(health: dict) -> list[dict]:
    """Catalog rows of a `summary`: the verdict as a note, the numbers as values."""
    rows = [dict(metric="health", value=None, note=health["verdict"])]
    rows += [dict(metric=metric, value=float(health[field])) for metric, field in HEALTH_METRICS.items()
             if field != "verdict" and health.get(field) is not None]
    return [dict(row, dataset="training") for row in rows]
