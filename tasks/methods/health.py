"""Training health: a run that collapsed, diverged or learns from a view too easy, told while it trains.

Judged from the per-step log alone (loss, gradient norm, and every PROBE_EVERY steps the mean cosine
of a fixed probe batch's embeddings), so a resumed run judges exactly as an uninterrupted one.

- collapse: every text gets one vector. For a softmax over the batch's rows (InfoNCE) the loss of
  such a model is ln(rows) exactly, judged for each step's own rows (an epoch's last batch is
  smaller); the check needs that loss for PATIENCE steps after warm-up AND the probe's mean cosine ≥
  PROBE_COLLAPSED. Either alone misleads: healthy TSDAE and SimCSE runs end at a mean cosine of 0.90
  and 0.58, and a loss can sit near chance while a model still learns. For the other losses, the
  probe alone with a stricter bound (PROBE_DEAD), and only when the run's first probe (after step 1)
  was under it: a model that starts with one vector for every text (a deep random encoder's CLS
  vector) has not collapsed, it has yet to spread, and its loss still falls. A run too short for
  PATIENCE steps after warm-up is judged at its last step on the steps it has.
- divergence: a loss that is NaN or infinite, or jumps above SPIKE × the median of the PATIENCE
  steps before it (plus 1, so a loss near 0 may wobble); or gradients that are not finite for PATIENCE
  steps in a row, or at every step of a shorter run: such a step changes nothing (clipping zeroes it,
  fp16's scaler skips it), so the model stays where it was whatever the loss says.
- trivial task: the loss under TRIVIAL_LOSS for PATIENCE steps while the probe's spread shrinks;
  the view teaches little (dropout's views often are). Reported, never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tasks.config.base import InputError
from tasks.config.training import TrainConfig

PATIENCE = 20  # steps a symptom must last (after warm-up) before it counts
PROBE_EVERY = 10  # steps between two measurements of the probe batch
PROBE_ROWS = 64  # texts in the probe batch
# relative distance to ln(batch) that counts as "at chance": a dead model's loss wobbles by ±1.4% (batch 8)
CHANCE_MARGIN = 0.03
PROBE_COLLAPSED = 0.99  # mean cosine of the probe: its spread is gone
PROBE_DEAD = 0.9999  # the same, for losses without a chance level: no healthy run comes near it
# The evaluation's mean cosine of the corpus's documents above which a trained model gives them one vector:
# untrained random BERTs measure 0.98-0.99 (the tiny test encoder, the demo's), a collapsed one 0.9998.
DOCUMENTS_AT_ONE_VECTOR = 0.999
SPIKE = 3.0
LOOKBACK = PATIENCE + PROBE_EVERY + 1  # the most steps `check` reads back from the last
TRIVIAL_LOSS = 0.01
TEMPERATURE_FLOOR = 0.01  # an InfoNCE temperature under this, not the lr, is the first suspect of a blow-up


class TrainingUnhealthy(InputError):
    """Training collapsed or diverged: the hyper-parameters cannot train this model on this corpus."""


@dataclass(frozen=True)
class Problem:
    kind: str  # collapsed, diverged or trivial
    step: int | None  # the first step it showed; None: the evaluation saw it, after training (`evaluated`)
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


def at_chance(steps: Sequence) -> bool:
    """Every step's loss within CHANCE_MARGIN of the chance level of its own rows (False without one)."""
    return bool(steps) and all(h.chance is not None and abs(h.loss - h.chance) <= CHANCE_MARGIN * h.chance
                               for h in steps)


def not_finite(norm: float | None) -> bool:
    return norm is not None and not math.isfinite(norm)


def check(history: Sequence, warmup: int, start: float | None = None, final: bool = False) -> Problem | None:
    """The problem the log shows at its last step, if any; it reads the last steps only. `history`:
    StepLog-like entries (step, loss, chance, grad_norm, probe_cosine), `chance` being the loss of a model
    that tells no two texts apart for that step's rows (None: the loss has no such level); `start`: the
    run's first probe (`first_probe` of the whole log); `final`: the last step of training, where a run
    too short for the PATIENCE-step rules is judged on what it has."""
    last = history[-1]
    if not math.isfinite(last.loss):
        return Problem("diverged", last.step, f"the loss is {last.loss}")
    streak = history[-PATIENCE:]  # a shorter log is a whole run (the windows `summary` passes are longer)
    if (len(streak) == PATIENCE or final) and all(not_finite(h.grad_norm) for h in streak):
        return Problem("diverged", last.step, f"the gradient norm has been {last.grad_norm} at each of the last "
                                              f"{len(streak)} steps: none of them changed the model")
    if final and (problem := collapsed_at_the_end(history, warmup, start)):
        return problem
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
    if last.chance is not None:
        if probes[-1] >= PROBE_COLLAPSED and at_chance(recent):
            return Problem("collapsed", last.step, chance_why(recent, probes[-1]))
    elif min(probes[-2:]) >= PROBE_DEAD and (start is None or start < PROBE_DEAD):
        return Problem("collapsed", last.step, f"the probe texts' mean cosine is {probes[-1]:.5f}: one vector for "
                                               "every text")
    if probes[-1] > probes[0] and all(h.loss < TRIVIAL_LOSS for h in recent):
        return Problem("trivial", last.step, f"the loss has stayed under {TRIVIAL_LOSS} for {PATIENCE} steps while "
                                             f"the probe's mean cosine rose from {probes[0]:.3f} to {probes[-1]:.3f}: "
                                             "the view is too easy to teach much")
    return None


def chance_why(steps: Sequence, probe: float) -> str:
    full = max(h.chance for h in steps)
    smaller = ", less for an epoch's smaller last batch" if min(h.chance for h in steps) < full else ""
    return (f"the loss has been {steps[-1].loss:.3f}, chance level (ln of the batch = {full:.3f}{smaller}), for "
            f"{len(steps)} steps and the probe texts' mean cosine is {probe:.4f}: one vector for every text")


def collapsed_at_the_end(history: Sequence, warmup: int, start: float | None) -> Problem | None:
    """The verdict of a finished run, whatever its length: texts that started apart (the first probe) and
    end at one vector. For InfoNCE the last probe ≥ PROBE_COLLAPSED with the loss at chance since the probe
    before it (after warm-up); for any loss the last probe ≥ PROBE_DEAD."""
    last, probe = history[-1], history[-1].probe_cosine
    if probe is None or start is None:
        return None
    recent = [h for h in history[-PROBE_EVERY:] if h.step > warmup] or history[-1:]
    if last.chance is not None and start < PROBE_COLLAPSED <= probe and at_chance(recent):
        return Problem("collapsed", last.step, chance_why(recent, probe))
    if start < PROBE_DEAD <= probe:
        return Problem("collapsed", last.step, f"the probe texts' mean cosine went from {start:.4f} after step 1 "
                                               f"to {probe:.5f} at the end: one vector for every text")
    return None


def advice(problem: Problem, cfg: TrainConfig) -> str:
    """One line for the user: what happened, where, with which settings, and what to try: a temperature far under
    the usual first (it scales every logit: 1e-30 overflows whatever the lr), else the lr, clipping and warm-up."""
    tiny = cfg.temperature < TEMPERATURE_FLOOR
    settings = f"train.temperature {cfg.temperature:g}, lr {cfg.lr:g}" if tiny else f"lr {cfg.lr:g}"
    if tiny:
        fix = (f"train.temperature {cfg.temperature:g} multiplies every similarity by {1 / cfg.temperature:.3g}: "
               f"raise it (the usual is {TrainConfig.model_fields['temperature'].default:g})")
    else:
        clip = "" if cfg.max_grad_norm else ", clipping (train.max_grad_norm: 1.0)"
        fix = f"Try a lower train.lr (e.g. 2.0e-5){clip} or a longer warm-up (train.warmup_ratio)"
    return (f"training {problem.kind} at step {problem.step} ({settings}): {problem.why}. {fix}; "
            "train.on_unhealthy: warn finishes the run anyway and reports it")


def summary(history: Sequence, warmup: int) -> dict:
    """The report's health of one trained model, as JSON for the manifest: its findings (each kind of problem
    at the first step it showed, found step by step as during training, the last step judged as the end of
    training; `findings` reads them back), the last loss against chance (that of a full batch), the last probe
    and the gradient-norm range."""
    found: list[Problem] = []
    start = first_probe(history)
    for end in range(1, len(history) + 1):
        problem = check(history[max(0, end - LOOKBACK):end], warmup, start, final=end == len(history))
        if problem and not any(p.kind == problem.kind for p in found):
            found.append(problem)
    norms = [h.grad_norm for h in history if h.grad_norm is not None and math.isfinite(h.grad_norm)]
    probes = [h.probe_cosine for h in history if h.probe_cosine is not None]
    chances = [h.chance for h in history if h.chance is not None]
    return dict(
        findings=[asdict(p) for p in found],
        final_loss=history[-1].loss if history else None, chance_loss=max(chances) if chances else None,
        probe_mean_cosine=probes[-1] if probes else None,
        grad_norm_min=min(norms) if norms else None, grad_norm_max=max(norms) if norms else None)


def findings(found: dict) -> list[Problem]:
    """The problems of a health summary (`summary`, `evaluated`)."""
    return [Problem(**p) for p in found["findings"]]


def verdict(problems: Sequence[Problem]) -> str:
    """What the log, the catalog's `health` note and the report say: `healthy`, or each problem where it
    showed (`collapsed at step 40; trivial at step 12`, `collapsed at evaluation (<why>)`)."""
    return "; ".join(f"{p.kind} at step {p.step}" if p.step is not None else f"{p.kind} at evaluation ({p.why})"
                     for p in problems) or "healthy"


def fatal_verdict(found: dict) -> str | None:
    """The verdict of a health summary's problems that stop training by default (`train.on_unhealthy: stop`),
    or None."""
    fatal = [p for p in findings(found) if p.fatal]
    return verdict(fatal) if fatal else None


def evaluated(found: dict, mean_cosine: float | None) -> dict:
    """A trained model's health with what the evaluation saw: its documents at one vector is a collapse,
    whatever training said (a run stopped short of the probe's rules, a view the probe texts do not show)."""
    if (mean_cosine is None or mean_cosine < DOCUMENTS_AT_ONE_VECTOR
            or any(p.kind == "collapsed" for p in findings(found))):
        return found
    seen = Problem("collapsed", None, f"the documents' mean cosine is {mean_cosine:.4f}")
    return {**found, "findings": [*found["findings"], asdict(seen)]}


# The rows the evaluate stage adds to a trained model's scores (dataset `training`): the verdict, then the
# summary's numbers, each under its own name.
HEALTH_NUMBERS = ("final_loss", "chance_loss", "probe_mean_cosine", "grad_norm_min", "grad_norm_max")
HEALTH_METRICS = ("health", *HEALTH_NUMBERS)


def health_rows(health: dict) -> list[dict]:
    """Catalog rows of a health summary: the verdict as a note, the numbers as values."""
    rows = [dict(metric="health", value=None, note=verdict(findings(health)))]
    rows += [dict(metric=metric, value=float(health[metric])) for metric in HEALTH_NUMBERS
             if health.get(metric) is not None]
    return [dict(row, dataset="training") for row in rows]
